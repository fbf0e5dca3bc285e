package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// Etcd is what the loop needs of etcd; *etcd.Client provides it.
type Etcd interface {
	Members(ctx context.Context, nodes []etcd.Node) ([]etcd.Member, error)
	ForwardLeadership(ctx context.Context, nodes []etcd.Node, from, to uint64) error
	RemoveMember(ctx context.Context, nodes []etcd.Node, id uint64) error
}

// Timeouts bound each kind of wait.
type Timeouts struct {
	// Provision bounds a new machine's wait for its node.
	Provision time.Duration
	// Health bounds a new machine's wait, once it has a node, for its node,
	// static pods and etcd member to be healthy; and how long the tool keeps
	// retrying when it cannot read the clusters.
	Health time.Duration
	// Delete bounds a deleting machine's wait, for its pre-terminate stage and
	// then until it is gone.
	Delete time.Duration
	// Settle is a pause after each new machine turns healthy, before the next
	// step.
	Settle time.Duration
}

// DefaultTimeouts are the flags' defaults.
var DefaultTimeouts = Timeouts{Provision: 20 * time.Minute, Health: 10 * time.Minute, Delete: 20 * time.Minute}

// etcdPoll is how often etcd is read while waiting on it: no watch reports
// membership or member health.
const etcdPoll = time.Second

// Engine runs the blocking loop against one control plane.
type Engine struct {
	ControlPlane *controlplane.Client
	Workload     *workload.Client
	// Etcd is nil when etcd is external.
	Etcd     Etcd
	Changes  *Changes
	Reporter progress.Reporter
	// Lock, when set, is the run's Lease: every step first checks it is held.
	Lock     *controlplane.Lock
	Timeouts Timeouts

	// Total is the number of machine steps the run expects, for [k/n].
	Total int
	step  int
	times []progress.StepTime

	leaderRetries int
}

// Read takes one live snapshot: management cluster first, then the workload
// nodes of its machines, then etcd through those nodes.
func (e *Engine) Read(ctx context.Context) (*Snapshot, error) {
	cp, err := e.ControlPlane.Read(ctx)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{Now: time.Now(), CP: cp, EtcdManaged: etcd.Managed(cp.KCP)}
	if s.EtcdManaged && e.Etcd == nil {
		return nil, fmt.Errorf("KubeadmControlPlane %s manages etcd but no etcd client is configured", cp.KCP.Name)
	}
	var names []string
	for _, m := range cp.Machines.SortedByCreationTimestamp() {
		if n := nodeName(m); n != "" {
			names = append(names, n)
		}
	}
	s.Nodes, err = e.Workload.Nodes(ctx, names, components(s))
	if err != nil {
		return nil, err
	}
	if s.EtcdManaged && len(names) > 0 {
		s.Members, err = e.Etcd.Members(ctx, EtcdNodes(s))
		if err != nil {
			err = fmt.Errorf("workload cluster %s: etcd: %w", e.Workload.Name, err)
			// Members whose certificates the cluster's etcd CA did not sign
			// cannot be trusted, and no retry mends that: refuse at once.
			var untrusted *etcd.UntrustedError
			if errors.As(err, &untrusted) {
				return nil, exitcode.New(exitcode.Unsafe, err)
			}
			return nil, err
		}
	}
	return s, nil
}

// EtcdNodes lists the nodes etcd members can be reached on, in the order to
// try them: newest machines first and deleting ones last, because the oldest
// machine is usually the one leaving and its member the first to go.
func EtcdNodes(s *Snapshot) []etcd.Node {
	var nodes, leaving []etcd.Node
	sorted := s.CP.Machines.SortedByCreationTimestamp()
	for i := len(sorted) - 1; i >= 0; i-- {
		m := sorted[i]
		n, ok := s.Nodes[nodeName(m)]
		if !ok || !n.Found {
			continue
		}
		if m.DeletionTimestamp.IsZero() {
			nodes = append(nodes, etcd.Node{Name: n.Name, IP: n.InternalIP})
		} else {
			leaving = append(leaving, etcd.Node{Name: n.Name, IP: n.InternalIP})
		}
	}
	return append(nodes, leaving...)
}

// Converge runs the loop until the control plane matches t: read, decide,
// act once or wait, repeat.
func (e *Engine) Converge(ctx context.Context, t Target) error {
	start := time.Now()
	var (
		w         wait   // the wait in progress, if any
		joined    string // the machine whose join is being awaited
		joinSince time.Time
	)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		s, err := e.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if exitcode.Of(err) == exitcode.Unsafe {
				return err
			}
			// Unreachable API servers or etcd: retry on every change or second,
			// up to the health timeout.
			if w.begin("read", err.Error()) {
				e.report("read", "", progress.Waiting, err.Error(), w.since)
			}
			if time.Since(w.since) > e.Timeouts.Health {
				return exitcode.Timeoutf("could not read the control plane for %s: %v", e.Timeouts.Health, err)
			}
			e.Changes.Wait(ctx, etcdPoll)
			continue
		}
		if err := e.stillOurs(s); err != nil {
			return err
		}

		step := Next(ctx, s, t)
		if joined != "" && (step.Action != AwaitJoin || step.Machine.Name != joined) {
			e.finish("wait-ready", joined, "healthy", joinSince)
			joined = ""
			if e.Timeouts.Settle > 0 {
				e.report("settle", "", progress.Started, "waiting "+e.Timeouts.Settle.String(), time.Now())
				if err := sleep(ctx, e.Timeouts.Settle); err != nil {
					return err
				}
				continue // the world may have moved meanwhile
			}
		}

		switch {
		case step.Action == Done:
			if e.Reporter != nil {
				e.Reporter.Summary(progress.Event{Time: time.Now(), Cluster: e.ControlPlane.Cluster, Namespace: e.ControlPlane.Namespace,
					Step: e.step, Total: max(e.Total, e.step), ElapsedMs: time.Since(start).Milliseconds()}, e.times)
			}
			return nil
		case step.Action == Refuse && step.Transient:
			if w.begin("unhealthy/"+step.Machine.Name, step.Reason) {
				e.report("unhealthy", step.Machine.Name, progress.Waiting, step.Reason+"; waiting up to "+unhealthyGrace.String()+" for it to recover", w.since)
			}
			if time.Since(w.since) > unhealthyGrace {
				e.report("refuse", step.Machine.Name, progress.Failed, step.Reason, w.since)
				return step.Err
			}
			e.Changes.Wait(ctx, etcdPoll)
		case step.Action == Refuse:
			e.report("refuse", machineName(step.Machine), progress.Failed, step.Reason, time.Now())
			return step.Err
		case step.Action == AwaitJoin || step.Action == AwaitDeletion:
			key, kind, what := awaited(step)
			if w.begin(key, step.Reason) {
				e.report(string(step.Action), step.Machine.Name, progress.Waiting, step.Reason, w.since)
			}
			if step.Action == AwaitJoin && joined != step.Machine.Name {
				joined, joinSince = step.Machine.Name, w.since
			}
			if limit := e.limit(kind); time.Since(w.since) > limit {
				return exitcode.Timeoutf("timed out after %s %s; last seen: %s", limit, what, step.Reason)
			}
			e.Changes.Wait(ctx, etcdPoll)
		default:
			w = wait{}
			if err := e.execute(ctx, s, step); err != nil {
				return err
			}
		}
	}
}

// unhealthyGrace is how long the loop waits for a machine that was healthy
// and went bad to recover before it refuses to go on: long enough for a
// failed probe or a restarting static pod, short enough not to hide a fault.
const unhealthyGrace = time.Minute

// wait tracks the one wait in progress: its timeout runs from when its key
// (what is awaited, for which machine) first appeared, and restarts when the
// key changes.
type wait struct {
	key, reason string
	since       time.Time
}

// begin records key as awaited and reports whether there is something new to
// tell: a new wait, or a new reason within it.
func (w *wait) begin(key, reason string) bool {
	if w.key != key {
		*w = wait{key: key, reason: reason, since: time.Now()}
		return true
	}
	if w.reason != reason {
		w.reason = reason
		return true
	}
	return false
}

// stillOurs stops the run when the control plane is no longer in its hands:
// the lock is lost or about to be, or someone removed the pause or our record
// from the KubeadmControlPlane — acting on would race KCP itself.
func (e *Engine) stillOurs(s *Snapshot) error {
	if e.Lock == nil {
		return nil
	}
	if err := e.Lock.Held(); err != nil {
		return err
	}
	_, paused := s.CP.KCP.Annotations[clusterv1.PausedAnnotation]
	_, recorded := s.CP.KCP.Annotations[controlplane.RecordAnnotation]
	if !paused || !recorded {
		return exitcode.Unsafef("KubeadmControlPlane %s was unpaused or lost this tool's record during the run (someone ran handback, or a GitOps sync reverted it): stopping so as not to race KCP",
			s.CP.KCP.Name)
	}
	return nil
}

// wait kinds, resolved to durations by limit.
const (
	provisionWait = "provision"
	healthWait    = "health"
	deleteWait    = "delete"
)

// awaited names a wait step: its key (what, for which machine), its kind,
// and how a timeout describes it.
func awaited(step Step) (key, kind, what string) {
	m := step.Machine
	switch {
	case step.Action == AwaitDeletion:
		return "delete/" + m.Name, deleteWait, "waiting for machine " + m.Name + " to be deleted"
	case nodeName(m) == "":
		return "provision/" + m.Name, provisionWait, "waiting for machine " + m.Name + " to get a node"
	default:
		return "health/" + m.Name, healthWait, "waiting for machine " + m.Name + " to be healthy"
	}
}

func (e *Engine) limit(kind string) time.Duration {
	switch kind {
	case provisionWait:
		return e.Timeouts.Provision
	case deleteWait:
		return e.Timeouts.Delete
	}
	return e.Timeouts.Health
}

// execute performs one acting step.
func (e *Engine) execute(ctx context.Context, s *Snapshot, step Step) error {
	switch step.Action {
	case Create:
		e.step++
		began := time.Now()
		e.report("create", "", progress.Started, step.Reason, began)
		m, err := e.ControlPlane.CreateReplacement(ctx, s.CP, step.FailureDomain)
		if err != nil {
			e.report("create", "", progress.Failed, err.Error(), began)
			return err
		}
		e.finish("create", m.Name, "created at "+m.Spec.Version, began)
		return nil

	case Delete:
		m := step.Machine
		if e.step == 0 || e.stepDeleted() {
			e.step++ // surge 0 and scale-down start a step with the deletion
		}
		began := time.Now()
		e.report("delete", m.Name, progress.Started, step.Reason, began)
		// The hook makes the Machine controller stop before the infrastructure
		// goes, so the member is removed while the machine still runs.
		if err := e.ControlPlane.EnsureCleanupHook(ctx, m); err != nil {
			return err
		}
		if s.EtcdManaged && Leads(s, m) {
			if err := e.moveLeader(ctx, s, m); err != nil {
				return err
			}
		}
		if err := e.ControlPlane.Delete(ctx, m); err != nil {
			return fmt.Errorf("deleting machine %s: %w", m.Name, err)
		}
		e.finish("delete", m.Name, "deletion started", began)
		return nil

	case ServeCleanupHook:
		return e.serveCleanupHook(ctx, s, step.Machine)
	}
	return fmt.Errorf("no executor for step %q", step.Action)
}

// stepDeleted reports whether the current step already deleted a machine, so
// the next deletion begins a new step.
func (e *Engine) stepDeleted() bool {
	for i := len(e.times) - 1; i >= 0; i-- {
		switch e.times[i].Action {
		case "delete":
			return true
		case "create":
			return false
		}
	}
	return false
}

// serveCleanupHook does what KCP's reconcilePreTerminateHook does for a
// deleting machine that waits on kcp-cleanup: for the last machine, a machine
// without a node, an unnamed member or external etcd, just release it;
// otherwise check the control plane that remains, move leadership off its
// member if needed, remove the member, then release it.
func (e *Engine) serveCleanupHook(ctx context.Context, s *Snapshot, m *clusterv1.Machine) error {
	began := time.Now()
	if !IsLast(s, m) {
		// What stays must be healthy, whatever the etcd mode (KCP checks the
		// remaining control-plane components before releasing any machine).
		if err := Healthy(s, m); err != nil {
			return fmt.Errorf("not releasing machine %s: %w", m.Name, err)
		}
	}
	member, hasMember := MemberOf(s, m)
	if !IsLast(s, m) && s.EtcdManaged && hasMember {
		if err := SafeToRemove(s, m); err != nil {
			return err
		}
		if member.Leader {
			if err := e.moveLeader(ctx, s, m); err != nil {
				return err
			}
		}
		e.report("remove-member", m.Name, progress.Started, "removing etcd member "+member.String(), began)
		if err := e.Etcd.RemoveMember(ctx, EtcdNodes(s), member.ID); err != nil {
			if errors.Is(err, etcd.ErrIsLeader) && e.leaderRetries < maxLeaderRetries {
				// Leadership came back by election since it was moved; the next
				// pass reads again and moves it once more.
				e.leaderRetries++
				e.report("remove-member", m.Name, progress.Waiting, "its member leads again; moving leadership once more", began)
				return nil
			}
			var qe *etcd.QuorumError
			if errors.As(err, &qe) {
				return exitcode.New(exitcode.Unsafe, err)
			}
			return fmt.Errorf("removing etcd member %s of machine %s: %w", member, m.Name, err)
		}
		e.leaderRetries = 0
		e.finish("remove-member", m.Name, "etcd member "+member.String()+" removed", began)
	}
	if err := e.ControlPlane.RemoveCleanupHook(ctx, m); err != nil {
		return err
	}
	e.report("release", m.Name, progress.Done, "pre-terminate hook removed; the Machine controller finishes the deletion", began)
	return nil
}

// maxLeaderRetries bounds how often a member that keeps winning elections back
// is chased before the run gives up on removing it.
const maxLeaderRetries = 5

// moveLeader moves etcd leadership off m's member to the best candidate, and
// on failure to the next.
func (e *Engine) moveLeader(ctx context.Context, s *Snapshot, m *clusterv1.Machine) error {
	began := time.Now()
	from, _ := MemberOf(s, m)
	candidates := LeaderCandidates(s, m)
	if len(candidates) == 0 {
		return exitcode.Unsafef("etcd member %s of machine %s leads and no healthy voting member can take over", from, m.Name)
	}
	var errs []string
	for _, to := range candidates {
		e.report("move-leader", m.Name, progress.Started, fmt.Sprintf("moving etcd leadership from %s to %s", from, to), began)
		// ForwardLeadership moves it only if from still leads, as KCP does.
		err := e.Etcd.ForwardLeadership(ctx, EtcdNodes(s), from.ID, to.ID)
		if err == nil {
			e.finish("move-leader", m.Name, "etcd leader is now "+to.String(), began)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		errs = append(errs, fmt.Sprintf("%s: %v", to, err))
		e.report("move-leader", m.Name, progress.Failed, fmt.Sprintf("to %s: %v; trying the next candidate", to, err), began)
	}
	return fmt.Errorf("could not move etcd leadership off %s (machine %s): %s", from, m.Name, strings.Join(errs, "; "))
}

func (e *Engine) report(action, machine string, phase progress.Phase, msg string, since time.Time) {
	if e.Reporter == nil {
		return
	}
	e.Reporter.Report(progress.Event{
		Time: time.Now(), Cluster: e.ControlPlane.Cluster, Namespace: e.ControlPlane.Namespace,
		Step: e.step, Total: max(e.Total, e.step), Action: action, Machine: machine, Phase: phase,
		Message: msg, ElapsedMs: time.Since(since).Milliseconds(),
	})
}

// finish reports an action done and records its duration for the summary.
func (e *Engine) finish(action, machine, msg string, since time.Time) {
	e.times = append(e.times, progress.StepTime{Action: action, Machine: machine, Duration: time.Since(since)})
	e.report(action, machine, progress.Done, msg, since)
}

func machineName(m *clusterv1.Machine) string {
	if m == nil {
		return ""
	}
	return m.Name
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
