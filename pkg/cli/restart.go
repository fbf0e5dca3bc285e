package cli

import (
	"context"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/rollout"
)

// RestartOptions replaces every control-plane machine, changing no spec.
type RestartOptions struct {
	change changeOptions
}

// NewRestartOptions returns the restart verb's defaults.
func NewRestartOptions(streams genericiooptions.IOStreams) *RestartOptions {
	return &RestartOptions{change: newChangeOptions(streams, rollout.RestartOperation)}
}

// NewCmdRestart returns the restart verb. runF, when set, replaces Run, so
// tests can see what the flags resolve to.
func NewCmdRestart(root *RootOptions, runF func(*RestartOptions) error) *cobra.Command {
	o := NewRestartOptions(root.Streams)
	o.change.req.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "restart (CLUSTER | -l SELECTOR | -A)",
		Short: "Replace every control-plane machine, one at a time",
		Long: `Replace, one at a time, every control-plane machine of CLUSTER created before
the restart began, as "kubectl rollout restart" does for a Deployment and
"clusterctl alpha rollout restart" for a KubeadmControlPlane — with KCP's
spec.rollout.after semantics, but without writing that field: the cut-off is
the start of this operation's record, so a restart that is interrupted and run
again keeps its cut-off and never replaces a machine it created.`,
		Example: `  kubectl cp-rollout restart prod-eu1
  kubectl cp-rollout restart prod-eu1 --max-surge 0`,
		Args:              clusterOrSelection,
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	o.change.addFlags(cmd)
	o.change.addFleetFlags(cmd.Flags())
	return cmd
}

// Complete takes the cluster's name, if given.
func (o *RestartOptions) Complete(cmd *cobra.Command, args []string) error {
	o.change.complete(cmd, args)
	return nil
}

// Validate checks the flags; it changes nothing.
func (o *RestartOptions) Validate() error {
	return o.change.validate()
}

// Run performs the restart, or with --dry-run prints its plan.
func (o *RestartOptions) Run(ctx context.Context) error { return o.change.run(ctx) }

func (o *RestartOptions) where() (cluster, namespace string) { return o.change.req.where() }
