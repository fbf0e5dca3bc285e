package cli

import (
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// ReplaceOptions replaces one named control-plane machine.
type ReplaceOptions struct {
	rolloutOptions
	Machine string
	Streams genericiooptions.IOStreams
}

// NewCmdReplace returns the replace verb.
func NewCmdReplace(root *RootOptions) *cobra.Command {
	o := &ReplaceOptions{Streams: root.Streams}
	o.Root = root
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
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Cluster, o.Machine = args[0], args[1]
			if err := o.validate(); err != nil {
				return err
			}
			return o.run(cmd.Context(), o.Streams, rollout.Request{Operation: "replace", Replace: o.Machine})
		},
	}
	o.addFlags(cmd)
	return cmd
}
