package cli

import (
	"context"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// ReplaceOptions replaces one named control-plane machine.
type ReplaceOptions struct {
	change changeOptions
}

// NewReplaceOptions returns the replace verb's defaults.
func NewReplaceOptions(streams genericiooptions.IOStreams) *ReplaceOptions {
	return &ReplaceOptions{change: newChangeOptions(streams, rollout.ReplaceOperation)}
}

// NewCmdReplace returns the replace verb. runF, when set, replaces Run, so
// tests can see what the flags resolve to.
func NewCmdReplace(root *RootOptions, runF func(*ReplaceOptions) error) *cobra.Command {
	o := NewReplaceOptions(root.Streams)
	o.change.req.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "replace CLUSTER MACHINE",
		Short: "Replace one control-plane machine, safely",
		Long: `Replace the control-plane machine MACHINE of CLUSTER with a new one, with every
safety check of a rollout: unlike "kubectl delete machine", it never deletes the
last control-plane machine, never removes an etcd member when that would cost
quorum, and moves etcd leadership away first.`,
		Example: `  kubectl cp-rollout replace prod-eu1 prod-eu1-control-plane-x2k9
  kubectl cp-rollout replace prod-eu1 prod-eu1-control-plane-x2k9 --max-surge 0`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return exitcode.Usagef("replace needs two arguments, the Cluster's name and the Machine's; got %d", len(args))
			}
			return nil
		},
		ValidArgsFunction: root.completeReplace,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	o.change.addFlags(cmd)
	return cmd
}

// Complete takes the cluster's and the machine's names.
func (o *ReplaceOptions) Complete(cmd *cobra.Command, args []string) error {
	o.change.complete(cmd, args[:1])
	o.change.req.request.Replace = args[1]
	return nil
}

// Validate checks the flags; it changes nothing.
func (o *ReplaceOptions) Validate() error {
	return o.change.validate()
}

// Run performs the replacement, or with --dry-run prints its plan.
func (o *ReplaceOptions) Run(ctx context.Context) error { return o.change.run(ctx) }

func (o *ReplaceOptions) where() (cluster, namespace string) { return o.change.req.where() }
