package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// Converge runs the blocking loop until the control plane matches t, one
// machine at a time: create the replacement, wait for it to join, forward etcd
// leadership and delete the old machine, remove its etcd member and release
// it, wait until it is gone. Each turn asks Next for the one step the guards
// allow, and does it or waits for it. A turn may start on the watches' caches,
// but only a wait is taken on them: any other step is decided again on a live
// read first. lock is the run's hold on the cluster, which every read checks
// (stillOurs); nil holds nothing, and nothing is then ours to lose.
func (e *Engine) Converge(ctx context.Context, t Target, lock Lock) (*Snapshot, error) {
	return (&loop{Engine: e, lock: lock}).converge(ctx, t)
}

// loop is one Converge: the lock it runs under and what it remembers from
// one turn to the next, its own account of its steps — never a snapshot.
// Its methods name it e, as the Engine's do: it is the engine, converging.
type loop struct {
	*Engine
	lock Lock
	// synced is the reason of the sync step just taken, until another step
	// is taken (syncMachines).
	synced string
	// leaderRetries counts how often the member being removed won
	// leadership back (dropMember).
	leaderRetries int
	// gated names the machines that passed the gates in this loop
	// (passGates), so that none is gated twice.
	gated map[string]bool
}

func (e *loop) converge(ctx context.Context, t Target) (*Snapshot, error) {
	// ended is the live snapshot the last step, a wait, ended on; prev the
	// one the last turn decided on, whose etcd read a cached one may take.
	var ended, prev *Snapshot
	for {
		s, err := e.takeOrRead(ctx, ended, prev)
		if err != nil {
			return nil, err
		}
		next := Next(ctx, s, t)
		if s.cached && !waits(next) {
			if s, err = e.catchUp(ctx, s); err != nil {
				return nil, err
			}
			next = Next(ctx, s, t)
		}
		if s.cached && !waits(next) {
			if s, err = e.readOursLive(ctx); err != nil {
				return nil, err
			}
			next = Next(ctx, s, t)
		}
		prev, ended = s, nil
		switch next.Action {
		case Done:
			if next.Warning != "" {
				e.note(Unhealthy, next.Warning)
			}
			return s, nil
		case Refuse:
			ended, err = e.refuse(ctx, t, s, next)
		case Create:
			err = e.createReplacement(ctx, s, next)
		case AwaitJoin:
			ended, err = e.awaitJoin(ctx, t, s, next)
		case Delete:
			err = e.deleteVictim(ctx, t, s, next)
		case ServeCleanupHook:
			err = e.serveCleanupHook(ctx, s, next.Machine)
		case AwaitDeletion:
			ended, err = e.awaitGone(ctx, t, s, next)
		case RemoveStaleMember:
			err = e.removeStaleMember(ctx, s, next)
		case SyncMachines:
			err = e.syncMachines(ctx, s, next)
		default:
			err = fmt.Errorf("no executor for step %q", next.Action)
		}
		if next.Action != SyncMachines {
			e.synced = ""
		}
		if err != nil {
			return nil, err
		}
	}
}

// waits is true for the steps that only wait: the ones the loop may take on
// the watches' caches.
func waits(next Step) bool {
	return next.Action == AwaitJoin || next.Action == AwaitDeletion || next.Action == Refuse && next.Transient
}

// takeOrRead is ended, the live snapshot a wait has just ended on, or else
// one from the caches read after prev: the turn after a step mostly starts a
// wait, and a wait needs no live read. A wait ends when a live read shows
// something else to do; reading again before doing it would only add a round
// trip to every reaction. The first turn (no prev) reads live: it follows no
// step of the loop's, so its next step is as likely to act as to wait, and
// a step that acts needs the live read anyway.
func (e *loop) takeOrRead(ctx context.Context, ended, prev *Snapshot) (*Snapshot, error) {
	switch {
	case ended != nil:
		return ended, nil
	case prev == nil:
		return e.readOursLive(ctx)
	}
	return e.readOurs(ctx, true, prev)
}

// catchUpLimit bounds how long the turn after a step waits for the caches to
// show the step's own writes.
const catchUpLimit = 500 * time.Millisecond

// catchUp is the turn after a step, when the caches showed another step to
// take: most often they have not yet seen the writes of the step just taken
// (a deletion, a released hook), and the watches report those within
// moments. It reads the caches again at their next change, up to
// catchUpLimit, instead of reading live at once; the loop still reads live
// before any step that is not a wait.
func (e *loop) catchUp(ctx context.Context, s *Snapshot) (*Snapshot, error) {
	if !e.waitForChange(ctx, catchUpLimit) {
		return s, nil
	}
	return e.readOurs(ctx, true, s)
}

// readOursLive takes a live snapshot of the control plane while it is still
// ours (readOurs).
func (e *loop) readOursLive(ctx context.Context) (*Snapshot, error) {
	return e.readOurs(ctx, false, nil)
}

// readOurs takes a snapshot, from the watches' caches or live, of the
// control plane while it is still in this run's hands. A cached read (the
// caches, with etcd read live unless prev, the snapshot before it, read it
// less than etcdPoll ago; live without caches) that fails, or
// finds the control plane no longer ours, is taken again live: the caches may
// not show the hand-over's writes yet, and the live read finds and reports
// what stops the reads, as every read did before there were caches. Clusters
// that cannot be read (an API server restarting, etcd unreachable) are read
// again on every change or second, up to the health timeout; an untrusted
// etcd is refused at once.
func (e *loop) readOurs(ctx context.Context, cached bool, prev *Snapshot) (*Snapshot, error) {
	var w wait
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		var s *Snapshot
		var err error
		if cached && e.Cache != nil {
			s, err = e.snapshot(ctx, e.Cache.ControlPlane, e.Cache.Workload, true, prev)
		} else {
			s, err = e.Read(ctx)
		}
		if err == nil {
			err = stillOurs(e.lock, s)
			if err == nil {
				return s, nil
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if cached && e.Cache != nil {
			cached = false
			continue
		}
		if s != nil {
			return nil, err
		}
		if exitcode.Of(err) == exitcode.Unsafe {
			return nil, err
		}
		if w.observe(waitRead, err.Error()) {
			e.report(Read, "", progress.Waiting, err.Error(), w.since)
		}
		if err := w.expired(e.Timeouts, Step{}, err); err != nil {
			return nil, err
		}
		e.waitForChange(ctx, etcdPoll)
	}
}

// stillOurs stops the run when the control plane is no longer in its hands:
// lock is lost or about to be, or the KubeadmControlPlane lost the pause or
// our record. Without a lock nothing is ours to lose.
func stillOurs(lock Lock, s *Snapshot) error {
	if lock == nil {
		return nil
	}
	if err := lock.Held(); err != nil {
		return err
	}
	return StillOurs(s)
}

// refuse stops the run on a state no step may be taken in. A machine that was
// healthy and went bad may recover by itself (a failed probe, a restarting
// static pod): that is waited on for the Recovery timeout first.
func (e *loop) refuse(ctx context.Context, t Target, s *Snapshot, next Step) (ended *Snapshot, err error) {
	if !next.Transient {
		st := e.begin(Refuse, machineName(next.Machine), next.Reason)
		defer st.end(&err)
		return nil, next.Err
	}
	st := e.begin(Unhealthy, next.Machine.Name, fmt.Sprintf("%s; waiting up to %s for it to recover", next.Reason, e.Timeouts.recovery()))
	defer st.end(&err)
	if ended, err = e.await(ctx, t, st, s, next, func(Step) waitKind { return waitRecovery }); err != nil {
		return nil, err
	}
	st.done("machine " + next.Machine.Name + " recovered")
	return ended, nil
}

// createReplacement creates one machine as KCP would, in the failure domain
// Next chose.
func (e *Engine) createReplacement(ctx context.Context, s *Snapshot, next Step) (err error) {
	if err := e.beginMachineStep(ctx, false); err != nil {
		return err
	}
	st := e.begin(Create, "", next.Reason)
	defer st.end(&err)
	m, err := e.Machines.CreateReplacement(ctx, s.CP, next.FailureDomain)
	if err != nil {
		return err
	}
	e.steps.made(false)
	st.machine = m.Name
	// The new machine carries the remediation on (KCP's desired state copies
	// it into its remediation-for annotation); as KCP's createMachine does,
	// the KubeadmControlPlane's record of it goes.
	if _, ok := s.CP.KCP.Annotations[controlplanev1.RemediationInProgressAnnotation]; ok {
		if err := e.HandOver.SetRemediation(ctx, s.CP.KCP, ""); err != nil {
			return err
		}
	}
	st.done("created at " + m.Spec.Version)
	return nil
}

// awaitJoin waits until a new machine has its node and is healthy — node,
// static pods, a named and promoted etcd member — then passes it through the
// gates between machines (gates.go): its DaemonSets, the operator's gate,
// the soak. It returns the live snapshot the wait ended on when the wait
// ended on anything but the machine healthy, or nil after the gates (it is
// stale by then, and the next step is decided on a live read).
func (e *loop) awaitJoin(ctx context.Context, t Target, s *Snapshot, next Step) (*Snapshot, error) {
	ended, err := e.awaitHealthy(ctx, t, s, next)
	if err != nil {
		return nil, err
	}
	joined, ok := joinedHealthy(ended, next.Machine)
	if !ok {
		return ended, nil
	}
	return nil, e.passGates(ctx, ended, joined)
}

// gateFirst passes through the gates, before a deletion, the newest machine
// of the operation that this loop has not gated: the machine whose join a
// run before this one watched, and whose gates stopped that run or were
// never reached (it was killed). It reports whether it gated one: the
// deletion is then decided again on a live read.
func (e *loop) gateFirst(ctx context.Context, s *Snapshot) (bool, error) {
	m, ok := ungated(s, e.gated)
	if !ok {
		return false, nil
	}
	return true, e.passGates(ctx, s, m)
}

func (e *loop) awaitHealthy(ctx context.Context, t Target, s *Snapshot, next Step) (ended *Snapshot, err error) {
	m := next.Machine
	st := e.begin(AwaitJoin, m.Name, "waiting for machine "+m.Name+" to join and be healthy")
	defer st.end(&err)
	if ended, err = e.await(ctx, t, st, s, next, joinWait); err != nil {
		return nil, err
	}
	st.done("healthy")
	return ended, nil
}

// deleteVictim deletes one machine: it gets the kcp-cleanup hook first, so the
// Machine controller stops before the infrastructure goes and its member is
// removed while the machine still runs; its node is drained, and etcd
// leadership leaves its member, before the deletion starts.
//
// A drain that evicted pods may have waited a minute for them: the deletion is
// then decided again on a live read, as every step is, and leadership is
// forwarded from what that read shows. A deletion the guards no longer allow
// is not made (the node is given back) and the loop decides afresh; the
// machine step it began stays in progress for the deletion decided next.
func (e *loop) deleteVictim(ctx context.Context, t Target, s *Snapshot, next Step) (err error) {
	if gated, err := e.gateFirst(ctx, s); gated || err != nil {
		return err
	}
	m := next.Machine
	if err := e.beginMachineStep(ctx, true); err != nil {
		return err
	}
	if err := e.Machines.EnsureCleanupHook(ctx, m); err != nil {
		return err
	}
	drained, err := e.drain(ctx, m)
	gone := false
	if drained.Cordoned {
		defer func() {
			if !gone {
				e.uncordon(ctx, m)
			}
		}()
	}
	if err != nil {
		return err
	}
	if drained.Cordoned || len(drained.Evicted) > 0 {
		if s, err = e.readOursLive(ctx); err != nil {
			return err
		}
		if again := Next(ctx, s, t); again.Action != Delete || again.Machine.Name != m.Name {
			return nil // not this machine after all
		}
	}
	if leader, ok := MemberOf(s, m); s.EtcdManaged && ok && leader.Leader {
		if err := e.forwardLeadership(ctx, s, m, leader); err != nil {
			return err
		}
	}
	if err := e.delete(ctx, m, next.Reason); err != nil {
		return err
	}
	e.steps.made(true)
	gone = true
	return e.recordRemediation(ctx, t, s, m)
}

// recordRemediation keeps KCP's bookkeeping for a machine just deleted to be
// replaced (RemediationRecord) on the KubeadmControlPlane.
func (e *Engine) recordRemediation(ctx context.Context, t Target, s *Snapshot, m *clusterv1.Machine) error {
	r, ok := RemediationRecord(s, t, m)
	if !ok {
		return nil
	}
	return e.HandOver.SetRemediation(ctx, s.CP.KCP, r.Marshal())
}

func (e *Engine) delete(ctx context.Context, m *clusterv1.Machine, why string) (err error) {
	st := e.begin(Delete, m.Name, why)
	defer st.end(&err)
	if err := e.Machines.Delete(ctx, m); err != nil {
		return fmt.Errorf("deleting machine %s: %w", m.Name, err)
	}
	st.done("deletion started")
	return nil
}

// serveCleanupHook does what KCP's reconcilePreTerminateHook does for a
// deleting machine that waits on kcp-cleanup: for the last machine, a machine
// without a node, an unnamed member or external etcd, just release it;
// otherwise move leadership off its member if needed, remove the member, then
// release it.
//
// What stays must keep quorum and a machine with working components first,
// whatever the etcd mode: Next answers ServeCleanupHook only when it does
// (SafeToRelease), and waits on it otherwise.
func (e *loop) serveCleanupHook(ctx context.Context, s *Snapshot, m *clusterv1.Machine) error {
	member, ok, err := OwnedMember(s, m)
	if err != nil {
		return err
	}
	if ok && !IsLast(s, m) && s.EtcdManaged {
		removed, err := e.removeMember(ctx, s, m, member)
		if err != nil || !removed {
			return err
		}
	}
	return e.release(ctx, m)
}

// maxLeaderRetries bounds how often a member that keeps winning elections back
// is chased before the run gives up on removing it.
const maxLeaderRetries = 5

// removeMember removes m's etcd member once quorum allows, leadership first.
// It reports false, with no error, when the member won leadership back by
// election in between (dropMember).
func (e *loop) removeMember(ctx context.Context, s *Snapshot, m *clusterv1.Machine, member etcd.Member) (removed bool, err error) {
	if err := SafeToRemove(s, m); err != nil {
		return false, err
	}
	if member.Leader {
		if err := e.forwardLeadership(ctx, s, m, member); err != nil {
			return false, err
		}
	}
	st := e.begin(RemoveMember, m.Name, "removing etcd member "+member.String())
	defer st.end(&err)
	return e.dropMember(ctx, s, st, member, " of machine "+m.Name)
}

// dropMember is the removal itself, within step st, for a machine's member and
// a member no machine owns alike: etcd.RemoveMember lists the members afresh,
// checks quorum again and waits out etcd's five-second rule. It reports false,
// with no error, when the member leads again (elected in between): the loop
// reads again and moves leadership once more, a few times at most. whose
// follows the member's name in an error.
func (e *loop) dropMember(ctx context.Context, s *Snapshot, st *step, member etcd.Member, whose string) (removed bool, err error) {
	held, err := e.Etcd.RemoveMember(ctx, EtcdNodes(s), member.ID)
	st.held = held
	if err != nil {
		if errors.Is(err, etcd.ErrIsLeader) && e.leaderRetries < maxLeaderRetries {
			e.leaderRetries++
			st.done("its member leads again; moving leadership once more")
			return false, nil
		}
		var qe *etcd.QuorumError
		if errors.As(err, &qe) {
			return false, exitcode.New(exitcode.Unsafe, err)
		}
		return false, fmt.Errorf("removing etcd member %s%s: %w", member, whose, err)
	}
	e.leaderRetries = 0
	msg := "etcd member " + member.String() + " removed"
	if held > 0 {
		msg += fmt.Sprintf("; etcd held the change %.1fs, until the members had been connected for five seconds", held.Seconds())
	}
	st.done(msg)
	return true, nil
}

// removeStaleMember removes an etcd member no machine owns, as KCP's
// reconcileEtcdMembers does, the way a machine's member is removed
// (dropMember). Such a member cannot be reached, so it is never healthy, but
// the others may still follow it: leadership moves off it first. A member
// elected leader in between is moved off on the next turn.
func (e *loop) removeStaleMember(ctx context.Context, s *Snapshot, next Step) (err error) {
	member := next.Member
	if member.Leader {
		if err := e.forwardLeadership(ctx, s, nil, member); err != nil {
			return err
		}
	}
	st := e.begin(RemoveStaleMember, "", next.Reason)
	defer st.end(&err)
	_, err = e.dropMember(ctx, s, st, member, ", which no machine owns")
	return err
}

// syncMachines pushes the KubeadmControlPlane's in-place-mutable fields to
// the machines Next found out of sync, as KCP's syncMachines would were it not
// paused. Next decides it on a live read, as every step that writes: the same
// drift found again right after a sync means something undoes the writes (a
// webhook, another controller), and syncing again would only loop.
func (e *loop) syncMachines(ctx context.Context, s *Snapshot, next Step) (err error) {
	st := e.begin(SyncMachines, machineName(next.Machine), next.Reason)
	defer st.end(&err)
	if next.Reason == e.synced {
		return fmt.Errorf("the machines are still out of sync after they were synced (something reverts them): %s", next.Reason)
	}
	machines, _ := OutOfSync(s)
	var names []string
	for _, m := range machines {
		if err := e.Machines.SyncMachine(ctx, s.CP, m); err != nil {
			return err
		}
		names = append(names, m.Name)
	}
	e.synced = next.Reason
	st.done("synced " + strings.Join(names, ", "))
	return nil
}

// release removes the kcp-cleanup hook: the Machine controller finishes the
// deletion.
func (e *Engine) release(ctx context.Context, m *clusterv1.Machine) (err error) {
	st := e.begin(Release, m.Name, "removing the pre-terminate hook")
	defer st.end(&err)
	if err := e.Machines.RemoveCleanupHook(ctx, m); err != nil {
		return err
	}
	st.done("pre-terminate hook removed; the Machine controller finishes the deletion")
	return nil
}

// awaitGone waits while a machine deletes: until its pre-terminate stage,
// when the loop serves the hook, or until it is gone.
func (e *loop) awaitGone(ctx context.Context, t Target, s *Snapshot, next Step) (ended *Snapshot, err error) {
	m := next.Machine
	st := e.begin(AwaitDeletion, m.Name, "waiting for machine "+m.Name+" to be deleted")
	defer st.end(&err)
	if ended, err = e.await(ctx, t, st, s, next, func(Step) waitKind { return waitDeletion }); err != nil {
		return nil, err
	}
	st.done("machine " + m.Name + " reached its next deletion stage")
	return ended, nil
}

// forwardLeadership moves etcd leadership off from — m's member, or with m
// nil a member no machine owns — to the best candidate, and on failure to the
// next: each attempt is a step of its own.
func (e *Engine) forwardLeadership(ctx context.Context, s *Snapshot, m *clusterv1.Machine, from etcd.Member) error {
	candidates := LeaderCandidates(s, m)
	if len(candidates) == 0 {
		return exitcode.Unsafef("etcd member %s%s leads and no healthy voting member can take over", from, ofMachine(m))
	}
	var tried []string
	for _, to := range candidates {
		err := e.moveLeader(ctx, s, m, from, to)
		if err == nil || ctx.Err() != nil {
			return err
		}
		tried = append(tried, fmt.Sprintf("%s: %v", to, errors.Unwrap(err)))
	}
	return fmt.Errorf("could not move etcd leadership off %s%s: %s", from, ofMachine(m), strings.Join(tried, "; "))
}

// ofMachine names m after a member, for messages; nothing for no machine.
func ofMachine(m *clusterv1.Machine) string {
	if m == nil {
		return ""
	}
	return " (machine " + m.Name + ")"
}

// moveLeader is one attempt of forwardLeadership; its error says that the
// next candidate is tried, and wraps the cause.
func (e *Engine) moveLeader(ctx context.Context, s *Snapshot, m *clusterv1.Machine, from, to etcd.Member) (err error) {
	st := e.begin(MoveLeader, machineName(m), fmt.Sprintf("moving etcd leadership from %s to %s", from, to))
	defer st.end(&err)
	// ForwardLeadership moves it only if from still leads, as KCP does.
	if err := e.Etcd.ForwardLeadership(ctx, EtcdNodes(s), from.ID, to.ID); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("to %s: %w; trying the next candidate", to, err)
	}
	st.done("etcd leader is now " + to.String())
	return nil
}
