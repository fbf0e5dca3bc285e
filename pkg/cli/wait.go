package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// This file is wait: a CI job that starts a rollout, by this tool or by
// changing the KubeadmControlPlane and letting KCP roll it, blocks here until
// the rollout is done, whoever rolls it. It polls: every waitInterval it
// reads the control plane and its lock afresh and judges them (judgeDone);
// the tool's rule is a live read before every decision, and a read costs
// what one status of the management cluster costs.

// WaitOptions waits until a control plane's rollout is done.
type WaitOptions struct {
	conn connection
	// For is the condition waited for; done is the only one.
	For string
	// Timeout bounds the wait; 0 waits without limit.
	Timeout time.Duration
	// output is -o: text (progress on stderr alone), or also, once done,
	// one object on stdout in the format of an object it names.
	output  printFlags
	Streams genericiooptions.IOStreams

	// interval is how often the control plane is read afresh, and now the
	// clock: tests shorten the one and drive the other.
	interval time.Duration
	now      func() time.Time
}

// waitForDone is --for's one value: no operation holds the cluster and KCP
// has settled.
const waitForDone = "done"

var (
	waitConditions = []string{waitForDone}
	// waitOutputs: wait prints one object, once done.
	waitOutputs = objectOutputs
)

// waitInterval is how often wait reads the control plane afresh: the pace
// of status -w, and of a run's renewal of its Lease.
const waitInterval = 2 * time.Second

// waitUse is how wait connects: the management cluster alone, with every
// permission of the view role (cp-rollout-view) checked first. What KCP and
// the Lease say is all it judges, so it never reads the workload cluster's
// Secrets, and an identity lacking a permission of the role is refused
// (exit 6) rather than left to wait on reads that fail.
var waitUse = engineUse{timeouts: rollout.DefaultTimeouts, access: &rbac.View}

// NewWaitOptions returns the wait verb's defaults.
func NewWaitOptions(streams genericiooptions.IOStreams) *WaitOptions {
	return &WaitOptions{output: printFlags{Output: "text", values: waitOutputs}, Streams: streams, interval: waitInterval, now: time.Now}
}

// NewCmdWait returns the wait verb. runF, when set, replaces Run, so tests
// can see what the flags resolve to.
func NewCmdWait(root *RootOptions, runF func(*WaitOptions) error) *cobra.Command {
	o := NewWaitOptions(root.Streams)
	o.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "wait CLUSTER --for done [--timeout D]",
		Short: "Wait until a control plane's rollout is done, whoever rolls it",
		Long: `Wait until the rollout of CLUSTER's control plane is done, whether this tool
rolls it (this run's, or a colleague's) or KCP rolls it by itself after a
change of the KubeadmControlPlane's spec: no live run of this tool holds the
cluster's lock, the KubeadmControlPlane carries no operation record of this
tool, no control-plane machine is being deleted or unready, and KCP agrees the
rollout is done, as a run's hand-back waits for it (KCP has observed its
spec, reports every machine at spec.version and up to date, and has as many
as it wants).

The control plane and its lock are read afresh every 2s; a line on stderr
says what the wait still waits for whenever that changes. Exit 0 once done
(with -o json, one object on stdout: cluster, namespace, done, version,
waited); 4 at --timeout, naming what it last waited for; 3 at once when a
pause of this tool holds KCP back and no run of this tool will lift it (a
failed or interrupted run, or pause): the error names the failure, or who
paused, and the command that moves on. A pause someone else set is waited
out. Read-only: it needs the view role (cp-rollout-view) on the management
cluster alone.`,
		Example: `  kubectl patch kubeadmcontrolplane prod-eu1-control-plane --type merge -p '{"spec":{"version":"v1.36.3"}}'
  kubectl cp-rollout wait prod-eu1 --for done --timeout 30m
  kubectl cp-rollout wait prod-eu1 --for done --timeout 0 -o json | jq .waited`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return exitcode.Usagef("wait needs one argument, the Cluster's name; got %d", len(args))
			}
			return nil
		},
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	cmd.Flags().StringVar(&o.For, "for", "", "The condition to wait for (required): done, no run of this tool holds the cluster and KCP has settled")
	_ = cmd.RegisterFlagCompletionFunc("for", cobra.FixedCompletions(waitConditions, cobra.ShellCompDirectiveNoFileComp))
	cmd.Flags().DurationVar(&o.Timeout, "timeout", o.Timeout, "Give up after this long, exit 4 (0: wait without limit)")
	addOutputFlag(cmd, &o.output.Output, waitOutputs, "Output format: text (progress on stderr alone, nothing on stdout); otherwise also, once done, one object on stdout, {cluster, namespace, done, version, waited}: json (on one line), yaml, or jsonpath=TEMPLATE or go-template=TEMPLATE (read that object)")
	return cmd
}

// Complete takes the cluster's name.
func (o *WaitOptions) Complete(_ *cobra.Command, args []string) error {
	o.conn.completeCluster(args)
	return nil
}

// Validate checks the flags; it changes nothing.
func (o *WaitOptions) Validate() error {
	if err := validateSelection("wait", o.conn.Cluster, selection{}); err != nil {
		return err
	}
	if o.For == "" {
		return exitcode.Usagef("--for is required: --for %s waits until no run of this tool holds the cluster and KCP has settled", waitForDone)
	}
	if err := oneOf("for", o.For, waitConditions...); err != nil {
		return err
	}
	if o.Timeout < 0 {
		return exitcode.Usagef("--timeout must not be negative, not %s (0 waits without limit)", o.Timeout)
	}
	return o.output.complete()
}

func (o *WaitOptions) where() (cluster, namespace string) { return o.conn.Cluster, o.conn.Namespace }

// waitSource is what wait reads, live each time: KCP's view of the control
// plane and the cluster's Lease (nil when there is none).
// *controlplane.Client provides it.
type waitSource interface {
	Read(ctx context.Context) (*kcpstate.ControlPlane, error)
	Lease(ctx context.Context) (*coordinationv1.Lease, error)
}

// waitedDone is what -o json prints once the rollout is done.
type waitedDone struct {
	Cluster   string `json:"cluster"`
	Namespace string `json:"namespace"`
	Done      bool   `json:"done"`
	// Version is the KubeadmControlPlane's spec.version, at which KCP then
	// reports every machine.
	Version string `json:"version"`
	// Waited is how long the wait took, as a Go duration ("1m32.4s").
	Waited string `json:"waited"`
}

// Run connects to the management cluster and waits, within --timeout.
func (o *WaitOptions) Run(ctx context.Context) error {
	began := o.now()
	runCtx := ctx
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	mc, err := o.conn.connectManagement(runCtx, waitUse)
	if err != nil {
		return o.ended(ctx, runCtx, err, "the management cluster was not reached yet", nil)
	}
	return o.wait(ctx, runCtx, mc.cp, began)
}

// wait reads src every interval until the rollout is done, a state no
// waiting moves refuses it, runCtx ends (--timeout) or ctx does (a signal).
// Each look reads the control plane first, then its Lease: a run takes the
// Lease before it writes its record and removes its record before it
// releases the Lease, so a record seen without a live Lease read after it
// was left by a run that is gone, and no look can find the control plane
// done while a run has begun to change it.
func (o *WaitOptions) wait(ctx, runCtx context.Context, src waitSource, began time.Time) error {
	var (
		lock lockWatch
		// awaited is the progress line last printed, awaitedAll all that
		// was left then.
		awaited, awaitedAll string
		last                *kcpstate.ControlPlane
		refusing            *record.Record // the record a refusal was first judged on
	)
	for {
		cp, err := src.Read(runCtx)
		var lease *coordinationv1.Lease
		if err == nil {
			lease, err = src.Lease(runCtx)
		}
		var (
			left  []string
			coded *exitcode.Error
		)
		switch {
		case runCtx.Err() != nil:
			return o.ended(ctx, runCtx, runCtx.Err(), awaitedAll, last)
		case errors.As(err, &coded):
			// The Cluster or its KubeadmControlPlane is gone or is no
			// longer one this tool knows: no waiting brings it back.
			return err
		case err != nil:
			// A read that fails for a moment only delays the answer, up to
			// --timeout.
			left = []string{"the control plane cannot be read: " + err.Error()}
		default:
			last = cp
			var refusal error
			left, refusal = judgeDone(cp, lock.holder(lease, o.now()))
			if refusal != nil {
				// A refusal ends the wait only when a second look, at once,
				// finds the same record still standing with no live run: the
				// first may have read the record just before a run handed
				// back and released the Lease.
				rec, _ := record.Of(cp.KCP)
				if rec == nil || refusing != nil && rec.Started.Equal(refusing.Started) {
					return refusal // an unreadable record needs no second look
				}
				refusing = rec
				continue
			}
		}
		refusing = nil
		if len(left) == 0 {
			return o.done(cp, began)
		}
		// The line says the first of what is left, the most telling, and
		// how much more: the whole list would change with every condition
		// KCP and the Machine controller write. --timeout's error has it all.
		awaitedAll = strings.Join(left, "; ")
		if now := waitingLine(left); now != awaited {
			awaited = now
			o.progress("waiting: " + awaited)
		}
		select {
		case <-runCtx.Done():
			return o.ended(ctx, runCtx, runCtx.Err(), awaitedAll, last)
		case <-time.After(o.interval):
		}
	}
}

// waitingLine is the progress line's account of left: its first item, and
// how many more there are.
func waitingLine(left []string) string {
	if len(left) == 1 {
		return left[0]
	}
	return fmt.Sprintf("%s (and %d more)", left[0], len(left)-1)
}

// ended is the error of a wait that ctx (a signal) or runCtx (--timeout)
// ended while it waited for awaited; last is the control plane as last
// read, for what KCP says of itself.
func (o *WaitOptions) ended(ctx, runCtx context.Context, err error, awaited string, last *kcpstate.ControlPlane) error {
	name := o.name()
	switch {
	case ctx.Err() != nil:
		// main exits as the signal says (130 for Ctrl-C).
		return fmt.Errorf("wait for %s stopped; it was waiting: %s: %w", name, awaited, context.Cause(ctx))
	case runCtx.Err() == nil:
		return err
	}
	msg := fmt.Sprintf("%s was not done within --timeout %s: %s", name, o.Timeout, awaited)
	if last != nil {
		if says := rollout.KCPSays(last.KCP); len(says) > 0 {
			msg += "; KCP says: " + strings.Join(says, "; ")
		}
	}
	return exitcode.Timeoutf("%s; `kubectl cp-rollout status %s -n %s` shows where it stands", msg, o.conn.Cluster, o.conn.Namespace)
}

// done says the rollout is done: a line on stderr and, with -o json, the
// object on stdout.
func (o *WaitOptions) done(cp *kcpstate.ControlPlane, began time.Time) error {
	waited := o.now().Sub(began).Round(100 * time.Millisecond)
	o.progress(fmt.Sprintf("done: no run of this tool holds it, and KCP reports every machine at %s, up to date and ready (waited %s)", cp.KCP.Spec.Version, waited))
	v := waitedDone{Cluster: o.conn.Cluster, Namespace: o.conn.Namespace, Done: true, Version: cp.KCP.Spec.Version, Waited: waited.String()}
	// -o json stays one line, as it always has been (scripts read it as
	// one); yaml is the one object, not a list.
	return o.output.print(o.Streams.Out, v, o.output.format == "json", func(tableOptions) error { return nil })
}

func (v waitedDone) docs() []doc   { return []doc{{v.Namespace + "/" + v.Cluster, v}} }
func (v waitedDone) rowSet() []row { return nil } // no -o name or custom-columns

// progress writes one timestamped line about the cluster on stderr.
func (o *WaitOptions) progress(line string) {
	fmt.Fprintf(o.Streams.ErrOut, "%s %s %s\n", o.now().UTC().Format(time.RFC3339), o.name(), line)
}

// name names the cluster in messages: namespace/cluster once the namespace
// is resolved (on connecting), the cluster alone before.
func (o *WaitOptions) name() string {
	if o.conn.Namespace == "" {
		return o.conn.Cluster
	}
	return o.conn.Namespace + "/" + o.conn.Cluster
}

// lockWatch judges, look after look, whether the cluster's Lease is held by
// a live run. As a run that would take the Lease over judges it (runlock),
// it goes by what this process saw, never by the renew time another
// machine's clock wrote: a Lease is live until it has gone its duration
// unchanged since this process first saw it as it is.
type lockWatch struct {
	version string
	since   time.Time
}

// holder is the live holder of lease at now, "" when there is none: no
// Lease, one without a holder, or one that went its duration unchanged.
func (w *lockWatch) holder(lease *coordinationv1.Lease, now time.Time) string {
	holder := ""
	if lease != nil {
		holder = ptr.Deref(lease.Spec.HolderIdentity, "")
	}
	if holder == "" {
		w.version = ""
		return ""
	}
	if lease.ResourceVersion != w.version {
		w.version, w.since = lease.ResourceVersion, now
	}
	if now.Sub(w.since) >= runlock.DurationOf(lease) {
		return ""
	}
	return holder
}

// judgeDone says what keeps cp's rollout from being done, given the live
// holder of its lock ("" for none): none when done. It refuses (exit 3) a
// control plane that a pause of this tool holds with no run to lift it, as
// no waiting moves that.
func judgeDone(cp *kcpstate.ControlPlane, holder string) (left []string, refusal error) {
	kcp := cp.KCP
	rec, err := record.Of(kcp)
	if err != nil {
		return nil, err
	}
	paused := annotations.HasPaused(kcp)
	if holder != "" {
		acting := rollout.Acting(&rollout.LockStatus{Holder: holder, Live: true}, rec, paused, nil)
		return []string{fmt.Sprintf("a run of this tool holds the lock (Lease %s): %s",
			runlock.LeaseName(cp.Cluster.Name), acting.What)}, nil
	}
	if rec != nil {
		return nil, heldByRecord(cp, rec, paused)
	}
	switch {
	case ptr.Deref(cp.Cluster.Spec.Paused, false):
		return []string{fmt.Sprintf("Cluster %s is paused (spec.paused, set by someone else): no controller acts on its machines until it is unpaused", cp.Cluster.Name)}, nil
	case paused:
		return []string{fmt.Sprintf("KubeadmControlPlane %s is paused by someone else (annotation %s without this tool's record): KCP rolls nothing out until it is unpaused",
			kcp.Name, clusterv1.PausedAnnotation)}, nil
	}
	for _, m := range rollout.Deleting(rollout.NewSnapshot(cp)).SortedByCreationTimestamp() {
		left = append(left, "machine "+m.Name+" is being deleted")
	}
	left = append(left, rollout.Unsettled(cp)...)
	for _, m := range cp.Machines.Filter(collections.Not(collections.HasDeletionTimestamp)).SortedByCreationTimestamp() {
		if why := notReady(m); why != "" {
			left = append(left, "machine "+m.Name+" is not Ready: "+why)
		}
	}
	return left, nil
}

// notReady says why m's Ready condition is not True, "" when it is: the
// Machine controller's summary of its node, its infrastructure and KCP's
// readiness gates (its static pods and etcd member).
func notReady(m *clusterv1.Machine) string {
	c := conditions.Get(m, clusterv1.MachineReadyCondition)
	switch {
	case c == nil:
		return "no Ready condition yet"
	case c.Status == metav1.ConditionTrue:
		return ""
	}
	why := fmt.Sprintf("Ready=%s (%s)", c.Status, c.Reason)
	if msg := cutLine(c.Message, 160); msg != "" {
		why += ": " + msg
	}
	return why
}

// cutLine is s on one line, cut to at most limit bytes.
func cutLine(s string, limit int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > limit {
		s = strings.ToValidUTF8(s[:limit-3], "") + "..."
	}
	return s
}

// heldByRecord is the refusal of a control plane that rec, a record of this
// tool, holds while no run does: KCP rolls nothing out while it is paused,
// and only a person's command lifts the pause.
func heldByRecord(cp *kcpstate.ControlPlane, rec *record.Record, paused bool) error {
	kcp, cluster, namespace := cp.KCP.Name, cp.Cluster.Name, cp.Cluster.Namespace
	handback := fmt.Sprintf("`kubectl cp-rollout handback %s -n %s`", cluster, namespace)
	if rec.Operation == record.PauseOperation {
		return exitcode.Unsafef("KubeadmControlPlane %s is paused by cp-rollout pause (%s): KCP rolls nothing out while it is, so the rollout cannot finish; "+
			"`kubectl cp-rollout rollout %s -n %s` rolls the change out, or %s lets KCP roll it",
			kcp, rec.Detail(), cluster, namespace, handback)
	}
	held := "paused"
	if !paused {
		// Someone removed the pause by hand and left the record: KCP acts,
		// but the record says an operation of this tool is unfinished.
		held = "unpaused by hand, yet still recorded"
	}
	how := "its run was interrupted (no failure recorded)"
	if f := rec.LastFailure; f != nil {
		how = fmt.Sprintf("its last run failed %s (exit %d): %s", f.Time.UTC().Format(time.RFC3339), f.ExitCode, cutLine(strings.TrimRight(f.Reason, "."), 600))
	}
	return exitcode.Unsafef("KubeadmControlPlane %s is %s under an unfinished operation of this tool, %s, and no run holds the lock: %s; "+
		"KCP rolls nothing out while it is held, so the rollout cannot finish: re-run the `kubectl cp-rollout %s` that started it to resume, or %s to let KCP finish",
		kcp, held, rec, how, rec.Operation, handback)
}
