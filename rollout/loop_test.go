package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// scripted is a control plane that the loop drives in memory. It answers reads
// from a world() snapshot, applies the engine's writes to it and records them,
// and each time the loop waits it moves the world on as the Machine controller,
// a provider and kubeadm would: a new machine gets a node with an unstarted
// member, the member starts as a learner, then it is promoted; a deleting
// machine reaches its pre-terminate stage and, once released, is gone.
//
// The embedded interfaces stay nil: a method the loop must not call panics.
// It plays every role of the ControlPlane, one simulated world; a test that
// fakes one role in another way sets that role on the engine in its stead.
type scripted struct {
	ControlPlane
	Workload
	Etcd

	mu    sync.Mutex
	world *Snapshot
	calls []string
	// trace is calls with every read and wait in between.
	trace []string

	// stuck names a machine and the stage it never leaves: "provision",
	// "health" or "delete".
	stuck map[string]string
	// readErrs reads fail before one succeeds; -1 fails them all.
	readErrs int
	// moveFails ForwardLeadership calls fail.
	moveFails int
	// leadsAgain RemoveMember calls find the member elected leader again.
	leadsAgain int
	// held is how long RemoveMember says etcd held each removal back.
	held time.Duration
	// onWait, when set, changes the world at each wait (n counts them from 1).
	onWait func(w *Snapshot, n int)
	waits  int
	added  int

	// lease is the cluster's Lease, if any.
	lease *coordinationv1.Lease
	// kubeProxyBehind is what KubeProxyBehind says for its next
	// kubeProxyReads calls; "" after them.
	kubeProxyBehind string
	kubeProxyReads  int
	// coreDNSBehind is what CoreDNSBehind says for its next coreDNSReads
	// calls; "" after them.
	coreDNSBehind string
	coreDNSReads  int
	// daemonSetsUnready, when set, is what DaemonSetsUnready says for a
	// node; it says nothing is unready otherwise.
	daemonSetsUnready func(node string, peers []string) ([]workload.UnreadyDaemonSet, error)
	// coreDNSRefused, when set, is a move of CoreDNS KCP refuses.
	coreDNSRefused *workload.CoreDNSRefusedError
	// drainRules are the MachineDrainRules DrainRules names.
	drainRules []string
	// cordoned are the nodes Cordoned names: an earlier run's drain left them.
	cordoned []string
	// onDrain, when set, changes the world while a node drains.
	onDrain func(w *Snapshot, node string)
	// deleteFails Delete calls fail.
	deleteFails int
	// syncReverted makes every SyncMachine undone at once.
	syncReverted bool
	// watched makes Wait report a change only when the machines or nodes
	// changed, as the watches would; otherwise every Wait reports one.
	watched bool

	// lagged is the world before the latest Wait: what laggingCache shows.
	lagged *Snapshot

	// What an invariant monitor would see, sampled after every change.
	maxMachines, minHealthyVoters int
}

func newScripted(w *Snapshot) *scripted {
	f := &scripted{world: w, stuck: map[string]string{}, minHealthyVoters: 1 << 30}
	f.sample()
	return f
}

func (f *scripted) record(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	f.trace = append(f.trace, f.calls[len(f.calls)-1])
}

func (f *scripted) sample() {
	f.maxMachines = max(f.maxMachines, f.world.CP.Machines.Len())
	healthy := 0
	for _, m := range f.world.Members {
		if m.HealthyVoter() {
			healthy++
		}
	}
	f.minHealthyVoters = min(f.minHealthyVoters, healthy)
}

// seen is what laggingCache shows.
func (f *scripted) seen() *Snapshot {
	if f.lagged == nil {
		return f.world
	}
	return f.lagged
}

func (f *scripted) machine(name string) *clusterv1.Machine {
	m, ok := f.world.CP.Machines[name]
	if !ok {
		panic(fmt.Sprintf("no machine %s in %v after %v", name, f.world.CP.Machines.Names(), f.calls))
	}
	return m.DeepCopy() // snapshots already handed out keep what they saw
}

func (f *scripted) Key() types.NamespacedName {
	return types.NamespacedName{Namespace: "default", Name: "demo"}
}

func (f *scripted) Read(context.Context) (*kcpstate.ControlPlane, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.readErrs != 0 {
		f.readErrs--
		return nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
	}
	f.trace = append(f.trace, "read")
	return f.world.clone().CP, nil
}

func (f *scripted) ReadKCP(ctx context.Context) (*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane, error) {
	cp, err := f.Read(ctx)
	if err != nil {
		return nil, nil, err
	}
	return cp.Cluster, cp.KCP, nil
}

// KubeadmConfigsUnread: the scripted identity reads everything.
func (f *scripted) KubeadmConfigsUnread() bool { return false }

func (f *scripted) Lease(context.Context) (*coordinationv1.Lease, error) { return f.lease, nil }

func (f *scripted) LockedBy(lease *coordinationv1.Lease) error {
	return exitcode.Lockedf("cluster default/demo is locked by %s", runlock.Holder(lease))
}

func (f *scripted) Nodes(_ context.Context, names, _ []string) (map[string]workload.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	nodes := map[string]workload.Node{}
	for _, n := range names {
		nodes[n] = f.world.Nodes[n]
	}
	return nodes, nil
}

func (f *scripted) NodeByProviderID(_ context.Context, providerID string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name, ok := strings.CutPrefix(providerID, "sim://"); ok {
		if _, exists := f.world.Nodes[name]; exists {
			return name, nil
		}
	}
	return "", nil
}

func (f *scripted) DrainRules(context.Context) ([]string, error) { return f.drainRules, nil }

func (f *scripted) Drain(_ context.Context, node string, _ time.Duration) (workload.Drained, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("drain %s", node)
	if f.onDrain != nil {
		f.onDrain(f.world, node)
	}
	return workload.Drained{Cordoned: true}, nil
}

func (f *scripted) Uncordon(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("uncordon %s", node)
	return nil
}

func (f *scripted) Cordoned(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cordoned, nil
}

func (f *scripted) KubeProxyBehind(context.Context, *controlplanev1.KubeadmControlPlane) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.trace = append(f.trace, "kube-proxy")
	if f.kubeProxyReads == 0 {
		return "", nil
	}
	f.kubeProxyReads--
	return f.kubeProxyBehind, nil
}

func (f *scripted) CoreDNSBehind(context.Context, *controlplanev1.KubeadmControlPlane) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.trace = append(f.trace, "coredns")
	if f.coreDNSRefused != nil {
		return "", f.coreDNSRefused
	}
	if f.coreDNSReads == 0 {
		return "", nil
	}
	f.coreDNSReads--
	return f.coreDNSBehind, nil
}

func (f *scripted) DaemonSetsUnready(_ context.Context, node string, peers []string) ([]workload.UnreadyDaemonSet, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.trace = append(f.trace, "daemonsets "+node)
	if f.daemonSetsUnready == nil {
		return nil, nil
	}
	return f.daemonSetsUnready(node, peers)
}

func (f *scripted) Members(context.Context, []etcd.Node) ([]etcd.Member, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]etcd.Member{}, f.world.Members...), nil
}

func (f *scripted) CreateReplacement(_ context.Context, cp *kcpstate.ControlPlane, failureDomain string) (*clusterv1.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.added++
	name := fmt.Sprintf("r%d", f.added)
	f.record("create %s", name)
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
		CreationTimestamp: metav1.NewTime(f.world.CP.Machines.Newest().CreationTimestamp.Add(time.Minute)),
		Annotations:       map[string]string{controlplanev1.PreTerminateHookCleanupAnnotation: ""}}}
	m.Spec.Version, m.Spec.FailureDomain = cp.KCP.Spec.Version, failureDomain
	f.world.CP.Machines.Insert(m)
	f.world.CP.InfraResources[name] = &unstructured.Unstructured{}
	f.world.CP.KubeadmConfigs[name] = &bootstrapv1.KubeadmConfig{}
	f.sample()
	return m, nil
}

func (f *scripted) EnsureCleanupHook(_ context.Context, m *clusterv1.Machine) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("hook %s", m.Name)
	live := f.machine(m.Name)
	live.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation] = ""
	f.world.CP.Machines.Insert(live)
	return nil
}

func (f *scripted) Delete(_ context.Context, m *clusterv1.Machine) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("delete %s", m.Name)
	if f.deleteFails > 0 {
		f.deleteFails--
		return apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
	}
	live := f.machine(m.Name)
	live.DeletionTimestamp = ptr.To(metav1.Now())
	live.Status.Conditions = []metav1.Condition{{Type: clusterv1.MachineDeletingCondition, Status: metav1.ConditionTrue, Reason: "DrainingNode"}}
	f.world.CP.Machines.Insert(live)
	return nil
}

func (f *scripted) RemoveCleanupHook(_ context.Context, m *clusterv1.Machine) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("release %s", m.Name)
	live := f.machine(m.Name)
	delete(live.Annotations, controlplanev1.PreTerminateHookCleanupAnnotation)
	f.world.CP.Machines.Insert(live)
	return nil
}

// SyncMachine gives m the KCP's deletion timeouts, unless syncReverted: then
// something undoes the write at once.
func (f *scripted) SyncMachine(_ context.Context, cp *kcpstate.ControlPlane, m *clusterv1.Machine) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m.DeletionTimestamp != nil {
		f.record("sync %s (deleting)", m.Name)
	} else {
		f.record("sync %s", m.Name)
	}
	if f.syncReverted {
		return nil
	}
	live := f.machine(m.Name)
	d := cp.KCP.Spec.MachineTemplate.Spec.Deletion
	live.Spec.Deletion = clusterv1.MachineDeletionSpec{NodeDrainTimeoutSeconds: d.NodeDrainTimeoutSeconds,
		NodeVolumeDetachTimeoutSeconds: d.NodeVolumeDetachTimeoutSeconds, NodeDeletionTimeoutSeconds: d.NodeDeletionTimeoutSeconds}
	f.world.CP.Machines.Insert(live)
	return nil
}

func (f *scripted) memberIndex(id uint64) int {
	for i, m := range f.world.Members {
		if m.ID == id {
			return i
		}
	}
	return -1
}

func (f *scripted) ForwardLeadership(_ context.Context, _ []etcd.Node, from, to uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("move-leader %s->%s", f.world.Members[f.memberIndex(from)].Name, f.world.Members[f.memberIndex(to)].Name)
	if f.moveFails > 0 {
		f.moveFails--
		return errors.New("etcdserver: request timed out")
	}
	for i := range f.world.Members {
		f.world.Members[i].Leader = f.world.Members[i].ID == to
	}
	return nil
}

func (f *scripted) RemoveMember(_ context.Context, _ []etcd.Node, id uint64) (time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.memberIndex(id)
	if f.leadsAgain > 0 {
		f.leadsAgain--
		for j := range f.world.Members {
			f.world.Members[j].Leader = j == i
		}
		return 0, etcd.ErrIsLeader
	}
	name := f.world.Members[i].Name
	if name == "" {
		name = fmt.Sprintf("%x", id) // kubeadm's learner before it starts
	}
	f.record("remove-member %s", name)
	f.world.Members = append(f.world.Members[:i], f.world.Members[i+1:]...)
	f.sample()
	return f.held, nil
}

// Wait moves the world on by one stage; it sleeps a moment so that waits
// with millisecond limits expire without spinning.
func (f *scripted) Wait(ctx context.Context, _ time.Duration) bool {
	f.mu.Lock()
	f.trace = append(f.trace, "wait")
	f.waits++
	f.lagged = f.world.clone()
	before := f.watchedState()
	f.advance()
	if f.onWait != nil {
		f.onWait(f.world, f.waits)
	}
	f.sample()
	changed := !f.watched || f.watchedState() != before
	f.mu.Unlock()
	_ = sleep(ctx, time.Millisecond)
	return changed
}

// watchedState is what the watches follow: machines and nodes, not etcd.
func (f *scripted) watchedState() string {
	var b strings.Builder
	for _, m := range f.world.CP.Machines.SortedByCreationTimestamp() {
		fmt.Fprintf(&b, "%s %s %v %v %v;", m.Name, nodeName(m), m.DeletionTimestamp != nil, m.Annotations, m.Status.Conditions)
	}
	fmt.Fprint(&b, f.world.Nodes)
	return b.String()
}

func (f *scripted) advance() {
	for _, m := range f.world.CP.Machines.SortedByCreationTimestamp() {
		switch {
		case !m.DeletionTimestamp.IsZero():
			f.advanceDeletion(m)
		case nodeName(m) == "":
			if f.stuck[m.Name] == "provision" {
				continue
			}
			live := f.machine(m.Name)
			live.Status.NodeRef = clusterv1.MachineNodeReference{Name: "node-" + m.Name}
			f.world.CP.Machines.Insert(live)
			pods := map[string]bool{}
			for _, c := range components(f.world) {
				pods[c] = true
			}
			f.world.Nodes[live.Status.NodeRef.Name] = workload.Node{Name: live.Status.NodeRef.Name, Found: true, Ready: true, Pods: pods}
			f.world.Members = append(f.world.Members, etcd.Member{ID: uint64(100 + f.added), Learner: true, Healthy: true})
		default:
			f.advanceJoin(m)
		}
	}
}

// advanceJoin starts, then promotes, the member of a machine with a node.
func (f *scripted) advanceJoin(m *clusterv1.Machine) {
	for i, member := range f.world.Members {
		switch {
		case !member.Started() && f.stuck[m.Name] != "health":
			if _, named := MemberOf(f.world, m); !named {
				f.world.Members[i].Name = nodeName(m)
			}
		case member.Name == nodeName(m) && member.Learner && f.stuck[m.Name] != "health":
			f.world.Members[i].Learner = false
		}
	}
}

// advanceDeletion brings a deleting machine to its pre-terminate stage and,
// once its hook is gone, away with its node.
func (f *scripted) advanceDeletion(m *clusterv1.Machine) {
	if f.stuck[m.Name] == "delete" {
		return
	}
	if !HasCleanupHook(m) {
		delete(f.world.Nodes, nodeName(m))
		delete(f.world.CP.Machines, m.Name)
		delete(f.world.CP.MachinesNotUpToDate, m.Name)
		return
	}
	live := f.machine(m.Name)
	live.Status.Conditions = []metav1.Condition{{Type: clusterv1.MachineDeletingCondition, Status: metav1.ConditionTrue,
		Reason: clusterv1.MachineDeletingWaitingForPreTerminateHookReason}}
	f.world.CP.Machines.Insert(live)
}

// events records what the engine reports.
type events struct {
	mu  sync.Mutex
	all []progress.Event
}

func (r *events) Report(e progress.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, e)
}
func (r *events) Summary(progress.Event, []progress.StepTime) {}
func (r *events) Stop()                                       {}

// paired checks that every done or failed event closes the step that started
// last, under the same action: steps never overlap.
func (r *events) paired(t *testing.T) {
	t.Helper()
	open := ""
	for _, e := range r.all {
		switch e.Phase {
		case progress.Started:
			if open != "" {
				t.Fatalf("%s started while %s is open", e.Action, open)
			}
			open = e.Action
		case progress.Done, progress.Failed:
			if e.Action != open {
				t.Fatalf("%s %s closes no started step (open: %q)", e.Action, e.Phase, open)
			}
			open = ""
		}
	}
	if open != "" {
		t.Fatalf("step %s never ended", open)
	}
}

func (r *events) find(action string, phase progress.Phase, says string) bool {
	for _, e := range r.all {
		if e.Action == action && e.Phase == phase && strings.Contains(e.Message, says) {
			return true
		}
	}
	return false
}

// of is the events of action in phase, in order.
func (r *events) of(action string, phase progress.Phase) []progress.Event {
	var out []progress.Event
	for _, e := range r.all {
		if e.Action == action && e.Phase == phase {
			out = append(out, e)
		}
	}
	return out
}

type heldLock struct{ err error }

func (l *heldLock) Held() error { return l.err }

// fast are limits for tests: long enough never to expire unless a test
// makes a machine stuck and shortens the one it tests.
var fast = Timeouts{Provision: time.Minute, Health: time.Minute, Delete: time.Minute, Recovery: time.Minute}

func engineFor(f *scripted, timeouts Timeouts) (*Engine, *events) {
	ev := &events{}
	return (&Engine{Workload: f, Etcd: f, Changes: f, Reporter: ev, Timeouts: timeouts}).Plays(f), ev
}

// pausedByUs marks the world's KCP as this tool's, as Run leaves it.
func pausedByUs(s *Snapshot) *Snapshot {
	s.CP.KCP.Annotations = map[string]string{clusterv1.PausedAnnotation: "true", record.Annotation: `{"operation":"upgrade"}`}
	return s
}

func converge(t *testing.T, e *Engine, target Target) error {
	t.Helper()
	return convergeUnder(t, e, target, nil)
}

// convergeUnder is converge under lock, as a run converges.
func convergeUnder(t *testing.T, e *Engine, target Target, lock Lock) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := e.Converge(ctx, target, lock)
	return err
}

var surge1 = Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}

func TestConvergeReplacesOneMachineAtATime(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
	e, ev := engineFor(f, fast)
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"create r1", "hook m0", "drain n0", "move-leader n0->node-r1", "delete m0", "remove-member n0", "release m0",
		"create r2", "hook m1", "drain n1", "delete m1", "remove-member n1", "release m1",
		"create r3", "hook m2", "drain n2", "delete m2", "remove-member n2", "release m2",
	}
	if got := strings.Join(f.calls, ", "); got != strings.Join(want, ", ") {
		t.Fatalf("calls:\n got %s\nwant %s", got, strings.Join(want, ", "))
	}
	if f.maxMachines != 4 || f.minHealthyVoters < 3 {
		t.Fatalf("at most %d machines and at least %d healthy voters; want 4 and 3", f.maxMachines, f.minHealthyVoters)
	}
	ev.paired(t)
	if e.steps.machine != 3 {
		t.Fatalf("%d machine steps counted, want 3", e.steps.machine)
	}
	var sum time.Duration
	for _, st := range e.steps.times {
		sum += st.Duration
	}
	if wall := e.steps.last.Sub(e.steps.began); sum != wall {
		t.Fatalf("summary adds up to %s, the steps took %s", sum, wall)
	}
}

// TestConvergeRemovesAStaleLearner: a run that meets an etcd member no
// machine owns — the learner of a replacement that failed mid-join and was
// deleted — removes it as a step of its own before it creates anything (the
// quorum projection, and etcd's single learner slot, would refuse the join),
// and then converges.
func TestConvergeRemovesAStaleLearner(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(withMembers(world(machineSpec{outdated: true, leader: true}, old, old), staleLearner))
	e, ev := engineFor(f, fast)
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"remove-member 63",
		"create r1", "hook m0", "drain n0", "move-leader n0->node-r1", "delete m0", "remove-member n0", "release m0",
		"create r2", "hook m1", "drain n1", "delete m1", "remove-member n1", "release m1",
		"create r3", "hook m2", "drain n2", "delete m2", "remove-member n2", "release m2",
	}
	if got := strings.Join(f.calls, ", "); got != strings.Join(want, ", ") {
		t.Fatalf("calls:\n got %s\nwant %s", got, strings.Join(want, ", "))
	}
	if !ev.find(string(RemoveStaleMember), progress.Done, "(not started) [63] removed") {
		t.Fatalf("no done %s event naming the member: %v", RemoveStaleMember, ev.all)
	}
	if f.minHealthyVoters < 3 {
		t.Fatalf("at least %d healthy voters; want 3", f.minHealthyVoters)
	}
	ev.paired(t)
}

// TestConvergeMovesLeadershipOffAStaleMember: the other members may still
// follow a member no machine owns; leadership leaves it before it goes.
func TestConvergeMovesLeadershipOffAStaleMember(t *testing.T) {
	stale := staleDown
	stale.Leader = true
	f := newScripted(pausedByUs(withMembers(world(machineSpec{}, machineSpec{}, machineSpec{}), stale)))
	e, ev := engineFor(f, fast)
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(f.calls, ", "), "move-leader gone-node->n2, remove-member gone-node"; got != want {
		t.Fatalf("calls %s, want %s", got, want)
	}
	ev.paired(t)
}

// TestConvergeActsOnTheReadThatEndedAWait: a wait ends on a live read that
// shows the next step; the loop takes that step on it, without reading the
// clusters a second time in between (a round trip added to every reaction).
func TestConvergeActsOnTheReadThatEndedAWait(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
	e, _ := engineFor(f, fast)
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(f.trace); i++ {
		if f.trace[i] == "read" && f.trace[i-1] == "read" {
			t.Fatalf("read twice in a row with nothing in between: %v", f.trace[max(0, i-6):i+1])
		}
	}
	if !slices.Contains(f.trace, "wait") {
		t.Fatalf("the scenario never waited: %v", f.trace)
	}
}

func TestConvergeDeleteFirst(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
	e, ev := engineFor(f, fast)
	if err := converge(t, e, Target{Operation: "upgrade", Replicas: 3, MaxSurge: 0}); err != nil {
		t.Fatal(err)
	}
	if f.calls[0] != "hook m0" || f.maxMachines != 3 || f.minHealthyVoters < 2 {
		t.Fatalf("first call %q, at most %d machines, at least %d healthy voters; want hook m0, 3, 2", f.calls[0], f.maxMachines, f.minHealthyVoters)
	}
	if e.steps.machine != 3 {
		t.Fatalf("%d machine steps counted, want 3 (a replacement is a deletion and a creation)", e.steps.machine)
	}
	ev.paired(t)
}

func TestConvergeWaitLimits(t *testing.T) {
	short := 30 * time.Millisecond
	old, cur := machineSpec{outdated: true}, machineSpec{}
	cases := []struct {
		name    string
		world   *Snapshot
		script  func(*scripted)
		limits  func(*Timeouts)
		code    int
		says    string
		waiting string // the action whose waiting event must have been reported
	}{
		{name: "a replacement that never gets a node", world: world(old, old, old),
			script: func(f *scripted) { f.stuck["r1"] = "provision" }, limits: func(t *Timeouts) { t.Provision = short },
			code: exitcode.Timeout, says: "machine r1 to get a node", waiting: "await-join"},
		{name: "a replacement whose member is never promoted", world: world(old, old, old),
			script: func(f *scripted) { f.stuck["r1"] = "health" }, limits: func(t *Timeouts) { t.Health = short },
			code: exitcode.Timeout, says: "machine r1 to be healthy", waiting: "await-join"},
		{name: "a machine that never finishes deleting", world: world(cur, cur, cur, machineSpec{outdated: true, deleting: true}),
			script: func(f *scripted) { f.stuck["m3"] = "delete" }, limits: func(t *Timeouts) { t.Delete = short },
			code: exitcode.Timeout, says: "machine m3 to be deleted", waiting: "await-deletion"},
		{name: "clusters that cannot be read", world: world(old, old, old),
			script: func(f *scripted) { f.readErrs = -1 }, limits: func(t *Timeouts) { t.Health = short },
			code: exitcode.Timeout, says: "could not read the control plane", waiting: "read"},
		{name: "a healthy machine that went bad and stays bad", world: world(old, machineSpec{unhealthy: true}, old),
			limits: func(t *Timeouts) { t.Recovery = short },
			code:   exitcode.Unsafe, says: "etcd member n1", waiting: "unhealthy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newScripted(tc.world)
			if tc.script != nil {
				tc.script(f)
			}
			limits := fast
			tc.limits(&limits)
			e, ev := engineFor(f, limits)
			err := converge(t, e, surge1)
			if exitcode.Of(err) != tc.code || !strings.Contains(fmt.Sprint(err), tc.says) {
				t.Fatalf("got exit %d %v; want exit %d saying %q", exitcode.Of(err), err, tc.code, tc.says)
			}
			if !ev.find(tc.waiting, progress.Waiting, "") {
				t.Fatalf("no %s waiting event before the limit", tc.waiting)
			}
			ev.paired(t)
		})
	}
}

func TestConvergeRecovers(t *testing.T) {
	t.Run("from clusters that could not be read for a while", func(t *testing.T) {
		f := newScripted(world(machineSpec{outdated: true}, machineSpec{outdated: true}, machineSpec{outdated: true}))
		f.readErrs = 3
		e, ev := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		if !ev.find("read", progress.Waiting, "connection refused") {
			t.Fatal("the failed reads were not reported")
		}
	})
	t.Run("from a machine that went bad within the grace", func(t *testing.T) {
		f := newScripted(world(machineSpec{outdated: true}, machineSpec{unhealthy: true}, machineSpec{outdated: true}))
		f.onWait = func(w *Snapshot, n int) {
			if n == 3 {
				w.Members[1].Healthy = true
			}
		}
		e, ev := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		if !ev.find("unhealthy", progress.Done, "recovered") {
			t.Fatal("no event says the machine recovered")
		}
		ev.paired(t)
	})
}

func TestConvergeDrain(t *testing.T) {
	old := machineSpec{outdated: true}
	drains := func(f *scripted) (n int) {
		for _, c := range f.calls {
			if strings.HasPrefix(c, "drain ") {
				n++
			}
		}
		return n
	}
	t.Run("drains each node before its machine is deleted", func(t *testing.T) {
		f := newScripted(world(old, old, old))
		e, _ := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		for i, c := range f.calls {
			if node, ok := strings.CutPrefix(c, "drain n"); ok && (i+1 >= len(f.calls) || f.calls[i+1] != "delete m"+node) {
				t.Fatalf("%s is not followed by its machine's deletion: %v", c, f.calls)
			}
		}
		if drains(f) != 3 {
			t.Fatalf("%d drains for 3 replaced machines: %v", drains(f), f.calls)
		}
	})
	t.Run("MachineDrainRules leave the drain to Cluster API", func(t *testing.T) {
		f := newScripted(world(old, old, old))
		f.drainRules = []string{"drain-last"}
		e, _ := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		if drains(f) != 0 {
			t.Fatalf("drained despite MachineDrainRules: %v", f.calls)
		}
	})
	t.Run("a machine that opts out or waits on a pre-drain hook is not drained", func(t *testing.T) {
		w := world(old, old, old)
		w.CP.Machines["m0"].Annotations[clusterv1.ExcludeNodeDrainingAnnotation] = ""
		w.CP.Machines["m1"].Annotations[clusterv1.PreDrainDeleteHookAnnotationPrefix+"/backup"] = ""
		f := newScripted(w)
		e, _ := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		if got := drains(f); got != 1 || !slices.Contains(f.calls, "drain n2") {
			t.Fatalf("want only n2 drained: %v", f.calls)
		}
	})
	t.Run("a deletion the guards no longer allow after the drain is not made", func(t *testing.T) {
		// While n0 drains, someone marks m1 for deletion: KCP's order now
		// takes m1 first, and the decision on a live read follows it.
		f := newScripted(world(old, old, old))
		f.onDrain = func(w *Snapshot, node string) {
			if m1, ok := w.CP.Machines["m1"]; ok && node == "n0" {
				m1 = m1.DeepCopy() // snapshots already handed out keep what they saw
				m1.Annotations = map[string]string{clusterv1.DeleteMachineAnnotation: ""}
				w.CP.Machines.Insert(m1)
			}
		}
		e, _ := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		calls := strings.Join(f.calls, ", ")
		if !strings.Contains(calls, "drain n0, uncordon n0, hook m1, drain n1, delete m1") {
			t.Fatalf("calls %s; want n0 given back and m1 deleted instead", calls)
		}
		if e.steps.machine != 3 {
			t.Errorf("%d machine steps counted for 3 replacements", e.steps.machine)
		}
	})
	t.Run("deleting first, a deletion not made leaves its machine step to the next", func(t *testing.T) {
		f := newScripted(world(old, old, old))
		f.onDrain = func(w *Snapshot, node string) {
			if m1, ok := w.CP.Machines["m1"]; ok && node == "n0" {
				m1 = m1.DeepCopy()
				m1.Annotations = map[string]string{clusterv1.DeleteMachineAnnotation: ""}
				w.CP.Machines.Insert(m1)
			}
		}
		e, ev := engineFor(f, fast)
		if err := converge(t, e, Target{Operation: "upgrade", Replicas: 3, MaxSurge: 0}); err != nil {
			t.Fatal(err)
		}
		if calls := strings.Join(f.calls, ", "); !strings.HasPrefix(calls, "hook m0, drain n0, uncordon n0, hook m1, drain n1, delete m1") {
			t.Fatalf("calls %s; want n0 given back and m1 deleted first instead", calls)
		}
		if drains := ev.of("drain", progress.Started); len(drains) < 2 || drains[0].Step != 1 || drains[1].Step != 1 {
			t.Fatalf("drain events %+v; want n0's and n1's both in machine step 1", drains)
		}
		last := 0
		for _, st := range ev.all {
			if st.Step < last {
				t.Fatalf("%s %s in machine step %d after step %d", st.Action, st.Phase, st.Step, last)
			}
			last = st.Step
		}
		if e.steps.machine != 3 {
			t.Errorf("%d machine steps counted for 3 replacements", e.steps.machine)
		}
	})
	t.Run("a deletion that fails gives the node back", func(t *testing.T) {
		f := newScripted(world(old, old, old))
		f.deleteFails = 1
		e, _ := engineFor(f, fast)
		if err := converge(t, e, surge1); err == nil {
			t.Fatal("the run went on after its deletion failed")
		}
		if got := strings.Join(f.calls[len(f.calls)-3:], ", "); got != "drain n0, delete m0, uncordon n0" {
			t.Fatalf("calls end %s; want the drained node uncordoned", got)
		}
	})
}

// TestWaitsReadTheCachesAndStepsAreDecidedLive: with caches that lag a
// stage behind the world, every wait reads the caches, yet every step is
// decided on a live read taken after the last cached one (the first turn's
// at once), and the rollout keeps its invariants.
func TestWaitsReadTheCachesAndStepsAreDecidedLive(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
	f.watched = true
	e, ev := engineFor(f, fast)
	e.Cache = &Cache{ControlPlane: laggingCache{f}, Workload: laggingCache{f}}
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	live, cached, steps := 0, 0, 0
	decidedLive := false
	for i, c := range f.trace {
		switch c {
		case "read":
			live++
			decidedLive = true
		case "cached-read":
			cached++
			decidedLive = false
		case "wait":
		default:
			steps++
			if !decidedLive {
				t.Fatalf("%q decided on the caches:\n%s", c, strings.Join(f.trace[:i+1], "\n"))
			}
		}
	}
	if steps == 0 || live >= cached {
		t.Fatalf("%d steps, %d live and %d cached reads: the waits did not read the caches:\n%s", steps, live, cached, strings.Join(f.trace, "\n"))
	}
	// The first turn follows no step: it reads live at once, and its step
	// (the first create) follows that one read.
	if len(f.trace) < 2 || f.trace[0] != "read" || f.trace[1] == "read" || f.trace[1] == "cached-read" {
		t.Fatalf("the first turn began %v; want one live read, then its step", f.trace[:min(len(f.trace), 3)])
	}
	if f.maxMachines > 4 || f.minHealthyVoters < 2 {
		t.Fatalf("up to %d machines and down to %d healthy voters", f.maxMachines, f.minHealthyVoters)
	}
	if n := f.world.CP.MachinesNotUpToDate.Len(); n != 0 || f.world.CP.Machines.Len() != 3 {
		t.Fatalf("ended with %d machines, %d outdated", f.world.CP.Machines.Len(), n)
	}
	ev.paired(t)
}

// TestAFailingCacheFallsBackToLiveReads: when the caches cannot be read
// (etcd not answering a wait's read in time), the waits read live, and the
// rollout goes on as it would without caches.
func TestAFailingCacheFallsBackToLiveReads(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(old, old, old))
	f.watched = true
	e, _ := engineFor(f, fast)
	e.Cache = &Cache{ControlPlane: failingCache{}, Workload: laggingCache{f}}
	if err := converge(t, e, surge1); err != nil {
		t.Fatalf("a failing cache stopped the run: %v", err)
	}
	if n := f.world.CP.MachinesNotUpToDate.Len(); n != 0 {
		t.Fatalf("%d machines still outdated", n)
	}
}

type failingCache struct{}

func (failingCache) Read(context.Context) (*kcpstate.ControlPlane, error) {
	return nil, errors.New("etcd: context deadline exceeded")
}

// laggingCache is the scripted world as watches a stage behind would show it:
// as it was before the latest Wait moved it on.
type laggingCache struct{ f *scripted }

func (c laggingCache) Read(context.Context) (*kcpstate.ControlPlane, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.f.trace = append(c.f.trace, "cached-read")
	return c.f.seen().clone().CP, nil
}

func (c laggingCache) Nodes(_ context.Context, names, _ []string) (map[string]workload.Node, error) {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	nodes := map[string]workload.Node{}
	for _, n := range names {
		nodes[n] = c.f.seen().Nodes[n]
	}
	return nodes, nil
}

func TestConvergeLeadership(t *testing.T) {
	old := machineSpec{outdated: true}
	t.Run("falls back to the next candidate", func(t *testing.T) {
		f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
		f.moveFails = 1
		e, ev := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(f.calls[3:5], ", "); got != "move-leader n0->node-r1, move-leader n0->n2" {
			t.Fatalf("moves %s; want the replacement first, then the newest other voter", got)
		}
		if !ev.find("move-leader", progress.Failed, "trying the next candidate") {
			t.Fatal("no event tells of the failed first candidate")
		}
		ev.paired(t)
	})
	t.Run("moves it again when the member wins it back", func(t *testing.T) {
		f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
		f.leadsAgain = 1
		e, _ := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		moves := 0
		for _, c := range f.calls {
			if strings.HasPrefix(c, "move-leader n0->") {
				moves++
			}
		}
		if moves != 2 {
			t.Fatalf("leadership moved off n0 %d times, want 2: %v", moves, f.calls)
		}
	})
	t.Run("reports how long etcd held a removal", func(t *testing.T) {
		f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
		f.held = 2500 * time.Millisecond
		e, ev := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		removals := ev.of("remove-member", progress.Done)
		if len(removals) != 3 {
			t.Fatalf("%d removals done, want 3", len(removals))
		}
		for _, e := range removals {
			if e.HeldMs != 2500 || !strings.Contains(e.Message, "etcd held the change 2.5s") {
				t.Errorf("remove-member done: heldMs %d, message %q; want 2500 and the hold told", e.HeldMs, e.Message)
			}
		}
		for _, e := range ev.all {
			if e.HeldMs != 0 && (e.Action != "remove-member" || e.Phase != progress.Done) {
				t.Errorf("%s %s carries heldMs %d; only a removal etcd held does", e.Action, e.Phase, e.HeldMs)
			}
		}
	})
	t.Run("gives up on a member that keeps winning it back", func(t *testing.T) {
		f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
		f.leadsAgain = maxLeaderRetries + 1
		e, _ := engineFor(f, fast)
		if err := converge(t, e, surge1); err == nil || !strings.Contains(err.Error(), "removing etcd member n0") {
			t.Fatalf("got %v, want the removal of n0 to fail", err)
		}
	})
}

func TestConvergeStopsWhenNoLongerOurs(t *testing.T) {
	old := machineSpec{outdated: true}
	t.Run("unpaused during the run", func(t *testing.T) {
		f := newScripted(pausedByUs(world(old, old, old)))
		f.onWait = func(w *Snapshot, _ int) {
			kcp := w.CP.KCP.DeepCopy()
			delete(kcp.Annotations, clusterv1.PausedAnnotation)
			w.CP.KCP = kcp
		}
		e, _ := engineFor(f, fast)
		err := convergeUnder(t, e, surge1, &heldLock{})
		if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "unpaused") {
			t.Fatalf("got %v, want a refusal saying the KCP was unpaused", err)
		}
		if len(f.calls) != 1 {
			t.Fatalf("acted after the pause went: %v", f.calls)
		}
	})
	t.Run("paused by someone else", func(t *testing.T) {
		f := newScripted(pausedByUs(world(old, old, old)))
		delete(f.world.CP.KCP.Annotations, record.Annotation)
		e, _ := engineFor(f, fast)
		if err := convergeUnder(t, e, surge1, &heldLock{}); exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "paused by someone else") {
			t.Fatalf("got %v, want a refusal naming the foreign pause", err)
		}
		if len(f.calls) != 0 {
			t.Fatalf("acted on a KCP paused by someone else: %v", f.calls)
		}
	})
	t.Run("lock lost", func(t *testing.T) {
		f := newScripted(pausedByUs(world(old, old, old)))
		lost := exitcode.Lockedf("lost the lock")
		e, _ := engineFor(f, fast)
		if err := convergeUnder(t, e, surge1, &heldLock{err: lost}); !errors.Is(err, lost) {
			t.Fatalf("got %v, want the lost lock", err)
		}
	})
}

func TestConvergeSoaksAfterEachJoin(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(old, old, old))
	limits := fast
	limits.Settle = 5 * time.Millisecond
	e, ev := engineFor(f, limits)
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	if soaked := len(ev.of("soak", progress.Done)); soaked != 3 {
		t.Fatalf("soaked %d times, want after each of 3 joins", soaked)
	}
	ev.paired(t)
}

func TestServeCleanupHook(t *testing.T) {
	atHook := machineSpec{outdated: true, deleting: true, preTermOK: true}
	t.Run("the last machine is only released", func(t *testing.T) {
		f := newScripted(world(atHook))
		e, _ := engineFor(f, fast)
		s := f.world.clone()
		if err := (&loop{Engine: e}).serveCleanupHook(context.Background(), s, s.CP.Machines.Oldest()); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(f.calls, ", "); got != "release m0" {
			t.Fatalf("calls %s, want only the release", got)
		}
	})
	t.Run("an unhealthy remainder keeps the hook", func(t *testing.T) {
		f := newScripted(world(atHook, machineSpec{}, machineSpec{unhealthy: true}))
		limits := fast
		limits.Recovery = 30 * time.Millisecond
		e, _ := engineFor(f, limits)
		err := converge(t, e, surge1)
		if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "not releasing machine m0") || !strings.Contains(err.Error(), "n2") {
			t.Fatalf("got %v, want a refusal naming m0 and n2", err)
		}
		if len(f.calls) != 0 {
			t.Fatalf("acted: %v", f.calls)
		}
	})
	t.Run("a leading member is moved off, removed, then released", func(t *testing.T) {
		f := newScripted(world(machineSpec{outdated: true, deleting: true, preTermOK: true, leader: true}, machineSpec{}, machineSpec{}))
		e, ev := engineFor(f, fast)
		s := f.world.clone()
		if err := (&loop{Engine: e}).serveCleanupHook(context.Background(), s, s.CP.Machines.Oldest()); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(f.calls, ", "); got != "move-leader n0->n2, remove-member n0, release m0" {
			t.Fatalf("calls %s", got)
		}
		ev.paired(t)
	})
}

func TestConvergeWaitsOutABlipWhileServingTheHook(t *testing.T) {
	// m0 is at its pre-terminate stage while m2's member is briefly down:
	// without m0's member, n1 and n2 alone would have no quorum.
	atHook := machineSpec{outdated: true, deleting: true, preTermOK: true}
	for _, tc := range []struct {
		name    string
		recover bool
	}{{"the member comes back: the hook is served", true}, {"it stays down: refused after the grace", false}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newScripted(world(atHook, machineSpec{}, machineSpec{unhealthy: true}))
			f.onWait = func(w *Snapshot, n int) {
				if tc.recover && n == 3 {
					w.Members[2].Healthy = true
				}
			}
			// The member comes back on the third wait, however long the
			// waits take on a busy machine: only the other case spends the
			// grace.
			limits := fast
			if !tc.recover {
				limits.Recovery = 50 * time.Millisecond
			}
			e, ev := engineFor(f, limits)
			err := converge(t, e, surge1)
			if tc.recover {
				if err != nil {
					t.Fatal(err)
				}
				if f.calls[0] != "remove-member n0" {
					t.Fatalf("calls %v, want m0's member removed once n2 recovered", f.calls)
				}
			} else {
				if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "not releasing machine m0") || !strings.Contains(err.Error(), "n2") {
					t.Fatalf("got %v, want exit 3 naming m0 and n2", err)
				}
				if len(f.calls) != 0 {
					t.Fatalf("acted while n2 was down: %v", f.calls)
				}
			}
			if !ev.find("unhealthy", progress.Waiting, "n2") {
				t.Fatal("the wait for n2 was not reported")
			}
			ev.paired(t)
		})
	}
}

// TestConvergeSyncsARaisedDrainTimeoutWhileAwaitingADeletion: an operator
// raises the paused KCP's drain timeout while the run waits on a deleting
// machine; the wait notices, the run pushes it to every machine, the deleting
// one included, and goes on.
func TestConvergeSyncsARaisedDrainTimeoutWhileAwaitingADeletion(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(old, old, machineSpec{outdated: true, deleting: true}, machineSpec{}))
	f.onWait = func(w *Snapshot, n int) {
		if n == 1 {
			kcp := w.CP.KCP.DeepCopy()
			kcp.Spec.MachineTemplate.Spec.Deletion.NodeDrainTimeoutSeconds = ptr.To(int32(600))
			w.CP.KCP = kcp
		}
	}
	e, ev := engineFor(f, fast)
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	want := "sync m0, sync m1, sync m2 (deleting), sync m3, remove-member n2, release m2"
	if got := strings.Join(f.calls[:min(6, len(f.calls))], ", "); got != want {
		t.Fatalf("calls start %s, want %s", got, want)
	}
	if !ev.find(string(SyncMachines), progress.Started, "machine m2 (deleting): nodeDrainTimeoutSeconds unset → 600s") {
		t.Fatalf("no %s step naming the deleting machine and its drain timeout: %v", SyncMachines, ev.all)
	}
	ev.paired(t)
}

// TestConvergeStopsWhenASyncIsUndone: writes that something undoes at once
// are an error, not a loop.
func TestConvergeStopsWhenASyncIsUndone(t *testing.T) {
	w := world(machineSpec{}, machineSpec{}, machineSpec{})
	w.CP.KCP.Spec.MachineTemplate.Spec.Deletion.NodeDrainTimeoutSeconds = ptr.To(int32(600))
	f := newScripted(w)
	f.syncReverted = true
	e, _ := engineFor(f, fast)
	err := converge(t, e, surge1)
	if err == nil || !strings.Contains(err.Error(), "still out of sync") {
		t.Fatalf("got %v, want an error that the machines stay out of sync", err)
	}
	if got := strings.Join(f.calls, ", "); got != "sync m0, sync m1, sync m2" {
		t.Fatalf("calls %s, want one sync of each machine", got)
	}
}

func TestConvergeTellsAJoinedMachineThatWentBadFromAJoiningOne(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(old, old, old))
	// Once r1 has joined and m0 is released (no hook left to serve), r1's node
	// goes NotReady for good.
	f.onWait = func(w *Snapshot, _ int) {
		if slices.Contains(f.calls, "release m0") {
			n := w.Nodes["node-r1"]
			n.Ready = false
			w.Nodes["node-r1"] = n
		}
	}
	limits := fast
	limits.Recovery = 50 * time.Millisecond // the health timeout stays a minute
	e, _ := engineFor(f, limits)
	err := converge(t, e, surge1)
	if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "machine r1") || !strings.Contains(err.Error(), "not Ready") {
		t.Fatalf("got %v, want exit 3 after the grace naming r1's node; not a health timeout", err)
	}
}

func TestConvergeStopsWhenTheClusterIsPaused(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(pausedByUs(world(old, old, old)))
	f.onWait = func(w *Snapshot, _ int) {
		cluster := w.CP.Cluster.DeepCopy()
		cluster.Spec.Paused = ptr.To(true) // as clusterctl move does
		w.CP.Cluster = cluster
	}
	e, _ := engineFor(f, fast)
	err := convergeUnder(t, e, surge1, &heldLock{})
	if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "cluster demo was paused") {
		t.Fatalf("got %v, want exit 3 naming the paused Cluster", err)
	}
	if len(f.calls) != 1 {
		t.Fatalf("acted after the Cluster was paused: %v", f.calls)
	}
}

func TestPrepareWhileAnotherRunHoldsTheLock(t *testing.T) {
	// Another run's operation is recorded on the KCP: a scale while an upgrade runs.
	w := pausedByUs(world(machineSpec{}))
	w.CP.KCP.Annotations[record.Annotation] = `{"operation":"upgrade","target":"v1.36.3","who":"alice@host/pid-1"}`
	scale := Request{Operation: "scale", Replicas: ptr.To(int32(3)), MaxSurge: 1}

	f := newScripted(w)
	e, _ := engineFor(f, fast)
	if _, err := e.Prepare(context.Background(), scale, nil); exitcode.Of(err) != exitcode.Unsafe {
		t.Fatalf("no run in flight: got %v, want exit 3 for the unfinished operation", err)
	}
	now := metav1.NewMicroTime(time.Now())
	f.lease = &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("alice@host/pid-1"), RenewTime: &now,
		LeaseDurationSeconds: ptr.To(int32(15))}}
	_, err := e.Prepare(context.Background(), scale, nil)
	if exitcode.Of(err) != exitcode.Locked || !strings.Contains(err.Error(), "alice@host/pid-1") {
		t.Fatalf("run in flight: got exit %d %v, want exit 5 naming its holder", exitcode.Of(err), err)
	}
}

func TestServeCleanupHookFindsTheNodeByProviderID(t *testing.T) {
	// m0 lost (or never got) its nodeRef, but its node n0 and member n0 are there.
	f := newScripted(world(machineSpec{outdated: true, deleting: true, preTermOK: true}, machineSpec{}, machineSpec{}, machineSpec{}))
	m0 := f.machine("m0")
	m0.Status.NodeRef = clusterv1.MachineNodeReference{}
	m0.Spec.ProviderID = "sim://n0"
	f.world.CP.Machines.Insert(m0)
	e, _ := engineFor(f, fast)
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(f.calls, ", "); got != "remove-member n0, release m0" {
		t.Fatalf("calls %s; want m0's member, found through its provider ID, removed before the release", got)
	}
}

// handover is the HandOver role of f's control plane, for takeOver: the
// pause is granted at once, and SetTarget answers what setTargetErr says.
type handover struct {
	HandOver       // the nil interface: what is not faked here panics
	f              *scripted
	setTargetErr   error
	awaitPausedErr error
}

// engineWithHandover is an engine on f whose HandOver role is h.
func engineWithHandover(f *scripted, h *handover) *Engine {
	h.f = f
	e := (&Engine{Workload: f, Etcd: f, Changes: f, Timeouts: fast}).Plays(f)
	e.HandOver = h
	return e
}

func (h *handover) Pause(_ context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, rec record.Record, _ time.Duration, mayTakeOver func(*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane) error) (*controlplanev1.KubeadmControlPlane, error) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if err := mayTakeOver(cluster, kcp); err != nil {
		return nil, err
	}
	h.f.record("pause")
	pausedByUs(h.f.world)
	return h.f.world.CP.KCP, nil
}

// AwaitPaused is KCP reporting Paused once asked, unless awaitPausedErr
// says it never does.
func (h *handover) AwaitPaused(_ context.Context, kcp *controlplanev1.KubeadmControlPlane, _ time.Duration) (*controlplanev1.KubeadmControlPlane, error) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	h.f.record("await-paused")
	if h.awaitPausedErr != nil {
		return nil, h.awaitPausedErr
	}
	conditions.Set(h.f.world.CP.KCP, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionTrue, Reason: clusterv1.PausedReason})
	return h.f.world.CP.KCP, nil
}

func (h *handover) SetTarget(context.Context, *clusterv1.Cluster, *controlplanev1.KubeadmControlPlane, string, string, *int32, time.Duration) error {
	h.f.record("set-target")
	return h.setTargetErr
}

func (h *handover) Resume(context.Context, *controlplanev1.KubeadmControlPlane) error {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	h.f.record("resume")
	h.f.world.CP.KCP.Annotations = nil
	return nil
}

func TestRejectedTargetIsHandedBackAtOnce(t *testing.T) {
	denied := apierrors.NewForbidden(schema.GroupResource{Group: controlplanev1.GroupVersion.Group, Resource: "kubeadmcontrolplanes"}, "demo-cp",
		errors.New(`admission webhook "policy.example.com" denied the request: version v1.36.3 is not allowed`))
	for _, tc := range []struct {
		name  string
		err   error
		code  int
		calls string
	}{
		{"rejected by admission: handed back, bad input", denied, exitcode.Usage, "pause, set-target, resume"},
		{"failed otherwise: left paused for a re-run", errors.New("connection reset by peer"), exitcode.Failure, "pause, set-target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newScripted(world(machineSpec{outdated: true}))
			e := engineWithHandover(f, &handover{setTargetErr: tc.err})
			_, err := e.takeOver(context.Background(), nil, Request{Operation: "upgrade", Version: "v1.36.3"}, "v1.36.3")
			if exitcode.Of(err) != tc.code {
				t.Fatalf("exit %d (%v), want %d", exitcode.Of(err), err, tc.code)
			}
			if got := strings.Join(f.calls, ", "); got != tc.calls {
				t.Fatalf("calls %s, want %s", got, tc.calls)
			}
			if tc.code == exitcode.Usage && !strings.Contains(err.Error(), "policy.example.com") {
				t.Fatalf("%v does not give the server's reason", err)
			}
		})
	}
}

// TestSnapshotOfTakesTheConnectedControlPlane: a verb's first look takes the
// control plane connect has just read, with the workload and etcd read now;
// without one, it reads live.
func TestSnapshotOfTakesTheConnectedControlPlane(t *testing.T) {
	ctx := context.Background()
	f := newScripted(world(machineSpec{}, machineSpec{}, machineSpec{}))
	e, _ := engineFor(f, fast)
	connected := f.world.clone().CP
	reads := func() int { return strings.Count(strings.Join(f.trace, ","), "read") }

	first, err := e.SnapshotOf(ctx, connected)
	if err != nil {
		t.Fatal(err)
	}
	if first.CP != connected || reads() != 0 || len(first.Members) != 3 {
		t.Fatalf("first look: connected control plane %v, management reads %d, members %d; want it, none, 3",
			first.CP == connected, reads(), len(first.Members))
	}
	again, err := e.SnapshotOf(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.CP == connected || reads() != 1 {
		t.Fatalf("without one: connected control plane %v, management reads %d; want a live read", again.CP == connected, reads())
	}
}

// countingEtcd counts the membership reads of the etcd it wraps.
type countingEtcd struct {
	Etcd
	reads int
}

func (c *countingEtcd) Members(ctx context.Context, nodes []etcd.Node) ([]etcd.Member, error) {
	c.reads++
	return c.Etcd.Members(ctx, nodes)
}

// TestCachedReadTakesTheMembersOfTheSnapshotBefore: a read from the caches
// takes the etcd members of the snapshot passed before it while they are
// younger than etcdPoll, and reads etcd once they are older; a live read
// always reads etcd.
func TestCachedReadTakesTheMembersOfTheSnapshotBefore(t *testing.T) {
	ctx := context.Background()
	f := newScripted(world(machineSpec{}, machineSpec{}, machineSpec{}))
	e, _ := engineFor(f, fast)
	counted := &countingEtcd{Etcd: f}
	e.Etcd = counted
	e.Cache = &Cache{ControlPlane: laggingCache{f}, Workload: laggingCache{f}}

	live, err := e.Read(ctx)
	if err != nil || counted.reads != 1 || live.MembersRead.IsZero() {
		t.Fatalf("live read: err %v, etcd reads %d, members read at %v; want one read, timed", err, counted.reads, live.MembersRead)
	}
	l := &loop{Engine: e}
	fresh, err := l.readOurs(ctx, true, live)
	if err != nil || counted.reads != 1 || !fresh.MembersRead.Equal(live.MembersRead) || len(fresh.Members) != 3 {
		t.Fatalf("cached read after a fresh one: err %v, etcd reads %d; want its 3 members taken, no read", err, counted.reads)
	}
	stale := *live
	stale.MembersRead = time.Now().Add(-etcdPoll)
	if _, err := l.readOurs(ctx, true, &stale); err != nil || counted.reads != 2 {
		t.Fatalf("cached read after one %s old: err %v, etcd reads %d; want etcd read again", etcdPoll, err, counted.reads)
	}
	if _, err := l.readOurs(ctx, true, nil); err != nil || counted.reads != 3 {
		t.Fatalf("cached read with no snapshot before: err %v, etcd reads %d; want etcd read", err, counted.reads)
	}
}
