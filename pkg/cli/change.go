package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// changeOptions are what the verbs that change a control plane (upgrade,
// scale, replace, rollout, restart) share: they differ only in the request.
type changeOptions struct {
	req  requestOptions
	wait waitLimits
	// limits and consent are for a run over -l/-A: how many clusters at
	// once, and the confirmation that -A without -l needs.
	limits  fleetLimits
	consent confirmation
	// staged is a fleet run's stages, windows and record.
	staged stagedFlags
	DryRun bool
	// OnFailure is what a failed run (exit 3 or 4) does with its pause:
	// stay (a re-run resumes) or handback (to KCP, when no machine is in
	// flight).
	OnFailure string
	// inFleet marks one cluster's run of a fleet, whose stop is told once
	// for all.
	inFleet bool
	// Interactive asks at the terminal before each machine step after the
	// first (confirm.go, betweenMachines), as kOps's rolling-update
	// --interactive does.
	Interactive bool
}

func newChangeOptions(streams genericiooptions.IOStreams, operation rollout.Operation) changeOptions {
	return changeOptions{req: newRequestOptions(streams, operation), wait: newWaitLimits(),
		limits: newFleetLimits(), consent: newConfirmation(streams), OnFailure: onFailureStay}
}

// addFlags adds the flags of a run on one cluster; a verb that also acts on
// a selection of clusters adds addFleetFlags.
func (o *changeOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	o.req.addFlags(cmd)
	o.wait.addFlags(f)
	deprecationsToStderr(cmd)
	dryRun := f.VarPF(dryRunFlag{&o.DryRun}, "dry-run", "", "Print the plan (as the plan verb does) and change nothing: --dry-run or --dry-run=client; none (the default) runs. There is no server-side dry run of a rollout")
	dryRun.NoOptDefVal = dryRunClient
	f.BoolVar(&o.Interactive, "interactive", false, "Ask on the terminal before each machine step after the first, once the one before is done and nothing is in flight; any answer but y stops the run there, resumable by the same command (exit 130). Needs a terminal; not with -o json or -l/-A")
	f.StringVar(&o.OnFailure, "on-failure", o.OnFailure, "What a run that fails (exit 3 or 4) does with the KubeadmControlPlane's pause: stay (paused with the run's record; re-run to resume) or handback (give it back to KCP, unless a machine is still joining or deleting); the exit code is the failure's either way")
}

// addFleetFlags adds -l/-A and what goes with them: how many clusters at
// once, when to stop starting them, and --yes for -A alone. replace names
// one machine of one cluster and takes none of them.
func (o *changeOptions) addFleetFlags(f *pflag.FlagSet) {
	o.req.sel.addFlags(f)
	o.limits.addFlags(f)
	o.req.staged.addFlags(f)
	o.consent.addYesFlag(f)
}

// dryRunFlag is --dry-run as kubectl takes it: bare or =client, or none.
// The tool's dry run is client-side: it prints the plan it computes from what
// it reads. server is refused rather than taken as client: kubectl's server
// dry run has the API server admit each write, which no plan here does, and
// a rollout's writes depend on one another's outcome. true and false, which
// the flag took when it was a bool, still work.
type dryRunFlag struct{ on *bool }

const dryRunClient = "client"

func (d dryRunFlag) String() string {
	if d.on != nil && *d.on {
		return dryRunClient
	}
	return "none"
}

func (d dryRunFlag) Set(value string) error {
	switch value {
	case dryRunClient, "true":
		*d.on = true
	case "none", "false":
		*d.on = false
	case "server":
		return errors.New("this tool has no server-side dry run of a rollout: --dry-run (=client) prints the plan, changing nothing")
	default:
		return errors.New("want client (or --dry-run alone) to print the plan, or none")
	}
	return nil
}

func (dryRunFlag) Type() string { return "string" }

// The values of --on-failure.
const (
	onFailureStay     = "stay"
	onFailureHandback = "handback"
)

// complete takes the CLUSTER argument and what the flags imply.
func (o *changeOptions) complete(cmd *cobra.Command, args []string) {
	o.req.conn.completeCluster(args)
	o.limits.complete(cmd)
	o.req.staged.complete(cmd.Flags())
	o.wait.complete()
}

// validate checks the shared flags.
func (o *changeOptions) validate() error {
	if err := validateSelection(string(o.req.request.Operation), o.req.conn.Cluster, o.req.sel); err != nil {
		return err
	}
	if err := oneOf("on-failure", o.OnFailure, onFailureStay, onFailureHandback); err != nil {
		return err
	}
	if err := o.limits.validate(o.req.sel.fleet()); err != nil {
		return err
	}
	if err := o.req.staged.validate(o.req.sel.fleet()); err != nil {
		return err
	}
	if err := o.req.validate(); err != nil {
		return err
	}
	if err := o.wait.validate(); err != nil {
		return err
	}
	if o.DryRun {
		// A plan changes nothing to confirm, and says after itself that
		// the run would refuse an unproven --kcp-version (runChecks).
		return nil
	}
	if err := o.req.conn.validateKCPVersion(); err != nil {
		return err
	}
	// A plan (above) asks nothing: --interactive is checked for a run only.
	if o.Interactive {
		if err := o.consent.validateInteractive(o.req.sel.fleet(), o.req.Output); err != nil {
			return err
		}
	}
	return o.consent.validateEveryCluster(string(o.req.request.Operation), &o.req.sel)
}

// run performs the request, or with --dry-run prints its plan, on the named
// cluster or on each selected one.
func (o *changeOptions) run(ctx context.Context) error {
	switch {
	case o.DryRun:
		_, err := o.req.printPlans(ctx)
		return err
	case o.req.sel.fleet():
		return o.runFleet(ctx)
	}
	reporter := progress.New(o.req.Output, o.req.Streams.Out, o.req.Streams.ErrOut)
	defer reporter.Stop()
	return o.runOne(ctx, reporter)
}

// runOne performs the request on one cluster, within --timeout.
func (o *changeOptions) runOne(ctx context.Context, reporter progress.Reporter) error {
	runCtx := ctx
	if t := o.wait.Timeout; t > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeoutCause(ctx, t,
			exitcode.Timeoutf("%s %s did not finish within --timeout %s; re-run the same command to continue", o.req.request.Operation, o.req.conn.Cluster, t))
		defer cancel()
	}
	return o.converge(ctx, runCtx, reporter)
}

// converge connects, checks the request against the cluster and runs the
// rollout loop until the control plane matches it, all within runCtx. What
// follows a failure is done within ctx: runCtx may be what --timeout ended.
func (o *changeOptions) converge(ctx, runCtx context.Context, reporter progress.Reporter) error {
	c, err := o.req.conn.connect(runCtx, loopUse(reporter, o.wait.Timeouts))
	if err != nil {
		return stopCause(runCtx, err)
	}
	defer c.close()
	engine := c.engine
	if o.Interactive {
		engine.BetweenMachines = betweenMachines(o.req.Streams, reporter.Stop, o.req.conn.Cluster, o.req.conn.Namespace)
	}
	prepared, err := engine.Prepare(runCtx, o.req.request, c.first)
	if err == nil && prepared.NothingToDo != "" {
		reporter.Report(progress.Event{Time: time.Now(), Cluster: o.req.conn.Cluster, Namespace: o.req.conn.Namespace, Action: string(o.req.request.Operation),
			Phase: progress.Done, Message: prepared.NothingToDo})
		return nil
	}
	if err == nil {
		var report *checkReport
		if report, err = o.req.readiness(runCtx, c, prepared, o.wait.Timeouts); err != nil {
			return stopCause(runCtx, err)
		}
		if report != nil {
			printFindingLines(o.req.Streams.ErrOut, report)
			if err := report.refusal(); err != nil {
				return err // nothing taken over: no pause to explain
			}
		}
		err = engine.Run(runCtx, prepared)
	}
	if err == nil {
		return nil
	}
	return o.afterFailure(ctx, engine, stopCause(runCtx, err))
}

// stopCause is err, or when runCtx ended with a cause of its own (--timeout)
// that cause, which explains the stop better than its echo.
func stopCause(runCtx context.Context, err error) error {
	if cause := context.Cause(runCtx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// afterFailure explains, or with --on-failure handback gives back, the pause
// a failed run left (rollout.Engine.AfterFailure), says so, and returns the
// run's error with what became of the pause: a fleet's table shows that
// error alone. The exit code stays the failure's.
func (o *changeOptions) afterFailure(ctx context.Context, engine *rollout.Engine, err error) error {
	a := engine.AfterFailure(ctx, o.req.request, err, o.OnFailure == onFailureHandback)
	switch {
	case a.HandedBack != nil:
		if !o.inFleet {
			for _, line := range a.HandedBack.Lines() {
				fmt.Fprintln(o.req.Streams.ErrOut, line)
			}
		}
		return exitcode.New(exitcode.Of(err), fmt.Errorf("%w; --on-failure handback: KubeadmControlPlane %s handed back to KCP", err, a.KCP))
	case a.Paused && !o.inFleet:
		fmt.Fprintln(o.req.Streams.ErrOut, a.Hint)
	}
	if a.Stayed != "" {
		return exitcode.New(exitcode.Of(err), fmt.Errorf("%w; --on-failure handback: KubeadmControlPlane %s stays paused: %s", err, a.KCP, a.Stayed))
	}
	return err
}

// waitLimits bound how long a run and each of its waits may take.
type waitLimits struct {
	Timeout  time.Duration // the whole run; 0: no limit
	Timeouts rollout.Timeouts
	// handback is --handback-timeout, which complete puts in Timeouts
	// unless --no-wait makes it 0; validate checks what was given.
	handback time.Duration
	NoWait   bool
}

func newWaitLimits() waitLimits {
	return waitLimits{Timeouts: rollout.DefaultTimeouts, handback: rollout.DefaultTimeouts.Handback}
}

func (l *waitLimits) addFlags(f *pflag.FlagSet) {
	f.DurationVar(&l.Timeout, "timeout", l.Timeout, "Give up after this long in all (0: no overall limit; each wait has its own)")
	f.DurationVar(&l.Timeouts.Provision, "provision-timeout", l.Timeouts.Provision, "How long a new machine may take to get a node (0: no limit)")
	f.DurationVar(&l.Timeouts.Health, "health-timeout", l.Timeouts.Health, "How long a new machine may take, once it has a node, to be healthy (node, static pods, etcd member), and its node's DaemonSets to be Ready (0: no limit)")
	f.DurationVar(&l.Timeouts.Delete, "delete-timeout", l.Timeouts.Delete, "How long a machine may take to be deleted (0: no limit)")
	f.DurationVar(&l.Timeouts.Recovery, "unhealthy-grace", l.Timeouts.Recovery, "How long a machine that was healthy and went bad (a failed probe, a restarting static pod, a member that lost its peers for a moment) may take to recover before the run refuses to go on (exit 3)")
	f.DurationVar(&l.handback, "handback-timeout", l.handback, "How long KCP may take, after the hand-back, to reconcile and agree the rollout is done (its status at the target version, every machine up to date)")
	f.BoolVar(&l.NoWait, "no-wait", l.NoWait, "Exit once the control plane is handed back, without waiting for KCP to agree the rollout is done")
	gateFlags{&l.Timeouts}.addFlags(f)
}

// complete makes --no-wait a hand-back timeout of 0.
func (l *waitLimits) complete() {
	l.Timeouts.Handback = l.handback
	if l.NoWait {
		l.Timeouts.Handback = 0
	}
}

func (l *waitLimits) validate() error {
	for _, d := range []struct {
		flag  string
		value time.Duration
	}{
		{"timeout", l.Timeout}, {"provision-timeout", l.Timeouts.Provision}, {"health-timeout", l.Timeouts.Health},
		{"delete-timeout", l.Timeouts.Delete}, {"handback-timeout", l.handback},
	} {
		if d.value < 0 {
			return exitcode.Usagef("--%s must not be negative, not %s", d.flag, d.value)
		}
	}
	if l.Timeouts.Recovery <= 0 {
		return exitcode.Usagef("--unhealthy-grace must be positive, not %s", l.Timeouts.Recovery)
	}
	return gateFlags{&l.Timeouts}.validate()
}
