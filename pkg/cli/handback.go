package cli

import (
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// HandbackOptions gives a control plane back to KCP.
type HandbackOptions struct {
	connection
	Root    *RootOptions
	Force   bool
	Streams genericiooptions.IOStreams
}

// NewCmdHandback returns the handback verb.
func NewCmdHandback(root *RootOptions) *cobra.Command {
	o := &HandbackOptions{Root: root, Streams: root.Streams}
	cmd := &cobra.Command{
		Use:   "handback CLUSTER",
		Short: "Give a control plane back to KCP after an interrupted run",
		Long: `End this tool's ownership of CLUSTER's control plane: release a lock whose
run is gone, remove the pause and the operation record this tool set on the
KubeadmControlPlane, and say what KCP will now do by itself. A pause that
carries no record of this tool is someone else's and is never removed. A lock
that a live run still renews is only released with --force.`,
		Example: `  kubectl cp-rollout handback prod-eu1`,
		Args:    clusterArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Cluster = args[0]
			engine, closeEngine, err := o.connect(cmd.Context(), o.Root.ConfigFlags, nil, false)
			if err != nil {
				return err
			}
			defer closeEngine()
			done, err := engine.Handback(cmd.Context(), o.Force)
			if err != nil {
				return err
			}
			for _, line := range done {
				fmt.Fprintln(o.Streams.Out, line)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&o.Force, "force", false, "Release the lock even while its holder renews it (only when you know that run is gone)")
	return cmd
}
