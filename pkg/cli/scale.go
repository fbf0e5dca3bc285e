package cli

import (
	"context"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// ScaleOptions resizes a control plane one machine at a time.
type ScaleOptions struct {
	change   changeOptions
	replicas int32 // what --replicas holds; Complete puts it in the request
}

// NewScaleOptions returns the scale verb's defaults.
func NewScaleOptions(streams genericiooptions.IOStreams) *ScaleOptions {
	return &ScaleOptions{change: newChangeOptions(streams, rollout.ScaleOperation)}
}

// NewCmdScale returns the scale verb. runF, when set, replaces Run, so tests
// can see what the flags resolve to.
func NewCmdScale(root *RootOptions, runF func(*ScaleOptions) error) *cobra.Command {
	o := NewScaleOptions(root.Streams)
	o.change.req.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "scale (CLUSTER | -l SELECTOR | -A) --replicas N",
		Short: "Resize a control plane, one machine at a time",
		Long: `Scale the control plane of CLUSTER to N machines, one at a time. Scaling up
waits for each new etcd member to be named, promoted and healthy before the
next; scaling down picks machines in KCP's order, moves etcd leadership away,
removes each member before its machine goes, and never deletes the last
machine or a member whose removal would cost quorum. With stacked etcd, N must
be odd. With -l/-A, every matching cluster is scaled, as upgrade does.`,
		Example:           `  kubectl cp-rollout scale prod-eu1 --replicas 5`,
		Args:              clusterOrSelection,
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	o.change.addFlags(cmd)
	o.change.addFleetFlags(cmd.Flags())
	cmd.Flags().BoolVar(&o.change.req.request.ReplaceUnhealthy, "replace-unhealthy", false, "Replace first, as this run's first steps, the control-plane machines found broken before it starts (without it, the run refuses them and names the replace command)")
	cmd.Flags().Int32Var(&o.replicas, "replicas", o.replicas, "The number of control-plane machines wanted (required; odd with stacked etcd)")
	return cmd
}

// Complete puts --replicas in the request only when it was given: its zero
// value is a count, not "unset".
func (o *ScaleOptions) Complete(cmd *cobra.Command, args []string) error {
	o.change.complete(cmd, args)
	if cmd.Flags().Changed("replicas") {
		o.change.req.request.Replicas = &o.replicas
	}
	return nil
}

// Validate checks the flags; it changes nothing.
func (o *ScaleOptions) Validate() error {
	if o.change.req.request.Replicas == nil {
		return exitcode.Usagef("--replicas is required, e.g. --replicas 3")
	}
	return o.change.validate()
}

// Run performs the scale, or with --dry-run prints its plan.
func (o *ScaleOptions) Run(ctx context.Context) error { return o.change.run(ctx) }

func (o *ScaleOptions) where() (cluster, namespace string) { return o.change.req.where() }
