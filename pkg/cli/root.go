// Package cli builds the command tree of kubectl cp-rollout: one file per verb,
// each an Options struct with Complete, Validate and Run. Commands never exit the
// process; they return errors marked by package exitcode and main decides.
package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// displayName is how users invoke the tool; kubectl finds the binary
// kubectl-cp_rollout on PATH and maps "cp-rollout" to it.
const displayName = "kubectl cp-rollout"

// Run builds the command tree, runs the command that args select and returns its
// error, and how the command showed its output. It is what main calls; tests
// call it too.
func Run(ctx context.Context, streams genericiooptions.IOStreams, args []string) (Result, error) {
	root := NewRootCmd(streams)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	var res Result
	if cmd != nil {
		res.Command = cmd.CommandPath()
		// The command has parsed -o (from the flag, the environment or the
		// config file) and refused a value it does not know.
		if f := cmd.Flags().Lookup("output"); f != nil {
			res.JSON = f.Value.String() == "json"
		}
	}
	var at *atCluster
	if errors.As(err, &at) {
		res.Cluster, res.Namespace = at.cluster, at.namespace
	}
	return res, err
}

// Result is what main needs, besides the error, to end a failed command's
// output in the form the command chose: main alone knows the exit code (a
// signal may decide it), the command alone its output format.
type Result struct {
	// JSON is set when the command printed JSON (-o json): a script reads
	// its stdout, and a failure ends it with one JSON object.
	JSON bool
	// Cluster and Namespace name the one cluster the command acted on, as
	// far as it had resolved them; empty over a fleet.
	Cluster, Namespace string
	// Command is the command that failed, as a person types it
	// ("kubectl cp-rollout upgrade"): a usage error's hint names its --help,
	// which lists the flags that verb takes, rather than the root's.
	Command string
}

// atCluster marks a verb's error with the cluster it acted on, for Result.
// Its message is the error's own.
type atCluster struct {
	cluster, namespace string
	err                error
}

func (e *atCluster) Error() string { return e.err.Error() }
func (e *atCluster) Unwrap() error { return e.err }

// oneCluster is a verb's options that may name the one cluster it acts on.
type oneCluster interface {
	where() (cluster, namespace string)
}

// RootOptions holds what every verb shares: how to reach the management cluster
// and where the configuration file is. Verbs copy from it only what they use.
type RootOptions struct {
	ConfigFlags *kubeconfigFlags
	ConfigFile  string
	Streams     genericiooptions.IOStreams
	// Verbosity is -v: klog's level, for client-go's request logging.
	Verbosity int
}

// NewRootCmd returns the root of the command tree.
func NewRootCmd(streams genericiooptions.IOStreams) *cobra.Command {
	cmd, _ := newRootCmd(streams)
	return cmd
}

// newRootCmd also returns the shared options, so tests can see what the flags,
// environment and config file resolved to.
func newRootCmd(streams genericiooptions.IOStreams) (*cobra.Command, *RootOptions) {
	o := &RootOptions{
		ConfigFlags: newKubeconfigFlags(),
		ConfigFile:  defaultConfigFile(),
		Streams:     streams,
	}
	cmd := &cobra.Command{
		Use:   "kubectl-cp_rollout",
		Short: "Roll Cluster API control planes one machine at a time, safely",
		Long: `kubectl cp-rollout performs Cluster API control-plane rollouts imperatively:
one machine at a time, in a blocking loop, every step gated by the same safety
checks (no step while a control-plane machine is deleting, never delete the last
control-plane machine, never lose etcd quorum).`,
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: displayName},
		// Errors are printed once, by main, as one line; usage is only hinted at.
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          noVerb,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cmd.Help()
		},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyConfig(cmd, o.ConfigFile); err != nil {
				return err
			}
			return setLogging(o.Verbosity, cmd.ErrOrStderr())
		},
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
		SuggestionsMinimumDistance: 2,
	}
	cmd.SetIn(streams.In)
	cmd.SetOut(streams.Out)
	cmd.SetErr(streams.ErrOut)
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return flagError(err)
	})

	o.ConfigFlags.AddFlags(cmd.PersistentFlags())
	o.addNameCompletions(cmd)
	cmd.PersistentFlags().StringVar(&o.ConfigFile, configFlag, o.ConfigFile,
		"Path to the configuration file (environment: "+envPrefix+"_CONFIG)")
	addVerbosityFlag(cmd.PersistentFlags(), &o.Verbosity)
	// Each verb's help lists its own flags; the ones above, which every verb
	// takes, are listed once, by the options verb, as kubectl does.
	cmd.SetUsageFunc(usage)

	cmd.AddCommand(
		NewCmdUpgrade(o, nil),
		NewCmdScale(o, nil),
		NewCmdReplace(o, nil),
		NewCmdRollout(o, nil),
		NewCmdRestart(o, nil),
		NewCmdPause(o, nil),
		NewCmdPlan(o, nil),
		NewCmdStatus(o, nil),
		NewCmdWait(o, nil),
		NewCmdCheck(o, nil),
		NewCmdFleet(o),
		NewCmdHandback(o, nil),
		NewCmdRBAC(o, nil),
		NewCmdVersion(streams, nil),
		NewCmdCompletion(streams, nil),
		NewCmdOptions(o),
	)
	o.completeFlagValues(cmd)
	return cmd, o
}

// verbOptions is what each verb's options do once cobra has parsed the
// command line: Complete takes in the arguments and what the flags imply,
// reading nothing else; Validate checks the options and changes nothing, so
// that what a test sees after it is what Run gets; Run works.
type verbOptions interface {
	Complete(cmd *cobra.Command, args []string) error
	Validate() error
	Run(context.Context) error
}

// runVerb is every verb's RunE. It hands the completed, valid options to
// runF, the test seam, when one is given, or else runs them.
func runVerb[O verbOptions](cmd *cobra.Command, args []string, o O, runF func(O) error) error {
	err := o.Complete(cmd, args)
	if err == nil {
		err = o.Validate()
	}
	switch {
	case err == nil && runF != nil:
		return runF(o)
	case err == nil:
		err = o.Run(cmd.Context())
	}
	return markCluster(o, err)
}

// markCluster marks err with the one cluster that o acted on, if any.
func markCluster(o any, err error) error {
	one, ok := o.(oneCluster)
	if !ok || err == nil {
		return err
	}
	if cluster, namespace := one.where(); cluster != "" {
		return &atCluster{cluster: cluster, namespace: namespace, err: err}
	}
	return err
}

// noVerb rejects anything the root is given that cobra did not resolve to a verb,
// suggesting the nearest verb when one is close.
func noVerb(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], displayName)
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return exitcode.Usagef("%s", msg)
}

// wrongArgs is every verb's refusal of its positional arguments, in one
// wording — what the verb takes, then how many it got — as pause, replace
// and wait phrase theirs ("pause needs one argument, the Cluster's name; got
// 0"): cobra's own ("accepts 1 arg(s), received 0") names neither the verb
// nor what the argument is.
func wrongArgs(cmd *cobra.Command, takes string, got int) error {
	return exitcode.Usagef("%s %s; got %d", cmd.Name(), takes, got)
}

// noArgs is the Args of a verb that takes no positional argument. cobra's
// NoArgs would call a stray word an unknown command.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return wrongArgs(cmd, "takes no arguments", len(args))
	}
	return nil
}

// atMostOneCluster is the Args of a verb that may name one Cluster.
func atMostOneCluster(cmd *cobra.Command, args []string) error {
	if len(args) > 1 {
		return wrongArgs(cmd, "takes at most one argument, the Cluster's name", len(args))
	}
	return nil
}

// oneOf validates an enumerated flag value.
func oneOf(flag, value string, allowed ...string) error {
	for _, a := range allowed {
		if value == a {
			return nil
		}
	}
	return exitcode.Usagef("--%s must be one of %s, not %q", flag, strings.Join(allowed, ", "), value)
}
