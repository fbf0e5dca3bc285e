package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The connection flags (--kubeconfig, --context, -n, --as, … from
// kubeconfigFlags), --config and -v are the root's persistent flags: every
// verb takes them. Listed in each verb's help they were twenty lines of the
// same text around the few flags that verb has, so, as kubectl does, they are
// listed once, by `kubectl cp-rollout options`, and each help ends with a
// line that says so. They stay real flags of every verb, never hidden: only
// the help text changes.

// NewCmdOptions returns the options verb: the flags every verb takes, as
// `kubectl options` lists kubectl's.
func NewCmdOptions(root *RootOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "options",
		Short: "Print the list of flags inherited by all commands",
		Long:  "Print the list of flags inherited by all commands: how to reach the management cluster (as kubectl's), the configuration file and the log level.",
		Example: `  # Print flags inherited by all commands
  kubectl cp-rollout options`,
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		// It lists the flags, and needs none of their values: a config file
		// or an environment variable that every other verb refuses still
		// lets it say what the flags are.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := root.Streams.Out
			fmt.Fprintln(out, "The following options can be passed to any command:")
			fmt.Fprintln(out)
			fmt.Fprintln(out, strings.TrimRight(globalFlags(cmd).FlagUsages(), " \n"))
			return nil
		},
	}
}

// globalFlags are the flags every verb inherits from the root.
func globalFlags(cmd *cobra.Command) *pflag.FlagSet {
	return cmd.Root().PersistentFlags()
}

// optionsHint ends every command's help, as kubectl's ends with its own.
func optionsHint(cmd *cobra.Command) string {
	return fmt.Sprintf(`Use "%s options" for a list of global command-line options (applies to all commands).`, cmd.Root().CommandPath())
}

// usage is the usage part of every command's help: cobra's default, but for
// the flags. A command lists only its own flags, the required ones first in
// a section of their own, and ends by pointing at the options verb for the
// flags every verb inherits. It is a function rather than a template
// (SetUsageTemplate) because splitting the flags needs functions of ours in
// the template, and cobra's template functions are global to the process.
func usage(cmd *cobra.Command) error {
	w := cmd.OutOrStderr()
	fmt.Fprint(w, "Usage:")
	if cmd.Runnable() {
		fmt.Fprintf(w, "\n  %s", cmd.UseLine())
	}
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\n  %s [command]", cmd.CommandPath())
	}
	if len(cmd.Aliases) > 0 {
		fmt.Fprintf(w, "\n\nAliases:\n  %s", cmd.NameAndAliases())
	}
	if cmd.HasExample() {
		fmt.Fprintf(w, "\n\nExamples:\n%s", cmd.Example)
	}
	if cmd.HasAvailableSubCommands() {
		fmt.Fprint(w, "\n\nAvailable Commands:")
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() || sub.Name() == "help" {
				fmt.Fprintf(w, "\n  %-*s %s", sub.NamePadding(), sub.Name(), sub.Short)
			}
		}
	}
	required, others := ownFlags(cmd)
	printFlagSection(w, "Required flags", required)
	printFlagSection(w, "Flags", others)
	fmt.Fprint(w, "\n")
	if cmd.HasAvailableSubCommands() {
		fmt.Fprintf(w, "\nUse \"%s [command] --help\" for more information about a command.", cmd.CommandPath())
	}
	fmt.Fprintf(w, "\n%s\n", optionsHint(cmd))
	return nil
}

// ownFlags splits the flags cmd itself declares, less the ones every verb
// inherits (the root declares those too), into the required ones and the
// others.
func ownFlags(cmd *cobra.Command) (required, others *pflag.FlagSet) {
	required = pflag.NewFlagSet("required", pflag.ContinueOnError)
	others = pflag.NewFlagSet("flags", pflag.ContinueOnError)
	global := globalFlags(cmd)
	cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
		switch {
		case global.Lookup(f.Name) != nil:
		case isRequired(f):
			required.AddFlag(f)
		default:
			others.AddFlag(f)
		}
	})
	return required, others
}

// isRequired says whether a verb refuses to run without f. The verbs check
// their required flags themselves, with a message that says what to give
// (`--version is required, e.g. --version v1.36.3`), so none is marked with
// cobra's MarkFlagRequired, which would refuse first in cobra's words: the
// flag's own help, which says "(required", is the mark. cobra's annotation
// counts too, should a verb use it.
func isRequired(f *pflag.Flag) bool {
	if _, ok := f.Annotations[cobra.BashCompOneRequiredFlag]; ok {
		return true
	}
	return strings.Contains(f.Usage, "(required")
}

func printFlagSection(w io.Writer, title string, fs *pflag.FlagSet) {
	if !fs.HasAvailableFlags() {
		return
	}
	fmt.Fprintf(w, "\n\n%s:\n%s", title, strings.TrimRight(fs.FlagUsages(), " \n"))
}
