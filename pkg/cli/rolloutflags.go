package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// rolloutOptions are the flags and the run shared by the verbs that change a
// control plane (upgrade, scale, replace): they differ only in the request.
type rolloutOptions struct {
	connection
	Root     *RootOptions
	MaxSurge int32
	Timeout  time.Duration
	Timeouts rollout.Timeouts
	Output   string
	DryRun   bool
}

func (o *rolloutOptions) addFlags(cmd *cobra.Command) {
	o.MaxSurge = -1
	o.Timeouts = rollout.DefaultTimeouts
	o.Output = "text"
	f := cmd.Flags()
	f.Int32Var(&o.MaxSurge, "max-surge", o.MaxSurge, "Machines created above the replica count during a rollout: 1 (replacement first) or 0 (delete first, for clusters without spare capacity; needs at least 3 replicas); -1 uses the KubeadmControlPlane's rollout.strategy.rollingUpdate.maxSurge")
	f.DurationVar(&o.Timeout, "timeout", 0, "Give up after this long in all (0: no overall limit; each wait has its own)")
	f.DurationVar(&o.Timeouts.Provision, "provision-timeout", o.Timeouts.Provision, "How long a new machine may take to get a node")
	f.DurationVar(&o.Timeouts.Health, "health-timeout", o.Timeouts.Health, "How long a new machine may take, once it has a node, to be healthy (node, static pods, etcd member)")
	f.DurationVar(&o.Timeouts.Delete, "delete-timeout", o.Timeouts.Delete, "How long a machine may take to be deleted")
	f.DurationVar(&o.Timeouts.Settle, "settle", 0, "Pause after each new machine turns healthy, before the next step")
	f.StringVarP(&o.Output, "output", "o", o.Output, "Progress format: text (spinner on a terminal, timestamped lines otherwise) or json (JSON Lines events on stdout)")
	f.StringVar(&o.EtcdEndpoint, "etcd-endpoint", "", "Reach etcd members directly at this URL template, e.g. 'https://{{.NodeIP}}:2379' (default: port-forward through the workload API server)")
	f.BoolVar(&o.DryRun, "dry-run", false, "Print the plan (as the plan verb does) and change nothing")
	f.StringVar(&o.KCPVersion, "kcp-version", "", "The KubeadmControlPlane controller's version, for custom installs where its Deployment cannot be found")
}

// validate checks the shared flags; it reads nothing but the options.
func (o *rolloutOptions) validate() error {
	if o.MaxSurge < -1 || o.MaxSurge > 1 {
		return exitcode.Usagef("--max-surge must be 0 or 1, not %d", o.MaxSurge)
	}
	for name, d := range map[string]time.Duration{
		"timeout": o.Timeout, "provision-timeout": o.Timeouts.Provision, "health-timeout": o.Timeouts.Health,
		"delete-timeout": o.Timeouts.Delete, "settle": o.Timeouts.Settle,
	} {
		if d < 0 {
			return exitcode.Usagef("--%s must not be negative, not %s", name, d)
		}
	}
	return oneOf("output", o.Output, "text", "json")
}

// run connects, checks the request and runs it, reporting progress.
func (o *rolloutOptions) run(ctx context.Context, streams genericiooptions.IOStreams, r rollout.Request) error {
	r.MaxSurge = o.MaxSurge
	if o.DryRun {
		_, err := o.plan(ctx, streams.Out, r)
		return err
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, o.Timeout,
			exitcode.Timeoutf("%s %s did not finish within --timeout %s; re-run the same command to continue", r.Operation, o.Cluster, o.Timeout))
		defer cancel()
	}
	reporter := progress.New(o.Output, streams.Out, streams.ErrOut)
	defer reporter.Stop()

	engine, closeEngine, err := o.connect(ctx, o.Root.ConfigFlags, reporter, true)
	if err != nil {
		return err
	}
	defer closeEngine()
	engine.Timeouts = o.Timeouts

	prepared, err := engine.Prepare(ctx, r)
	if err != nil {
		return err
	}
	if prepared.NothingToDo != "" {
		reporter.Report(progress.Event{Time: time.Now(), Cluster: o.Cluster, Namespace: o.Namespace, Action: r.Operation,
			Phase: progress.Done, Message: prepared.NothingToDo})
		return nil
	}
	err = engine.Run(ctx, prepared)
	if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	if err != nil && ctx.Err() != nil {
		fmt.Fprintf(streams.ErrOut, "stopped; the KubeadmControlPlane stays paused with its operation record. Re-run the same command to continue, or `kubectl cp-rollout handback %s` to give control back to KCP.\n", o.Cluster)
	}
	return err
}

// clusterArg checks the one positional argument, the Cluster's name.
func clusterArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return exitcode.Usagef("%s needs exactly one argument, the Cluster's name; got %d", cmd.Name(), len(args))
	}
	return nil
}
