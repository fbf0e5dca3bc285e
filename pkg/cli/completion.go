package cli

import (
	"context"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// CompletionOptions prints a shell completion script for the command tree.
type CompletionOptions struct {
	Shell string
	// Tree is the command tree the script completes.
	Tree    *cobra.Command
	Streams genericiooptions.IOStreams
}

// completionShells are the shells cobra writes scripts for.
var completionShells = []string{"bash", "zsh", "fish"}

// NewCompletionOptions returns the completion verb's defaults.
func NewCompletionOptions(streams genericiooptions.IOStreams) *CompletionOptions {
	return &CompletionOptions{Streams: streams}
}

// NewCmdCompletion returns the completion verb. Completion of
// `kubectl cp-rollout <TAB>` itself goes through the kubectl_complete-cp_rollout
// helper shipped beside the binary, which kubectl 1.26+ looks for on PATH.
// runF, when set, replaces Run, so tests can see what the arguments resolve to.
func NewCmdCompletion(streams genericiooptions.IOStreams, runF func(*CompletionOptions) error) *cobra.Command {
	o := NewCompletionOptions(streams)
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script for kubectl-cp_rollout",
		Long: `Print a shell completion script for the kubectl-cp_rollout binary.

For "kubectl cp-rollout <TAB>", put kubectl_complete-cp_rollout (shipped beside
the binary) on PATH instead; kubectl 1.26 and newer call it.

  source <(kubectl-cp_rollout completion bash)`,
		ValidArgs: completionShells,
		Args:      usageArgs(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
}

// Complete takes the shell and the tree the command belongs to.
func (o *CompletionOptions) Complete(cmd *cobra.Command, args []string) error {
	o.Shell, o.Tree = args[0], cmd.Root()
	return nil
}

// Validate has nothing left to check: cobra's argument check (OnlyValidArgs)
// has refused any other shell.
func (o *CompletionOptions) Validate() error { return nil }

// Run prints the script to stdout.
func (o *CompletionOptions) Run(context.Context) error {
	out := o.Streams.Out
	switch o.Shell {
	case "bash":
		return o.Tree.GenBashCompletionV2(out, true)
	case "zsh":
		return o.Tree.GenZshCompletion(out)
	case "fish":
		return o.Tree.GenFishCompletion(out, true)
	}
	return exitcode.Usagef("unsupported shell %q", o.Shell)
}
