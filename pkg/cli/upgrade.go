package cli

import (
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// UpgradeOptions replaces every control-plane machine of a cluster with one at
// a new Kubernetes version.
type UpgradeOptions struct {
	rolloutOptions
	Version string
	Streams genericiooptions.IOStreams
}

// NewCmdUpgrade returns the upgrade verb.
func NewCmdUpgrade(root *RootOptions) *cobra.Command {
	o := &UpgradeOptions{Streams: root.Streams}
	o.Root = root
	cmd := &cobra.Command{
		Use:   "upgrade CLUSTER --version VERSION",
		Short: "Upgrade a control plane to a Kubernetes version, one machine at a time",
		Long: `Upgrade the control plane of CLUSTER to VERSION, replacing one machine at a
time: create the replacement, wait until its node, static pods and etcd member
are healthy, move etcd leadership off the machine that goes, delete it, remove
its etcd member, wait until it is gone, repeat.

The KubeadmControlPlane is paused while this runs and handed back at the end.
If the run stops early, re-running the same command continues from where the
cluster is.`,
		Example: `  kubectl cp-rollout upgrade prod-eu1 --version v1.36.3 -n clusters
  kubectl cp-rollout upgrade prod-eu1 --version v1.36.3 --max-surge 0 -o json`,
		Args: clusterArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Cluster = args[0]
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd)
		},
	}
	o.addFlags(cmd)
	cmd.Flags().StringVar(&o.Version, "version", "", "The Kubernetes version to upgrade to, e.g. v1.36.3 (required)")
	return cmd
}

// Validate checks the flags; it reads nothing but the options.
func (o *UpgradeOptions) Validate() error {
	if o.Version == "" {
		return exitcode.Usagef("--version is required, e.g. --version v1.36.3")
	}
	if _, err := rollout.ParseVersion(o.Version); err != nil {
		return err
	}
	return o.validate()
}

// Run upgrades the control plane.
func (o *UpgradeOptions) Run(cmd *cobra.Command) error {
	return o.run(cmd.Context(), o.Streams, rollout.Request{Operation: "upgrade", Version: o.Version})
}
