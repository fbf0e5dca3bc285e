package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/blang/semver/v4"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// Prepared is a checked request, ready to run: the snapshot it was checked on
// (projected with the request's spec) and the target the loop drives towards.
type Prepared struct {
	Request Request
	// Snapshot and Target are the first hop's (the only one but for an
	// upgrade --via).
	Snapshot *Snapshot
	Target   Target
	// Hops are the versions the upgrade passes through, the target last
	// (one empty hop for scale and replace); the run starts at FirstHop, the
	// first the control plane has not completed.
	Hops     []string
	FirstHop int
	// Steps counts the machine steps expected, for progress.
	Steps int
	// NothingToDo, when set, says why the control plane already matches the
	// request: there is nothing to run.
	NothingToDo string
	// HandBackOnly, when set, says why a KubeadmControlPlane held by `pause`
	// has nothing to roll: the run only takes the pause over and hands back.
	HandBackOnly string
}

// Prepare reads the control plane and checks the request against it without
// changing anything: bad input is exit 2, an unsafe state exit 3. A control
// plane that already matches (and carries no record of ours) is prepared with
// NothingToDo set. connected, when not nil, is the control plane as read a
// moment ago (see SnapshotOf).
//
// Its checks come in this order: the request alone (Validate), the state
// (CheckState), the versions it passes through (hops), the spec it asks for
// (desired), the machine a replace names (replaced), the projection
// (withSpec), the broken machines
// (Admit), and last the first step on the projected control plane (Next).
func (e *Engine) Prepare(ctx context.Context, r Request, connected *kcpstate.ControlPlane) (*Prepared, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	s, err := e.SnapshotOf(ctx, connected)
	if err != nil {
		return nil, err
	}
	if err := CheckState(s, r); err != nil {
		return nil, orLockedOut(ctx, e.Lease, err)
	}
	hops, first, err := e.hops(ctx, s, r)
	if err != nil {
		return nil, err
	}
	hop := r
	hop.Version = hops[first]
	want, err := e.desired(ctx, s, hop)
	if err != nil {
		return nil, err
	}
	rec, err := record.Of(s.CP.KCP)
	if err != nil {
		return nil, err
	}
	if done, err := replaced(s, r, rec); err != nil {
		return nil, err
	} else if done != "" {
		return &Prepared{Request: r, NothingToDo: done}, nil
	}
	future, err := withSpec(ctx, e.Reader, s, want)
	if err != nil {
		return nil, err
	}
	t := TargetFor(want, hop)
	if r.Operation == RestartOperation {
		t.RolloutAfter = restartCutoff(rec, s.Now)
	}
	// A `pause` record is no run of ours to resume: it only holds KCP back.
	resuming := rec != nil && rec.Operation != string(PauseOperation)
	if t, err = Admit(future, r, t, resuming); err != nil {
		return nil, orLockedOut(ctx, e.Lease, err)
	}
	p := &Prepared{Request: r, Snapshot: future, Target: t, Hops: hops, FirstHop: first}
	if p.count(s, rec, resuming); p.NothingToDo != "" {
		return p, nil
	}
	// Refuse an unsafe control plane now, before the lock and the pause: a
	// refusal then changes nothing.
	if step := Next(ctx, future, t); step.Action == Refuse {
		return nil, orLockedOut(ctx, e.Lease, exitcode.Unsafef("%w; nothing was changed", step.Err))
	}
	return p, nil
}

// count counts the machine steps p takes from s, the control plane before
// the projection, whose record is rec (resuming: a run's), and says when
// there is nothing to run (NothingToDo) or only a pause to take over and
// hand back (HandBackOnly).
func (p *Prepared) count(s *Snapshot, rec *record.Record, resuming bool) {
	t := p.Target
	outdated, delta := NeedingRollout(p.Snapshot, t).Len(), int(t.Replicas)-s.CP.Machines.Filter(collections.Not(collections.HasDeletionTimestamp)).Len()
	// Every later hop replaces every machine.
	p.Steps = outdated + max(delta, -delta) + int(t.Replicas)*(len(p.Hops)-1-p.FirstHop)
	if outdated != 0 || delta != 0 || Deleting(s).Len() != 0 {
		return
	}
	// A KubeadmControlPlane held by `pause` with nothing to roll still runs:
	// the run takes the pause over and hands it back, under the lock.
	switch {
	case rec == nil:
		p.NothingToDo = p.Request.Matched()
	case !resuming:
		p.HandBackOnly = p.Request.Matched() + "; handing back the pause by " + rec.Detail()
	}
}

// hops are the versions r passes through on s, the target last (one hop,
// r's version or none, but for an upgrade that skips minors), and the first
// the control plane has not completed. The last hop always runs: it is where
// "nothing to do" is found.
func (e *Engine) hops(ctx context.Context, s *Snapshot, r Request) (hops []string, first int, err error) {
	hops = []string{r.Version}
	if r.Version != "" {
		via, err := viaOf(ctx, e.Topology, s, r)
		if err != nil {
			return nil, 0, err
		}
		if hops, err = Hops(s.CP.Machines.LowestVersion(), via, r.Version); err != nil {
			return nil, 0, err
		}
	}
	return hops, min(firstRemainingHop(s, hops), len(hops)-1), nil
}

// desired is the KubeadmControlPlane hop asks for on s (Desired), with what
// only the management cluster can tell besides: that its
// InfraMachineTemplate can be read, and that --wait-workers has a topology
// to follow.
func (e *Engine) desired(ctx context.Context, s *Snapshot, hop Request) (*controlplanev1.KubeadmControlPlane, error) {
	want, err := Desired(ctx, s, hop)
	if err != nil {
		return nil, err
	}
	if hop.Template != "" {
		if err := e.HandOver.CheckTemplate(ctx, want); err != nil {
			return nil, err
		}
	}
	if e.Timeouts.Workers > 0 && !s.CP.Cluster.Spec.Topology.IsDefined() {
		return nil, exitcode.Usagef("--wait-workers follows the topology controller's upgrade of the workers, and cluster %s has no ClusterClass topology: upgrade its MachineDeployments yourself",
			s.CP.Cluster.Name)
	}
	return want, nil
}

// replaced answers a replace whose machine s does not hold, under no record
// of ours (rec): one that finished (and was killed before it could say so)
// is found in the last operation's record, and has nothing to do; any other
// names no machine of the control plane (bad input). A replace interrupted
// after its machine went resumes on its record alone. Both are "" and nil
// for any other request.
func replaced(s *Snapshot, r Request, rec *record.Record) (nothingToDo string, err error) {
	if _, ok := s.CP.Machines[r.Replace]; r.Replace == "" || rec != nil || ok {
		return "", nil
	}
	if last := record.LastOf(s.CP.KCP); last != nil && last.Finished != nil && last.Operation == string(r.Operation) && last.Target == r.TargetString() {
		return fmt.Sprintf("nothing to do: machine %s was replaced by %s, finished %s", r.Replace, last.Who, last.Finished.Format(time.RFC3339)), nil
	}
	return "", exitcode.Usagef("machine %s is not a control-plane machine of cluster %s", r.Replace, s.CP.Cluster.Name)
}

// withSpec is s as it is about to become once want is the
// KubeadmControlPlane's spec (and, on a topology cluster, the topology's,
// where the target is set and copied from): the snapshot a plan is made on.
func withSpec(ctx context.Context, reader Reader, s *Snapshot, want *controlplanev1.KubeadmControlPlane) (*Snapshot, error) {
	projected, err := reader.WithKCP(ctx, s.CP, want)
	if err != nil {
		return nil, err
	}
	if projected.Cluster.Spec.Topology.IsDefined() {
		cluster := projected.Cluster.DeepCopy()
		cluster.Spec.Topology.Version, cluster.Spec.Topology.ControlPlane.Replicas = want.Spec.Version, want.Spec.Replicas
		projected.Cluster = cluster
	}
	future := *s
	future.CP = projected
	return &future, nil
}

// Admit decides whether a run of r may start on s towards t while machines
// that came up have gone bad (Broken), and returns the target it starts with.
// Such machines would stall any step, so the run refuses them, naming the
// oldest and the commands that move forward — unless it was asked to replace
// them first (--replace-unhealthy: they are condemned), or it replaces a
// machine that is itself broken or condemned by a MachineHealthCheck: that
// is a remediation, which KCP's rules let go on beside other broken machines
// (Next, SafeToRemediate), and after which the run names the next one.
// It is pure: a model check decides on it as the run does.
func Admit(s *Snapshot, r Request, t Target, resuming bool) (Target, error) {
	broken := Broken(s, t, resuming)
	named, replacing := s.CP.Machines[r.Replace]
	switch {
	case r.Replace != "" && (!replacing || Remediating(s, Condemned(s, t)).Has(named)):
		// A remediation, or one resumed after its machine went: every
		// machine that came up and is broken is left to go on beside,
		// the interrupted run's replacement too — it is waited on as a
		// machine that went bad, for the recovery grace, not as a join
		// that may last the health timeout.
		t.Broken = machineNames(Broken(s, t, false).SortedByCreationTimestamp())
		return t, nil
	case broken.Len() == 0:
		return t, nil
	case r.ReplaceUnhealthy:
		t.Condemned = machineNames(broken.SortedByCreationTimestamp())
		return t, nil
	}
	return t, brokenRefusal(s, r, broken)
}

// brokenRefusal refuses a run that would meet machines that came up and went
// bad (Broken): no step could pass them, and the loop would pause the KCP
// only to wait on them and give up. It names the machine to replace first —
// the most broken, as KCP remediates (MostBroken): its removal is the one
// that keeps quorum — what is wrong with it, and the commands that move
// forward; or, when no machine keeps its components working, what to do by
// hand, since no command could add or remove a machine then.
func brokenRefusal(s *Snapshot, r Request, broken collections.Machines) error {
	m := MostBroken(s, broken)
	also := ""
	if broken.Len() > 1 {
		also = fmt.Sprintf(" (and %d more: %s)", broken.Len()-1, strings.Join(machineNames(broken.Difference(collections.FromMachines(m)).SortedByCreationTimestamp()), ", "))
	}
	if err := KeepsWorkingComponents(s, "replacing any of them", nil); err != nil {
		return exitcode.Unsafef("%v%s: the %s cannot start while a control-plane machine is broken, and %v; nothing was changed",
			Problem(s, m), also, r.Operation, err)
	}
	forward := replaceHint(s, m)
	if r.Operation == UpgradeOperation || r.Operation == ScaleOperation {
		forward += ", or re-run with --replace-unhealthy to replace it as this run's first step"
	}
	return exitcode.Unsafef("%v%s: the %s cannot start while a control-plane machine is broken; nothing was changed; %s",
		Problem(s, m), also, r.Operation, forward)
}

// replaceHint is the command that replaces a broken machine m.
func replaceHint(s *Snapshot, m *clusterv1.Machine) string {
	return fmt.Sprintf("replace it first: kubectl cp-rollout replace %s %s -n %s", s.CP.Cluster.Name, m.Name, s.CP.Cluster.Namespace)
}

// viaOf is the request's --via or, when there is none, on a topology cluster
// whose ClusterClass declares its Kubernetes versions, the versions the
// topology controller's own plan passes through (Cluster API's chained
// upgrades), measured from the oldest machine: each becomes a hop of its
// own. It stays out of the record, so a re-run finds the same operation.
func viaOf(ctx context.Context, topology Topology, s *Snapshot, r Request) ([]string, error) {
	lowest := s.CP.Machines.LowestVersion()
	from, errFrom := semver.ParseTolerant(lowest)
	to, errTo := semver.ParseTolerant(r.Version)
	if len(r.Via) > 0 || errFrom != nil || errTo != nil || !skipsMinor(from, to) || !s.CP.Cluster.Spec.Topology.IsDefined() {
		return r.Via, nil
	}
	plan, err := topology.ClassUpgradePlan(ctx, s.CP.Cluster, lowest, r.Version)
	if err != nil || len(plan) < 2 {
		return nil, err
	}
	return plan[:len(plan)-1], nil
}

// restartCutoff is a restart's RolloutAfter: its record's start when rec is
// a restart's (a resumed run keeps its cut-off), else now, the start of one
// about to be recorded. It is truncated to the second, the precision of a
// Machine's creationTimestamp: a replacement created within the cut-off's
// second must not count as created before it.
func restartCutoff(rec *record.Record, now time.Time) time.Time {
	if rec != nil && rec.Operation == string(RestartOperation) {
		now = rec.Started
	}
	return now.Truncate(time.Second)
}

// orLockedOut is refusal, a refusal before the lock, unless a live run holds
// the cluster's Lease: a run in flight explains the state better than the
// state does — its record is not this request's, its step in flight is why —
// and a runbook should retry later (exit 5), not call a human (exit 3). A
// Lease that cannot be read leaves the refusal as it is. It only chooses
// between two refusals, so the holder's renew time is trusted here: a dead
// run's Lease must not turn every refusal into a lock-out, and no Lease is
// taken or broken on it.
func orLockedOut(ctx context.Context, cl ClusterLock, refusal error) error {
	lease, err := cl.Lease(ctx)
	if err != nil || lease == nil || !runlock.Live(lease, time.Now()) {
		return refusal
	}
	return cl.LockedBy(lease)
}

// acquire takes the cluster's lock; a Lease another run holds is a step of
// its own while the tool watches whether its holder still renews it.
func (e *Engine) acquire(ctx context.Context) (lock *runlock.Lock, err error) {
	w := e.lockWait("taken over")
	lock, err = e.Lease.Acquire(ctx, record.Who(), w.watching)
	w.end(&err)
	return lock, err
}

// lockWait is the await-lock step of taking (Acquire) or breaking
// (BreakLock) a Lease that someone holds: it begins only if the call starts
// watching one, and then says what becomes of the Lease (then) if nobody
// renews it.
type lockWait struct {
	e    *Engine
	then string
	st   *step
}

func (e *Engine) lockWait(then string) *lockWait { return &lockWait{e: e, then: then} }

// watching is the call's waiting hook.
func (w *lockWait) watching(l *coordinationv1.Lease) {
	w.st = w.e.begin(AwaitLock, "", fmt.Sprintf("the lock is held by %s: watching whether it is still renewed; if it goes %s without, it is %s",
		runlock.Holder(l), runlock.DurationOf(l), w.then))
}

// end closes the step, if the call began one, with the call's error.
func (w *lockWait) end(err *error) {
	if w.st != nil {
		w.st.end(err)
	}
}

// cleanupContext is for what a stopping run still does on its way out
// (release the Lease, undo a pause it cannot keep): runlock.CleanupContext.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return runlock.CleanupContext(ctx)
}

// Run performs a prepared request with the KCP hand-over around the loop:
// take the cluster's Lease, pause the KubeadmControlPlane (and wait until KCP
// says it is paused), record the operation, set the target, converge, then
// hand back — remove the pause and record — and release the Lease. If the run
// stops early the KCP stays paused with the record, so a re-run resumes and
// status explains; the Lease is always released.
func (e *Engine) Run(ctx context.Context, p *Prepared) error {
	return e.holding(ctx, func(ctx context.Context, lock Lock) error {
		e.steps.total = p.Steps
		if p.HandBackOnly != "" {
			e.note(HandBack, p.HandBackOnly)
		}
		for i := p.FirstHop; i < len(p.Hops); i++ {
			if err := e.runHop(ctx, lock, p, i); err != nil {
				return err
			}
		}
		e.summarize()
		return nil
	})
}

// holding does work under the cluster's lock: it takes the Lease (watching
// one someone holds first), passes it to work, renews it while work runs,
// and releases it afterwards, whatever happened. Losing the lock cancels
// work's context with the loss as its cause, and the loss is then the error.
func (e *Engine) holding(ctx context.Context, work func(ctx context.Context, lock Lock) error) (err error) {
	lock, err := e.acquire(ctx)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	keepCtx, stopKeeping := context.WithCancel(runCtx)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		lock.Keep(keepCtx, func(lost error) { cancel(exitcode.New(exitcode.Locked, lost)) })
	}()
	defer func() {
		stopKeeping()
		<-kept // no renewal may race the release
		cleanupCtx, cancelCleanup := cleanupContext(ctx)
		defer cancelCleanup()
		if rerr := lock.Release(cleanupCtx); rerr != nil && err == nil {
			err = fmt.Errorf("releasing the lock: %w", rerr)
		}
		if cause := context.Cause(runCtx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause // the lost lock explains the stop better than its echo
		}
	}()
	return work(runCtx, lock)
}

// defaultWorkersWait bounds, between the hops of a topology cluster's
// upgrade, the wait for the workers when --wait-workers did not set one.
const defaultWorkersWait = 30 * time.Minute

// runHop is one complete rollout to p.Hops[i] under lock: take over (or
// resume), set the hop's version, converge, hand back. Before another hop,
// KCP must agree the hop is done and, on a topology cluster, the topology
// controller must have upgraded the workers: its webhook refuses the next
// version until then.
func (e *Engine) runHop(ctx context.Context, lock Lock, p *Prepared, i int) error {
	hop, last := p.Hops[i], i == len(p.Hops)-1
	if len(p.Hops) > 1 {
		e.steps.hop = progress.Hop{Index: i + 1, Of: len(p.Hops), Version: hop}
	}
	live, err := e.takeOver(ctx, lock, p.Request, hop)
	if err != nil {
		return err
	}
	t := p.Target
	if i != p.FirstHop {
		r := p.Request
		r.Version = hop
		t = TargetFor(live.KCP, r)
	}
	if t.Operation == RestartOperation {
		// The record now on the KubeadmControlPlane is this restart's, set
		// by the pause or left by an interrupted run: its start is the cut-off.
		rec, err := record.Of(live.KCP)
		if err != nil {
			return err
		}
		t.RolloutAfter = restartCutoff(rec, time.Now())
	}
	done, err := e.Converge(ctx, t, lock)
	if err != nil {
		return err
	}
	handedBack, err := e.handBack(ctx, done.CP)
	if err != nil {
		return err
	}
	settle := e.Timeouts.Handback
	if !last && settle == 0 {
		settle = DefaultTimeouts.Handback
	}
	if settle > 0 {
		if err := e.awaitSettled(ctx, handedBack, settle); err != nil {
			return err
		}
	}
	workers := e.Timeouts.Workers
	if !last && workers == 0 && live.Cluster.Spec.Topology.IsDefined() {
		workers = defaultWorkersWait
	}
	if workers > 0 && hop != "" {
		if err := e.awaitWorkers(ctx, hop, workers); err != nil {
			return err
		}
	}
	return nil
}

// takeOver pauses the KubeadmControlPlane with r's record (or resumes the
// run its record describes), sets the target — version, for one hop of r,
// and r's replicas — and prepares the rollout: pieces a killed run left
// behind go, and the workload cluster gets what kubeadm reads before
// machines of a new version join. It returns the control plane it left.
// lock is the run's, held.
func (e *Engine) takeOver(ctx context.Context, lock Lock, r Request, version string) (*kcpstate.ControlPlane, error) {
	// The hand-over decides on the Cluster and the KubeadmControlPlane alone,
	// read again now that this run holds the Lease.
	cluster, kcp, err := e.Reader.ReadKCP(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := record.Of(kcp)
	if err != nil {
		return nil, err
	}
	// A KubeadmControlPlane held by `pause` is taken over: this run's record
	// replaces the pause's, and the hand-back at the end is this run's.
	var held *record.Record
	if rec != nil && rec.Operation == string(PauseOperation) {
		held, rec = rec, nil
	}
	pausedNow := rec == nil
	if pausedNow {
		// The target is set on the KubeadmControlPlane the pause read last.
		mine := record.Record{Operation: string(r.Operation), Target: r.TargetString(), Who: record.Who(), Started: time.Now().UTC()}
		if kcp, err = e.pause(ctx, cluster, kcp, mine, held); err != nil {
			return nil, err
		}
	} else {
		e.note(Resume, "continuing "+rec.String())
		if kcp, err = e.awaitPausedAgain(ctx, kcp); err != nil {
			return nil, err
		}
	}
	if err := e.HandOver.SetTarget(ctx, cluster, kcp, version, r.Template, r.Replicas, e.Timeouts.topology()); err != nil {
		return nil, e.targetRejected(ctx, kcp, pausedNow, held, err)
	}
	live, err := e.Reader.Read(ctx)
	if err != nil {
		return nil, err
	}
	// A resumed run skipped the pause: make sure KCP is still paused before
	// touching what only a paused KCP leaves alone.
	if err := stillOurs(lock, NewSnapshot(live)); err != nil {
		return nil, err
	}
	e.removeOrphans(ctx, live)
	if _, err := e.giveBackCordoned(ctx, live); err != nil {
		return nil, err
	}
	if outdated, _ := live.MachinesNeedingRollout(); outdated.Len() > 0 {
		return live, e.prepareWorkload(ctx, live)
	}
	return live, nil
}

// targetRejected answers a failed SetTarget. An admission webhook or policy
// (CAPI's own, Kyverno, Gatekeeper, a ValidatingAdmissionPolicy) that
// rejects the target is bad input: nothing has changed yet, so a pause this
// run set is handed back at once and the server's reason is the one line the
// user sees (exit 2). Any other failure leaves the pause and record for a
// re-run, as every interruption does. A `pause` this run took over (held)
// is put back as it was, not handed back.
func (e *Engine) targetRejected(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, pausedNow bool, held *record.Record, err error) error {
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		return err
	}
	if pausedNow {
		cleanupCtx, cancel := cleanupContext(ctx)
		defer cancel()
		if held != nil {
			if rerr := e.HandOver.Restore(cleanupCtx, kcp, *held); rerr != nil {
				return fmt.Errorf("the API server rejected the target (%v), and restoring the pause of KubeadmControlPlane %s failed: %w", err, kcp.Name, rerr)
			}
			return exitcode.Usagef("the API server rejected the target: %v; KubeadmControlPlane %s stays paused by cp-rollout pause", err, kcp.Name)
		}
		if rerr := e.HandOver.Resume(cleanupCtx, kcp); rerr != nil {
			return fmt.Errorf("the API server rejected the target (%v), and handing KubeadmControlPlane %s back failed: %w", err, kcp.Name, rerr)
		}
		e.note(HandBack, "the target was rejected; KubeadmControlPlane "+kcp.Name+" unpaused, nothing changed")
	}
	return exitcode.Usagef("the API server rejected the target: %v", err)
}

// pause pauses the KubeadmControlPlane with rec and waits until KCP reports
// it paused; it returns the KubeadmControlPlane as last read. held is the
// record of a `pause` that rec takes over, nil for a KubeadmControlPlane
// that was not paused. A pause that is then found unsafe to keep (a
// remediation KCP started just before) is handed back at once — or, when it
// was held by `pause`, left held as it was.
func (e *Engine) pause(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, rec record.Record, held *record.Record) (_ *controlplanev1.KubeadmControlPlane, err error) {
	what := "pausing KubeadmControlPlane " + kcp.Name
	if held != nil {
		what = "taking over KubeadmControlPlane " + kcp.Name + ", held by cp-rollout pause (" + held.Detail() + ")"
	}
	st := e.begin(Pause, "", what)
	defer st.end(&err)
	kcp, err = e.HandOver.Pause(ctx, cluster, kcp, rec, e.Timeouts.pause(), takeoverCheck)
	if err != nil {
		if kcp != nil {
			cleanupCtx, cancelCleanup := cleanupContext(ctx)
			defer cancelCleanup()
			if held != nil {
				_ = e.HandOver.Restore(cleanupCtx, kcp, *held)
			} else {
				_ = e.HandOver.Resume(cleanupCtx, kcp)
			}
		}
		return nil, err
	}
	st.done("KCP reports Paused")
	return kcp, nil
}

// prepareWorkload updates kubeadm's configuration and RBAC on the workload
// cluster for the target version, as KCP does before it rolls machines.
func (e *Engine) prepareWorkload(ctx context.Context, live *kcpstate.ControlPlane) (err error) {
	st := e.begin(PrepareWorkload, "", "updating kubeadm-config and kubeadm's RBAC for "+live.KCP.Spec.Version)
	defer st.end(&err)
	if err := e.Workload.PrepareRollout(ctx, live.KCP, etcd.Managed(live.KCP)); err != nil {
		return err
	}
	st.done("kubeadm-config and RBAC ready for " + live.KCP.Spec.Version)
	return nil
}

// handBack removes the pause and moves the record to the last operation:
// KCP is in charge again. live is the control plane Converge has just read
// and found done. It returns the machines it handed back.
func (e *Engine) handBack(ctx context.Context, live *kcpstate.ControlPlane) (machines []string, err error) {
	st := e.begin(HandBack, "", "unpausing KubeadmControlPlane "+live.KCP.Name)
	defer st.end(&err)
	if err := e.HandOver.Complete(ctx, live.KCP); err != nil {
		return nil, err
	}
	st.done("KubeadmControlPlane " + live.KCP.Name + " unpaused; KCP is in charge again")
	return live.Machines.Names(), nil
}

// removeOrphans deletes what a killed run left between creating a
// replacement's InfraMachine and KubeadmConfig and creating its Machine. A
// leftover costs resources, not safety: when it cannot be looked for or
// deleted (RBAC may not allow listing the infrastructure kind), the run says
// so and goes on.
func (e *Engine) removeOrphans(ctx context.Context, cp *kcpstate.ControlPlane) {
	orphans, err := e.Machines.Orphans(ctx, cp)
	if err != nil {
		e.report(RemoveOrphan, "", progress.Failed, "could not look for pieces an interrupted run left behind: "+err.Error()+"; going on", time.Now())
		return
	}
	for _, obj := range orphans {
		_ = e.removeOrphan(ctx, obj)
	}
}

func (e *Engine) removeOrphan(ctx context.Context, obj client.Object) (err error) {
	what := obj.GetObjectKind().GroupVersionKind().Kind + " " + obj.GetName()
	st := e.begin(RemoveOrphan, obj.GetName(), what+" has no Machine: an interrupted run created it; deleting it")
	defer st.end(&err)
	if err := e.Machines.DeleteOrphan(ctx, obj); err != nil {
		return fmt.Errorf("%w; going on", err)
	}
	st.done(what + " deleted")
	return nil
}
