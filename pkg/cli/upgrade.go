package cli

import (
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// UpgradeOptions replaces every control-plane machine of a cluster with one at
// a new Kubernetes version.
type UpgradeOptions struct {
	changeOptions
}

// NewUpgradeOptions returns the upgrade verb's defaults.
func NewUpgradeOptions(streams genericiooptions.IOStreams) *UpgradeOptions {
	return &UpgradeOptions{newChangeOptions(streams, "upgrade")}
}

// NewCmdUpgrade returns the upgrade verb. runF, when set, replaces Run, so
// tests can see what the flags resolve to.
func NewCmdUpgrade(root *RootOptions, runF func(*UpgradeOptions) error) *cobra.Command {
	o := NewUpgradeOptions(root.Streams)
	o.Management = root.ConfigFlags
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
			return runVerb(cmd, args, o, runF)
		},
	}
	o.addFlags(cmd)
	cmd.Flags().StringVar(&o.Request.Version, "version", "", "The Kubernetes version to upgrade to, e.g. v1.36.3 (required)")
	return cmd
}

// Complete takes the cluster's name.
func (o *UpgradeOptions) Complete(_ *cobra.Command, args []string) error {
	o.Cluster = args[0]
	return nil
}

// Validate checks the flags; it reads nothing but the options.
func (o *UpgradeOptions) Validate() error {
	if o.Request.Version == "" {
		return exitcode.Usagef("--version is required, e.g. --version v1.36.3")
	}
	if err := validateTarget(o.Request); err != nil {
		return err
	}
	return o.validate()
}
