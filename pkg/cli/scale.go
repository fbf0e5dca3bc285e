package cli

import (
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// ScaleOptions resizes a control plane one machine at a time.
type ScaleOptions struct {
	rolloutOptions
	Replicas int32
	Streams  genericiooptions.IOStreams
}

// NewCmdScale returns the scale verb.
func NewCmdScale(root *RootOptions) *cobra.Command {
	o := &ScaleOptions{Streams: root.Streams}
	o.Root = root
	cmd := &cobra.Command{
		Use:   "scale CLUSTER --replicas N",
		Short: "Resize a control plane, one machine at a time",
		Long: `Scale the control plane of CLUSTER to N machines, one at a time. Scaling up
waits for each new etcd member to be named, promoted and healthy before the
next; scaling down picks machines in KCP's order, moves etcd leadership away,
removes each member before its machine goes, and never deletes the last
machine or a member whose removal would cost quorum. With stacked etcd, N must
be odd.`,
		Example: `  kubectl cp-rollout scale prod-eu1 --replicas 5`,
		Args:    clusterArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Cluster = args[0]
			if !cmd.Flags().Changed("replicas") {
				return exitcode.Usagef("--replicas is required, e.g. --replicas 3")
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.run(cmd.Context(), o.Streams, rollout.Request{Operation: "scale", Replicas: &o.Replicas})
		},
	}
	o.addFlags(cmd)
	cmd.Flags().Int32Var(&o.Replicas, "replicas", o.Replicas, "The number of control-plane machines wanted (required; odd with stacked etcd)")
	return cmd
}

// Validate checks the flags; it reads nothing but the options. Whether N must
// be odd depends on the cluster (stacked or external etcd) and is checked
// against it, before anything changes.
func (o *ScaleOptions) Validate() error {
	if o.Replicas < 1 {
		return exitcode.Usagef("--replicas must be at least 1, not %d", o.Replicas)
	}
	return o.validate()
}
