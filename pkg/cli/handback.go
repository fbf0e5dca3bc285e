package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// HandbackOptions gives a control plane back to KCP.
type HandbackOptions struct {
	connection
	// Force releases a lock that its holder still renews.
	Force   bool
	Streams genericiooptions.IOStreams
}

// NewHandbackOptions returns the handback verb's defaults.
func NewHandbackOptions(streams genericiooptions.IOStreams) *HandbackOptions {
	return &HandbackOptions{Streams: streams}
}

// NewCmdHandback returns the handback verb. runF, when set, replaces Run, so
// tests can see what the flags resolve to.
func NewCmdHandback(root *RootOptions, runF func(*HandbackOptions) error) *cobra.Command {
	o := NewHandbackOptions(root.Streams)
	o.Management = root.ConfigFlags
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
			return runVerb(cmd, args, o, runF)
		},
	}
	cmd.Flags().BoolVar(&o.Force, "force", false, "Release the lock even while its holder renews it (only when you know that run is gone)")
	return cmd
}

// Complete takes the cluster's name.
func (o *HandbackOptions) Complete(_ *cobra.Command, args []string) error {
	o.Cluster = args[0]
	return nil
}

// Validate has nothing to check: the cluster's name is the only input.
func (o *HandbackOptions) Validate() error { return nil }

// Run hands the control plane back and prints what it did to stdout.
func (o *HandbackOptions) Run(ctx context.Context) error {
	engine, closeEngine, err := o.connect(ctx, noLoop)
	if err != nil {
		return err
	}
	defer closeEngine()
	done, err := engine.Handback(ctx, o.Force)
	if err != nil {
		return err
	}
	for _, line := range done {
		fmt.Fprintln(o.Streams.Out, line)
	}
	return nil
}
