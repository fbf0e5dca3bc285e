package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/test/builder"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// monitor watches a scenario from the outside, every 100 ms, and records every
// breach of the invariants a rollout must keep (the machines and InfraMachines
// come from watches of its own, so sampling adds no requests to the API
// server the scenario runs on; the etcd members are asked each time):
//   - never more than maxMachines control-plane machines;
//   - the last control-plane machine is never deleted;
//   - voting etcd members never fall below quorum of the current membership,
//     nor below minHealthy healthy voters;
//   - no machine starts deleting while its member leads;
//   - no machine's infrastructure starts deleting while its member is listed;
//   - the control plane's MachineHealthCheck marks no machine unhealthy (its
//     node is not Ready for 5 minutes, or never appears within 10: no
//     scenario injects a fault that long, so a mark means the rollout left
//     a machine behind).
type monitor struct {
	e                       *env
	maxMachines, minHealthy int

	mu         sync.Mutex
	breaches   []string
	peak       int
	lowHealthy int
	deleting   map[string]bool // machines seen deleting
	infraGoing map[string]bool // machines whose InfraMachine was seen deleting
	unhealthy  map[string]bool // machines seen marked unhealthy
	samples    int
	cache      ctrlcache.Cache
	etcd       *etcd.Client
	stop       context.CancelFunc
	done       chan struct{}
}

func watchInvariants(t *testing.T, e *env, maxMachines, minHealthy int) *monitor {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := e.Sim.ManagementClient().Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	creds, err := etcd.LoadCredentials(ctx, e.Sim.ManagementClient(), e.Sim.ClusterKey(), kcp)
	if err != nil {
		t.Fatal(err)
	}
	dialer, err := etcd.NewDirectDialer("https://{{.NodeIP}}:2379")
	if err != nil {
		t.Fatal(err)
	}
	ec, err := etcd.New(etcd.Config{Dialer: dialer, Credentials: creds, DialTimeout: time.Second, CallTimeout: 2 * time.Second, Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := ctrlcache.New(e.Sim.ManagementConfig(), ctrlcache.Options{Scheme: sim.Scheme(),
		DefaultNamespaces: map[string]ctrlcache.Config{e.Sim.ClusterKey().Namespace: {}}})
	if err != nil {
		t.Fatal(err)
	}
	m := &monitor{e: e, maxMachines: maxMachines, minHealthy: minHealthy, lowHealthy: 1 << 30,
		deleting: map[string]bool{}, infraGoing: map[string]bool{}, unhealthy: map[string]bool{}, cache: cache, etcd: ec, stop: cancel, done: make(chan struct{})}
	go func() { _ = cache.Start(ctx) }()
	// A read before Start has marked the cache started fails at once
	// (ErrCacheNotStarted) rather than waiting: wait for it first.
	if !cache.WaitForCacheSync(ctx) {
		cancel()
		t.Fatal("the monitor's cache never started")
	}
	// A machine already deleting when the watch begins was deleted by the
	// scenario itself (it may well be the leader's): only deletions that start
	// while watched are the tool's.
	machines, err := m.machines(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	for _, mc := range machines {
		if !mc.DeletionTimestamp.IsZero() {
			m.deleting[mc.Name] = true
		}
	}
	go m.run(ctx)
	t.Cleanup(func() { m.halt(); _ = ec.Close() })
	return m
}

// machines are the cluster's control-plane Machines as the monitor's watch
// last saw them, by name.
func (m *monitor) machines(ctx context.Context) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := m.cache.List(ctx, list, client.InNamespace(m.e.Sim.ClusterKey().Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: m.e.Sim.ClusterKey().Name},
		client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// memberNodes are the simulated nodes whose etcd member runs, with the
// addresses the monitor reaches them on.
func (m *monitor) memberNodes() []etcd.Node {
	var nodes []etcd.Node
	for _, n := range m.e.Sim.Nodes() {
		if n.EtcdClientURL != "" {
			nodes = append(nodes, etcd.Node{Name: n.Name, IP: n.IP})
		}
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	return nodes
}

func (m *monitor) breach(format string, a ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.breaches = append(m.breaches, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, a...))
}

func (m *monitor) run(ctx context.Context) {
	defer close(m.done)
	for ctx.Err() == nil {
		m.sample(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (m *monitor) sample(ctx context.Context) {
	machines, err := m.machines(ctx)
	if err != nil {
		return // stopped
	}
	nodes := m.memberNodes()
	var members []etcd.Member
	if len(nodes) > 0 {
		members, _ = m.etcd.Members(ctx, nodes)
	}
	if ctx.Err() != nil {
		return // stopped mid-sample: the probes were cut short, not the members
	}

	m.mu.Lock()
	m.samples++
	m.peak = max(m.peak, len(machines))
	m.mu.Unlock()
	if len(machines) > m.maxMachines {
		m.breach("%d machines, at most %d allowed: %s", len(machines), m.maxMachines, names(machines))
	}
	alive := 0
	for _, mc := range machines {
		if mc.DeletionTimestamp.IsZero() {
			alive++
		}
	}
	if alive == 0 && len(machines) > 0 {
		m.breach("every control-plane machine is deleting: %s", names(machines))
	}

	if members != nil {
		voting, healthy := count(members)
		if voting > 0 && (healthy < voting/2+1 || healthy < m.minHealthy) {
			// One probe of each member can fail on a starved machine without
			// the member being down: a breach must still be there when asked
			// again at once. The nodes are read again too: a member promoted
			// while the first probe ran has its address only now.
			if again, err := m.etcd.Members(ctx, m.memberNodes()); err == nil {
				members = again
				voting, healthy = count(members)
			}
			if ctx.Err() != nil {
				return
			}
		}
		if voting > 0 && healthy < voting/2+1 {
			m.breach("etcd below quorum: %d of %d voting members healthy: %s", healthy, voting, describe(members))
		}
		if voting > 0 && healthy < m.minHealthy {
			m.breach("only %d healthy voting etcd members, want at least %d: %s", healthy, m.minHealthy, describe(members))
		}
		m.mu.Lock()
		m.lowHealthy = min(m.lowHealthy, healthy)
		m.mu.Unlock()
	}
	member := func(node string) (etcd.Member, bool) {
		for _, mb := range members {
			if mb.Name == node && node != "" {
				return mb, true
			}
		}
		return etcd.Member{}, false
	}
	for i := range machines {
		mc := &machines[i]
		node := mc.Status.NodeRef.Name
		// A deleting machine's node goes away before it does, and the check
		// says so; that is the deletion, not a machine left behind.
		if c := conditions.Get(mc, clusterv1.MachineHealthCheckSucceededCondition); mc.DeletionTimestamp.IsZero() &&
			c != nil && c.Status == metav1.ConditionFalse && !m.seen(m.unhealthy, mc.Name) {
			m.breach("the MachineHealthCheck marks machine %s unhealthy: %s", mc.Name, c.Message)
		}
		if !mc.DeletionTimestamp.IsZero() && !m.seen(m.deleting, mc.Name) {
			if mb, ok := member(node); ok && mb.Leader {
				m.breach("machine %s started deleting while its member %s leads", mc.Name, mb)
			}
		}
		if !mc.DeletionTimestamp.IsZero() && node != "" && !m.infraGoing[mc.Name] {
			infra, err := external.GetObjectFromContractVersionedRef(ctx, m.cache, mc.Spec.InfrastructureRef, mc.Namespace)
			if err == nil && infra.GetDeletionTimestamp() != nil && !m.seen(m.infraGoing, mc.Name) {
				// The members were listed before the InfraMachine was read: on a
				// starved machine the member may have been removed in between.
				// Only a member still listed now, after the deletion was seen,
				// outlived it.
				if _, ok := member(node); ok && members != nil {
					if now, err := m.etcd.Members(ctx, m.memberNodes()); err == nil {
						members = now
						if mb, ok := member(node); ok {
							m.breach("InfraMachine of %s started deleting while its etcd member %s is still listed", mc.Name, mb)
						}
					}
				}
			}
		}
	}
}

func count(members []etcd.Member) (voting, healthy int) {
	for _, mb := range members {
		if mb.Voting() {
			voting++
			if mb.Healthy {
				healthy++
			}
		}
	}
	return voting, healthy
}

func describe(members []etcd.Member) string {
	var out []string
	for _, mb := range members {
		out = append(out, fmt.Sprintf("%s healthy=%v %s", mb, mb.Healthy, strings.Join(mb.Errors, "; ")))
	}
	return strings.Join(out, " | ")
}

// seen marks name in set and reports whether it was there already.
func (m *monitor) seen(set map[string]bool, name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	was := set[name]
	set[name] = true
	return was
}

func (m *monitor) halt() {
	m.stop()
	<-m.done
}

// check stops the monitor and fails the test on any breach.
func (m *monitor) check(t *testing.T) {
	t.Helper()
	m.halt()
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("monitor: %d samples, peak %d machines, lowest %d healthy voting members", m.samples, m.peak, m.lowHealthy)
	if m.samples < 10 {
		t.Errorf("monitor took only %d samples", m.samples)
	}
	for _, b := range m.breaches {
		t.Errorf("invariant broken: %s", b)
	}
}

func names(ms []clusterv1.Machine) string {
	var out []string
	for _, m := range ms {
		s := m.Name
		if !m.DeletionTimestamp.IsZero() {
			s += "(deleting)"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// assertConverged checks the end state: the KCP handed back, replicas machines
// all up to date per KCP's own UpToDate, each with exactly one healthy voting
// member named after its node, and no member without a machine.
func assertConverged(t *testing.T, e *env, replicas int, version string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused {
		t.Errorf("KCP still paused: %v", kcp.Annotations)
	}
	for k := range kcp.Annotations {
		if strings.HasPrefix(k, "cp-rollout.") && k != record.LastAnnotation {
			t.Errorf("KCP still carries %s", k)
		}
	}
	if kcp.Spec.Version != version {
		t.Errorf("KCP version %s, want %s", kcp.Spec.Version, version)
	}
	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, e.Sim.ClusterKey(), cluster); err != nil {
		t.Fatal(err)
	}
	machines, err := collections.GetFilteredMachinesForCluster(ctx, c, cluster, collections.ControlPlaneMachines(cluster.Name))
	if err != nil {
		t.Fatal(err)
	}
	if machines.Len() != replicas {
		t.Errorf("%d machines, want %d", machines.Len(), replicas)
	}
	cp, err := pkg.NewControlPlane(ctx, nil, c, cluster, kcp, machines)
	if err != nil {
		t.Fatal(err)
	}
	if cp.MachinesNotUpToDate.Len() > 0 {
		t.Errorf("not up to date per KCP: %v", cp.MachinesNotUpToDate.Names())
	}
	members, err := e.Sim.EtcdMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]int{}
	for _, m := range machines {
		if !m.DeletionTimestamp.IsZero() {
			t.Errorf("machine %s still deleting", m.Name)
		}
		if m.Spec.Version != version {
			t.Errorf("machine %s at %s, want %s", m.Name, m.Spec.Version, version)
		}
		nodes[m.Status.NodeRef.Name] = 0
	}
	for _, mb := range members {
		if _, ok := nodes[mb.Name]; !ok {
			t.Errorf("etcd member %q (%x) has no machine", mb.Name, mb.ID)
			continue
		}
		nodes[mb.Name]++
		if mb.IsLearner || !mb.Healthy {
			t.Errorf("etcd member %s: learner=%v healthy=%v", mb.Name, mb.IsLearner, mb.Healthy)
		}
	}
	for n, count := range nodes {
		if count != 1 {
			t.Errorf("node %s has %d etcd members, want 1", n, count)
		}
	}
	for _, name := range orphans(t, e) {
		t.Errorf("%s belongs to no Machine", name)
	}
}

// orphans lists the InfraMachines and KubeadmConfigs of the namespace whose
// Machine does not exist. It is deliberately blunter than the tool's own
// rule (labels, owner references): an independent check, by name alone.
func orphans(t *testing.T, e *env) []string {
	t.Helper()
	ctx := context.Background()
	c := e.Sim.ManagementClient()
	machines := &clusterv1.MachineList{} // workers' too
	if err := c.List(ctx, machines, client.InNamespace(e.Sim.ClusterKey().Namespace)); err != nil {
		t.Fatal(err)
	}
	exists := map[string]bool{}
	for _, m := range machines.Items {
		exists[m.Name] = true
	}
	infras := &unstructured.UnstructuredList{}
	infras.SetGroupVersionKind(builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureMachineKind + "List"))
	configs := &bootstrapv1.KubeadmConfigList{}
	var out []string
	for kind, list := range map[string]client.ObjectList{"InfraMachine": infras, "KubeadmConfig": configs} {
		if err := c.List(ctx, list, client.InNamespace(e.Sim.ClusterKey().Namespace)); err != nil {
			t.Fatal(err)
		}
		_ = meta.EachListItem(list, func(o runtime.Object) error {
			obj := o.(client.Object)
			if !exists[obj.GetName()] && obj.GetDeletionTimestamp() == nil {
				out = append(out, kind+" "+obj.GetName())
			}
			return nil
		})
	}
	return out
}

// assertKCPIdle checks that the real KCP controller, in charge again, finds
// nothing to do after the hand-back: it reconciles the current generation
// unpaused and reports no rollout and no scaling, then creates and deletes no
// machine for a while. KCP's own verdict makes a short watch enough; without it
// the watch would have to outlast every requeue of KCP's preflight checks.
func assertKCPIdle(t *testing.T, e *env) {
	t.Helper()
	assertKCPIdleFor(t, e, 10*time.Second)
}

// assertKCPIdleFor is assertKCPIdle watching the machines for quiet.
func assertKCPIdleFor(t *testing.T, e *env, quiet time.Duration) {
	t.Helper()
	simtest.Eventually(t, 2*time.Minute, "KCP reconciled after the hand-back with nothing to do", func(ctx context.Context) (bool, string, error) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := e.Sim.ManagementClient().Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
			return false, "", err
		}
		for _, want := range []struct {
			cond   string
			status metav1.ConditionStatus
		}{
			{clusterv1.PausedCondition, metav1.ConditionFalse},
			{controlplanev1.KubeadmControlPlaneRollingOutCondition, metav1.ConditionFalse},
			{controlplanev1.KubeadmControlPlaneScalingUpCondition, metav1.ConditionFalse},
			{controlplanev1.KubeadmControlPlaneScalingDownCondition, metav1.ConditionFalse},
		} {
			c := conditions.Get(kcp, want.cond)
			if c == nil || c.Status != want.status || c.ObservedGeneration != kcp.Generation {
				return false, fmt.Sprintf("%s is %v, want %s at generation %d", want.cond, c, want.status, kcp.Generation), nil
			}
		}
		return true, "", nil
	})
	ctx := context.Background()
	before, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(quiet); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		now, err := e.Sim.Machines(ctx)
		if err == nil && (names(now) != names(before)) {
			t.Fatalf("KCP changed machines after hand-back: %s -> %s", names(before), names(now))
		}
	}
}
