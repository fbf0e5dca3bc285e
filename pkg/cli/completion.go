package cli

import (
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// NewCmdCompletion returns the completion verb. Completion of
// `kubectl cp-rollout <TAB>` itself goes through the kubectl_complete-cp_rollout
// helper shipped beside the binary, which kubectl 1.26+ looks for on PATH.
func NewCmdCompletion(streams genericiooptions.IOStreams) *cobra.Command {
	shells := []string{"bash", "zsh", "fish"}
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "Print a shell completion script for kubectl-cp_rollout",
		Long: `Print a shell completion script for the kubectl-cp_rollout binary.

For "kubectl cp-rollout <TAB>", put kubectl_complete-cp_rollout (shipped beside
the binary) on PATH instead; kubectl 1.26 and newer call it.

  source <(kubectl-cp_rollout completion bash)`,
		ValidArgs: shells,
		Args:      usageArgs(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			root, out := cmd.Root(), streams.Out
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			}
			return exitcode.Usagef("unsupported shell %q", args[0])
		},
	}
}
