package cli

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// UpgradeOptions replaces every control-plane machine of a cluster with one at
// a new Kubernetes version.
type UpgradeOptions struct {
	change changeOptions
	// WaitWorkers follows the topology controller's worker upgrade after the
	// hand-back, for up to WorkersTimeout.
	WaitWorkers    bool
	WorkersTimeout time.Duration
	// workersTimeoutTyped is whether --workers-timeout was on the command
	// line, where without --wait-workers it would be ignored; the
	// environment or config file may set it for the runs that wait.
	workersTimeoutTyped bool
}

// NewUpgradeOptions returns the upgrade verb's defaults.
func NewUpgradeOptions(streams genericiooptions.IOStreams) *UpgradeOptions {
	return &UpgradeOptions{change: newChangeOptions(streams, rollout.UpgradeOperation), WorkersTimeout: 30 * time.Minute}
}

// NewCmdUpgrade returns the upgrade verb. runF, when set, replaces Run, so
// tests can see what the flags resolve to.
func NewCmdUpgrade(root *RootOptions, runF func(*UpgradeOptions) error) *cobra.Command {
	o := NewUpgradeOptions(root.Streams)
	o.change.req.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "upgrade (CLUSTER | -l SELECTOR | -A) --version VERSION",
		Short: "Upgrade a control plane to a Kubernetes version, one machine at a time",
		Long: `Upgrade the control plane of CLUSTER to VERSION, replacing one machine at a
time: create the replacement, wait until its node, static pods and etcd member
are healthy, move etcd leadership off the machine that goes, delete it, remove
its etcd member, wait until it is gone, repeat.

Before it takes the cluster over, the run makes the readiness checks of
"kubectl cp-rollout check" (removed APIs in use, version skew, drain
blockers, fail-closed webhooks, etcd, CoreDNS, certificates) and prints on
stderr what is not a pass. A check that blocks refuses the run, exit 3, with
nothing changed; --skip-check NAME accepts that check's block knowingly. A
run that resumes an upgrade of its own does not check again.

The KubeadmControlPlane is paused while this runs and handed back at the end.
If the run stops early, re-running the same command continues from where the
cluster is.

On a cluster built from a ClusterClass the version is set in the Cluster's
spec.topology, where the topology controller reads it; it writes the version
into the KubeadmControlPlane and, after the hand-back, upgrades the workers
(--wait-workers follows them).

kubeadm allows one minor version per rollout. To upgrade a control plane two
or more minors behind, name a version of each minor in between with --via:
each is one complete rollout, handed back and agreed by KCP (and, on a
ClusterClass cluster, followed by the workers) before the next.

With -l SELECTOR (and -A for every namespace) instead of CLUSTER, every
matching cluster is upgraded, --parallel at a time, each exactly as alone:
its own lock, pause and hand-back, one machine at a time. Once more than
--max-failures clusters have failed no new one starts; those in flight
finish. A table at the end says how each ended; the exit code is the worst
cluster's. Re-running the same command continues: clusters already at
VERSION have nothing to do. -A without -l, every cluster there is, is first
listed and confirmed at the terminal, or needs --yes.`,
		Example: `  kubectl cp-rollout upgrade prod-eu1 --version v1.36.3 -n clusters
  kubectl cp-rollout upgrade prod-eu1 --version v1.36.3 --max-surge 0 -o json
  kubectl cp-rollout upgrade prod-eu1 --version v1.36.3 --infrastructure-template prod-eu1-cp-ubuntu-2404-v1.36.3
  kubectl cp-rollout upgrade staging-7 --version v1.36.3 --wait-workers
  kubectl cp-rollout upgrade legacy-2 --version v1.36.3 --via v1.35.2
  kubectl cp-rollout upgrade -A -l env=staging --version v1.36.3 --parallel 2 --max-failures 1`,
		Args: func(cmd *cobra.Command, args []string) error {
			// cobra checks the arguments after parsing the command line and
			// before the root's PersistentPreRunE fills the other flags from
			// the environment and the config file (applyConfig): here alone
			// a flag's Changed means typed.
			o.workersTimeoutTyped = cmd.Flags().Changed("workers-timeout")
			return clusterOrSelection(cmd, args)
		},
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	o.change.addFlags(cmd)
	o.change.addFleetFlags(cmd.Flags())
	request := &o.change.req.request
	cmd.Flags().StringVar(&request.Version, "version", "", "The Kubernetes version to upgrade to, e.g. v1.36.3 (required)")
	cmd.Flags().StringVar(&request.Template, "infrastructure-template", "", "The InfraMachineTemplate the new machines are made from, with --version (of the kind and namespace the KubeadmControlPlane uses today): a new machine image with the version")
	cmd.Flags().StringSliceVar(&request.Via, "via", nil, "Versions to pass through first, one complete rollout each, in order: one of each minor between the control plane's and --version, e.g. --via v1.35.2")
	cmd.Flags().BoolVar(&request.ReplaceUnhealthy, "replace-unhealthy", false, "Replace first, as this run's first steps, the control-plane machines found broken before it starts (without it, the run refuses them and names the replace command)")
	cmd.Flags().BoolVar(&o.WaitWorkers, "wait-workers", false, "On a ClusterClass (topology) cluster, also wait until the topology controller has upgraded every MachineDeployment to VERSION")
	cmd.Flags().DurationVar(&o.WorkersTimeout, "workers-timeout", o.WorkersTimeout, "How long --wait-workers waits for the workers")
	o.change.req.skip.addFlag(cmd)
	cmd.Flags().DurationVar(&o.change.wait.Timeouts.Topology, "topology-timeout", o.change.wait.Timeouts.Topology, "On a ClusterClass (topology) cluster, how long the topology controller may take to copy VERSION from the Cluster into the KubeadmControlPlane (BeforeClusterUpgrade hooks can hold it)")
	return cmd
}

// Complete takes the cluster's name, if given, and gives --wait-workers its
// time.
func (o *UpgradeOptions) Complete(cmd *cobra.Command, args []string) error {
	o.change.complete(cmd, args)
	if o.WaitWorkers {
		o.change.wait.Timeouts.Workers = o.WorkersTimeout
	}
	return nil
}

// Validate checks the flags; it changes nothing.
func (o *UpgradeOptions) Validate() error {
	request, timeouts := o.change.req.request, o.change.wait.Timeouts
	if request.Version == "" {
		return exitcode.Usagef("--version is required, e.g. --version v1.36.3")
	}
	if timeouts.Topology <= 0 {
		return exitcode.Usagef("--topology-timeout must be positive, not %s", timeouts.Topology)
	}
	if o.workersTimeoutTyped && !o.WaitWorkers {
		return exitcode.Usagef("--workers-timeout goes with --wait-workers: without it the run does not wait for the workers")
	}
	if o.WaitWorkers && o.WorkersTimeout <= 0 {
		return exitcode.Usagef("--workers-timeout must be positive, not %s", o.WorkersTimeout)
	}
	return o.change.validate()
}

// Run performs the upgrade, or with --dry-run prints its plan.
func (o *UpgradeOptions) Run(ctx context.Context) error { return o.change.run(ctx) }

func (o *UpgradeOptions) where() (cluster, namespace string) { return o.change.req.where() }
