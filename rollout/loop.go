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
	MoveLeader(ctx context.Context, nodes []etcd.Node, to uint64) error
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
	Timeouts Timeouts

	// Total is the number of machine steps the run expects, for [k/n].
	Total int
	step  int
	times []progress.StepTime
}

// Read takes one live snapshot: management cluster first, then the workload
// nodes of its machines, then etcd through those nodes.
func (e *Engine) Read(ctx context.Context) (*Snapshot, error) {
	cp, err := e.ControlPlane.Read(ctx)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{Now: time.Now(), CP: cp, EtcdManaged: etcd.Managed(cp.KCP) && e.Etcd != nil}
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
			return nil, fmt.Errorf("workload cluster %s: etcd: %w", e.Workload.Name, err)
		}
	}
	return s, nil
}

// EtcdNodes lists the nodes etcd members can be reached on.
func EtcdNodes(s *Snapshot) []etcd.Node {
	var nodes []etcd.Node
	for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
		if n, ok := s.Nodes[nodeName(m)]; ok && n.Found {
			nodes = append(nodes, etcd.Node{Name: n.Name, IP: n.InternalIP})
		}
	}
	return nodes
}

// Converge runs the loop until the control plane matches t: read, decide,
// act once or wait, repeat.
func (e *Engine) Converge(ctx context.Context, t Target) error {
	start := time.Now()
	var (
		waiting   = map[string]time.Time{} // wait key → when it began
		lastWait  string
		readErr   error
		readSince time.Time
		joined    string // the machine whose join was last awaited
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
			if readErr == nil {
				readSince = time.Now()
				e.report("read", "", progress.Waiting, err.Error(), readSince)
			}
			readErr = err
			if time.Since(readSince) > e.Timeouts.Health {
				return exitcode.Timeoutf("could not read the control plane for %s: %v", e.Timeouts.Health, readErr)
			}
			e.Changes.Wait(ctx, etcdPoll)
			continue
		}
		readErr = nil

		step := Next(ctx, s, t)
		if joined != "" && (step.Action != AwaitJoin || step.Machine.Name != joined) {
			e.finish("wait-ready", joined, "healthy", waiting["join/"+joined])
			joined = ""
			if e.Timeouts.Settle > 0 {
				e.report("settle", "", progress.Started, "waiting "+e.Timeouts.Settle.String(), time.Now())
				if err := sleep(ctx, e.Timeouts.Settle); err != nil {
					return err
				}
				continue // the world may have moved meanwhile
			}
		}

		switch step.Action {
		case Done:
			if e.Reporter != nil {
				e.Reporter.Summary(progress.Event{Time: time.Now(), Cluster: e.ControlPlane.Cluster, Namespace: e.ControlPlane.Namespace,
					Step: e.step, Total: max(e.Total, e.step), ElapsedMs: time.Since(start).Milliseconds()}, e.times)
			}
			return nil
		case Refuse:
			e.report("refuse", machineName(step.Machine), progress.Failed, step.Reason, time.Now())
			return step.Err
		case AwaitJoin, AwaitDeletion:
			key, kind := waitKey(step)
			since, ok := waiting[key]
			if !ok {
				since = time.Now()
				waiting[key] = since
			}
			if step.Action == AwaitJoin {
				joined = step.Machine.Name
				if _, ok := waiting["join/"+joined]; !ok {
					waiting["join/"+joined] = since
				}
			}
			limit := e.limit(kind)
			if time.Since(since) > limit {
				return exitcode.Timeoutf("timed out after %s %s; last seen: %s", limit, describeWait(step), step.Reason)
			}
			if msg := key + step.Reason; msg != lastWait {
				lastWait = msg
				e.report(string(step.Action), step.Machine.Name, progress.Waiting, step.Reason, since)
			}
			e.Changes.Wait(ctx, etcdPoll)
		default:
			lastWait = ""
			if err := e.execute(ctx, s, step); err != nil {
				return err
			}
		}
	}
}

// wait kinds, resolved to durations by limit.
const (
	provisionWait = "provision"
	healthWait    = "health"
	deleteWait    = "delete"
)

func waitKey(step Step) (key, kind string) {
	m := step.Machine
	switch {
	case step.Action == AwaitDeletion:
		return "delete/" + m.Name, deleteWait
	case nodeName(m) == "":
		return "provision/" + m.Name, provisionWait
	default:
		return "health/" + m.Name, healthWait
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

func describeWait(step Step) string {
	if step.Action == AwaitDeletion {
		return "waiting for machine " + step.Machine.Name + " to be deleted"
	}
	if nodeName(step.Machine) == "" {
		return "waiting for machine " + step.Machine.Name + " to get a node"
	}
	return "waiting for machine " + step.Machine.Name + " to be healthy"
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
	member, hasMember := MemberOf(s, m)
	if !IsLast(s, m) && s.EtcdManaged && hasMember {
		if err := Healthy(s, m); err != nil {
			return fmt.Errorf("not removing the etcd member of machine %s: %w", m.Name, err)
		}
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
			if errors.Is(err, etcd.ErrIsLeader) {
				// Leadership came back by election since it was moved; the next
				// pass reads again and moves it once more.
				e.report("remove-member", m.Name, progress.Waiting, "its member leads again; moving leadership once more", began)
				return nil
			}
			var qe *etcd.QuorumError
			if errors.As(err, &qe) {
				return exitcode.New(exitcode.Unsafe, err)
			}
			return fmt.Errorf("removing etcd member %s of machine %s: %w", member, m.Name, err)
		}
		e.finish("remove-member", m.Name, "etcd member "+member.String()+" removed", began)
	}
	if err := e.ControlPlane.RemoveCleanupHook(ctx, m); err != nil {
		return err
	}
	e.report("release", m.Name, progress.Done, "pre-terminate hook removed; the Machine controller finishes the deletion", began)
	return nil
}

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
		err := e.Etcd.MoveLeader(ctx, EtcdNodes(s), to.ID)
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
