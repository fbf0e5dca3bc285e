package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// fastOptions is a simulator whose machines come and go within a second or two.
func fastOptions(replicas int32) sim.Options {
	return sim.Options{Replicas: replicas, Version: from, ProvisionDelay: time.Second, DeleteDelay: 500 * time.Millisecond}
}

func fastSim(t *testing.T, replicas int32) *env { return simtest.Start(t, fastOptions(replicas)) }

// readOnly is the simulator of the scenarios that change no Cluster, KCP or
// Machine (leadership may move): they take it in turn instead of starting one
// each, which costs half a minute of both cores.
var readOnly = simtest.NewShared(fastOptions(3))

// versions records the resourceVersion of the Cluster, the KCP and every
// Machine: equal before and after means nothing was changed.
func versions(t *testing.T, e *env) map[string]string {
	t.Helper()
	ctx := context.Background()
	c := e.Sim.ManagementClient()
	out := map[string]string{}
	cluster := &clusterv1.Cluster{}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, e.Sim.ClusterKey(), cluster); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	out["cluster"], out["kcp"] = cluster.ResourceVersion, kcp.ResourceVersion
	machines := &clusterv1.MachineList{}
	if err := c.List(ctx, machines, client.InNamespace(cluster.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, m := range machines.Items {
		out["machine/"+m.Name] = m.ResourceVersion
	}
	return out
}

// quietVersions waits until the controllers have settled (no resourceVersion
// moves for 3 s) and returns the versions then: a baseline that only a change
// by the tool would move.
func quietVersions(t *testing.T, e *env) map[string]string {
	t.Helper()
	last, since := versions(t, e), time.Now()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		now := versions(t, e)
		if !equal(now, last) {
			last, since = now, time.Now()
			continue
		}
		if time.Since(since) > 3*time.Second {
			return now
		}
	}
	t.Fatal("the simulated cluster never settled")
	return nil
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func assertUnchanged(t *testing.T, before, after map[string]string) {
	t.Helper()
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed: resourceVersion %s -> %s", k, v, after[k])
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s appeared", k)
		}
	}
}

func TestPlanExitCodeAndDryRunChangeNothing(t *testing.T) {
	t.Parallel()
	e := readOnly.Use(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before := quietVersions(t, e)

	if r := e.Plugin(t, ctx, "plan", "demo", "--version", from, "--exit-code"); r.Code != 0 {
		t.Errorf("plan at the current version: exit %d, want 0", r.Code)
	}
	if r := e.Plugin(t, ctx, "plan", "demo", "--rollout", "--exit-code"); r.Code != 0 || !strings.Contains(r.Stdout, "no machine is outdated") {
		t.Errorf("plan --rollout of an up-to-date control plane: exit %d, want 0 and nothing to do\n%s", r.Code, r.Stdout)
	}
	r := e.Plugin(t, ctx, "plan", "demo", "--version", to, "--exit-code", "-o", "json")
	if r.Code != 10 {
		t.Errorf("plan of an upgrade: exit %d, want 10", r.Code)
	}
	var plan struct {
		Steps []struct{ Action, Machine string }
	}
	if err := json.Unmarshal([]byte(r.Stdout), &plan); err != nil {
		t.Fatalf("plan -o json: %v\n%s", err, r.Stdout)
	}
	if len(plan.Steps) != 6 || plan.Steps[0].Action != "create" || plan.Steps[1].Action != "delete" {
		t.Errorf("plan steps %+v, want create/delete three times", plan.Steps)
	}
	for _, args := range [][]string{
		{"upgrade", "demo", "--version", to, "--dry-run"},
		{"scale", "demo", "--replicas", "5", "--dry-run"},
		{"replace", "demo", plan.Steps[1].Machine, "--dry-run"},
		{"restart", "demo", "--dry-run"},
	} {
		if r := e.Plugin(t, ctx, args...); r.Code != 0 || !strings.Contains(r.Stdout, "create") {
			t.Errorf("%v: exit %d, want 0 and a plan:\n%s", args, r.Code, r.Stdout)
		}
	}
	assertUnchanged(t, before, versions(t, e))
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A worker machine of the same cluster: not a control-plane machine.
	ns := e.Sim.ClusterKey().Namespace
	worker := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "demo-md-0-abc12", Namespace: ns,
		Labels: map[string]string{clusterv1.ClusterNameLabel: "demo"}}}
	worker.Spec.ClusterName = "demo"
	worker.Spec.Bootstrap.DataSecretName = ptrTo("none")
	worker.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "GenericInfrastructureMachine", Name: "none"}
	if err := e.Sim.ManagementClient().Create(ctx, worker); err != nil {
		t.Fatal(err)
	}
	// A Cluster whose control plane is not a KubeadmControlPlane.
	other := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "no-kcp", Namespace: ns}}
	other.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.example.com", Kind: "OtherControlPlane", Name: "x"}
	if err := e.Sim.ManagementClient().Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	// expect runs the plugin and checks its exit code and one-line reason,
	// which must name every fragment in says.
	expect := func(args []string, code int, says ...string) {
		t.Helper()
		r := e.Plugin(t, ctx, args...)
		named := true
		for _, s := range says {
			named = named && strings.Contains(r.Stderr, s)
		}
		if r.Code != code || !named {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", args, r.Code, r.Stderr, code, says)
		}
		if lines := strings.Count(strings.TrimSpace(r.Stderr), "\n") + 1; lines > 2 {
			t.Errorf("%v: %d lines on stderr, want the reason and at most a usage hint", args, lines)
		}
	}
	before := quietVersions(t, e)
	// Input refused from flags, arguments and configuration alone is tested
	// without a cluster in pkg/cli (TestBadInputRefusedBeforeAnyCluster);
	// these rows need the cluster to be refused.
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"upgrade", "demo", "--version", "v1.34.0"}, 2, "downgrade"},
		{[]string{"upgrade", "demo", "--version", "v1.35.1"}, 2, "downgrade"},
		{[]string{"upgrade", "demo", "--version", "v1.37.0"}, 2, "skips a minor"},
		{[]string{"upgrade", "demo", "--version", "v2.0.0"}, 2, "skips a minor"},
		{[]string{"scale", "demo", "--replicas", "2"}, 2, "odd"},
		{[]string{"scale", "demo", "--replicas", "4"}, 2, "odd"},
		{[]string{"replace", "demo", worker.Name}, 2, "not a control-plane machine"},
		{[]string{"replace", "demo", "no-such-machine"}, 2, "not a control-plane machine"},
		// A name or namespace that matches no Cluster is bad input.
		{[]string{"upgrade", "nope", "--version", to}, 2, "cluster " + ns + "/nope not found (" + ns + " is the kubeconfig context's namespace): name its namespace with -n NAMESPACE"},
		{[]string{"upgrade", "demo", "--version", to, "-n", "no-such-namespace"}, 2, "name its namespace with -n NAMESPACE"},
		{[]string{"upgrade", "no-kcp", "--version", to}, 3, "not a KubeadmControlPlane"},
		{[]string{"upgrade", "demo", "--version", to, "--wait-workers"}, 2, "has no ClusterClass topology"},
	} {
		expect(tc.args, tc.code, tc.says)
	}
	// An identity with no permission at all is refused before anything is
	// locked: exit 6, every missing permission on a line of its own.
	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--as", "nobody"); r.Code != 6 ||
		!strings.HasPrefix(r.Stderr, "error: nobody lacks") || !strings.Contains(r.Stderr, "\n  cannot get clusters.cluster.x-k8s.io in namespace "+ns+"\n") {
		t.Errorf("upgrade --as nobody: exit %d, stderr %q; want 6 listing what nobody lacks", r.Code, r.Stderr)
	}
	// A broken etcd CA Secret: each row breaks it before the command and puts
	// it back after. The tool must refuse, never skip verifying the members.
	for _, tc := range []struct {
		breakCA func(t *testing.T, e *env) (restore func())
		says    []string
	}{
		{withoutEtcdCA, []string{"etcd CA Secret " + ns + "/demo-etcd not found"}},
		{withOtherEtcdCA, []string{"not signed by the etcd CA in Secret " + ns + "/demo-etcd", "on node "}},
	} {
		restore := tc.breakCA(t, e)
		expect([]string{"upgrade", "demo", "--version", to}, 3, tc.says...)
		restore()
	}
	// Clusters the tool must not take over: siblings of demo sharing its
	// workload cluster, each refused for what its Cluster says.
	sibling(t, e, "stopped", func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) })
	expect([]string{"upgrade", "stopped", "--version", to}, 3, "cluster stopped is paused")
	doomed := sibling(t, e, "doomed", func(c *clusterv1.Cluster) { c.Finalizers = []string{"e2e.cp-rollout.io/hold"} })
	if err := e.Sim.ManagementClient().Delete(ctx, doomed); err != nil {
		t.Fatal(err)
	}
	expect([]string{"upgrade", "doomed", "--version", to}, 3, "cluster doomed is being deleted")
	assertUnchanged(t, before, versions(t, e))

	// A KubeadmControlPlane paused by someone else: refused, and the tool
	// changes nothing (compared from after the pause was set).
	kcp := kcpOf(t, e)
	patch := client.MergeFrom(kcp.DeepCopy())
	if kcp.Annotations == nil {
		kcp.Annotations = map[string]string{}
	}
	kcp.Annotations[clusterv1.PausedAnnotation] = ""
	if err := e.Sim.ManagementClient().Patch(ctx, kcp, patch); err != nil {
		t.Fatal(err)
	}
	paused := quietVersions(t, e) // KCP reports Paused first
	expect([]string{"upgrade", "demo", "--version", to}, 3, "paused by someone else")
	assertUnchanged(t, paused, versions(t, e))
}

// sibling creates a Cluster named name that shares demo's kubeconfig and
// etcd CA, changed by mutate, with a KubeadmControlPlane of its own (demo's
// spec, no machines, held by a finalizer so that a Cluster deletion cannot
// take it away). Its infrastructure reference names nothing: the real
// Cluster controller would otherwise claim demo's as its own too.
func sibling(t *testing.T, e *env, name string, mutate func(*clusterv1.Cluster)) *clusterv1.Cluster {
	t.Helper()
	ctx, c := context.Background(), e.Sim.ManagementClient()
	demo := &clusterv1.Cluster{}
	if err := c.Get(ctx, e.Sim.ClusterKey(), demo); err != nil {
		t.Fatal(err)
	}
	for _, purpose := range []secret.Purpose{secret.Kubeconfig, secret.EtcdCA} {
		orig := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: demo.Namespace, Name: secret.Name(demo.Name, purpose)}, orig); err != nil {
			t.Fatal(err)
		}
		cp := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: demo.Namespace, Name: secret.Name(name, purpose)}, Data: orig.Data, Type: orig.Type}
		if err := c.Create(ctx, cp); err != nil {
			t.Fatal(err)
		}
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: demo.Namespace, Name: name}, Spec: *demo.Spec.DeepCopy()}
	cluster.Spec.ControlPlaneRef.Name = name + "-control-plane"
	cluster.Spec.InfrastructureRef.Name = name
	kcp := &controlplanev1.KubeadmControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: demo.Namespace, Name: cluster.Spec.ControlPlaneRef.Name, Finalizers: []string{"e2e.cp-rollout.io/hold"}},
		Spec:       kcpOf(t, e).Spec,
	}
	if err := c.Create(ctx, kcp); err != nil {
		t.Fatal(err)
	}
	mutate(cluster)
	if err := c.Create(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	return cluster
}

func ptrTo(s string) *string { return &s }

// withoutEtcdCA deletes the etcd CA Secret; restore puts it back as it was.
func withoutEtcdCA(t *testing.T, e *env) func() {
	t.Helper()
	orig := &corev1.Secret{}
	if err := e.Sim.ManagementClient().Get(context.Background(), etcdCAKey(e), orig); err != nil {
		t.Fatal(err)
	}
	if err := e.Sim.ManagementClient().Delete(context.Background(), orig); err != nil {
		t.Fatal(err)
	}
	return func() { restoreEtcdCA(t, e, orig) }
}

// withOtherEtcdCA puts a freshly generated CA into the etcd CA Secret, one that
// signed none of the members' certificates; restore puts the real one back.
func withOtherEtcdCA(t *testing.T, e *env) func() {
	t.Helper()
	orig := &corev1.Secret{}
	if err := e.Sim.ManagementClient().Get(context.Background(), etcdCAKey(e), orig); err != nil {
		t.Fatal(err)
	}
	crt, key, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	other := orig.DeepCopy()
	other.Data[secret.TLSCrtDataName], other.Data[secret.TLSKeyDataName] = crt, key
	if err := e.Sim.ManagementClient().Update(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	return func() { restoreEtcdCA(t, e, orig) }
}

// restoreEtcdCA makes the etcd CA Secret hold orig's data again, recreating it
// if it is gone: later rows and the simulator's new members need the real CA.
func restoreEtcdCA(t *testing.T, e *env, orig *corev1.Secret) {
	t.Helper()
	ctx, c := context.Background(), e.Sim.ManagementClient()
	cur := &corev1.Secret{}
	err := c.Get(ctx, etcdCAKey(e), cur)
	switch {
	case apierrors.IsNotFound(err):
		cur = orig.DeepCopy()
		cur.ResourceVersion, cur.UID, cur.CreationTimestamp = "", "", metav1.Time{}
		err = c.Create(ctx, cur)
	case err == nil:
		cur.Data = orig.Data
		err = c.Update(ctx, cur)
	}
	if err != nil {
		t.Fatalf("restoring the etcd CA Secret: %v", err)
	}
}

func isAction(action, phase string) func(map[string]any) bool {
	return func(ev map[string]any) bool { return ev["action"] == action && ev["phase"] == phase }
}

func kcpOf(t *testing.T, e *env) *controlplanev1.KubeadmControlPlane {
	t.Helper()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := e.Sim.ManagementClient().Get(context.Background(), e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	return kcp
}

func TestStatusDuringUpgrade(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 4 * time.Second, DeleteDelay: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	created := run.Until(t, isAction("create", "done"))

	r := e.Plugin(t, ctx, "status", "demo", "-o", "json")
	if r.Code != 0 {
		t.Fatalf("status: exit %d", r.Code)
	}
	var st struct {
		ControlPlane struct{ Paused, PausedByUs bool }
		Operation    *struct{ Operation, Target string }
		Lock         *struct {
			Holder string
			Live   bool
		}
		Machines []struct {
			Name, Node string
			UpToDate   bool
		}
		EtcdMembers []struct {
			Name    string
			Leader  bool
			Healthy bool
		}
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, r.Stdout)
	}
	if st.Operation == nil || st.Operation.Operation != "upgrade" || st.Operation.Target != to || !st.ControlPlane.PausedByUs {
		t.Errorf("status shows no operation record of the upgrade: %+v %+v", st.Operation, st.ControlPlane)
	}
	if st.Lock == nil || !st.Lock.Live {
		t.Errorf("status shows no live lock: %+v", st.Lock)
	}
	found := false
	for _, m := range st.Machines {
		if m.Name == created["machine"] && m.UpToDate {
			found = true
		}
	}
	if !found {
		t.Errorf("status lacks the in-flight replacement %v: %+v", created["machine"], st.Machines)
	}
	leaders := 0
	for _, m := range st.EtcdMembers {
		if m.Leader {
			leaders++
		}
	}
	if len(st.EtcdMembers) < 3 || leaders != 1 {
		t.Errorf("status etcd members %+v: want at least 3 with one leader", st.EtcdMembers)
	}
	// Reading status did not disturb the run: it goes on to its next
	// replacement. (The rest of the upgrade is other scenarios'.)
	run.Until(t, isAction("create", "started"))
	if code := run.Interrupt(); code != 130 {
		t.Fatalf("interrupted upgrade: exit %d, want 130", code)
	}
}

// Interrupted after its first replacement, a run leaves the KCP paused with
// its record and the lock released; handback gives control to KCP, which
// finishes the rollout by itself, never beyond replicas + 1.
func TestHandbackAfterInterruptedUpgrade(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	run.Until(t, isAction("create", "done"))
	if code := run.Interrupt(); code != 130 {
		t.Fatalf("interrupted upgrade: exit %d, want 130", code)
	}
	kcp := kcpOf(t, e)
	if _, ok := kcp.Annotations[clusterv1.PausedAnnotation]; !ok {
		t.Fatal("the interrupted run unpaused the KCP")
	}
	if stderr := run.Stderr(); !strings.Contains(stderr, "KubeadmControlPlane "+kcp.Name+" stays paused") || !strings.Contains(stderr, "holds back the cluster's worker MachineSets") {
		t.Errorf("the interrupted run did not say what its pause leaves behind:\n%s", simtest.Tail(stderr, 5))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.Plugin(t, ctx, "handback", "demo")
	if r.Code != 0 || !strings.Contains(r.Stdout, "KCP will now") {
		t.Fatalf("handback: exit %d\n%s", r.Code, r.Stdout)
	}
	simtest.Eventually(t, 10*time.Minute, "KCP finishing the rollout", func(ctx context.Context) (bool, string, error) {
		ok, why, err := e.Sim.Ready(ctx)
		if ok && !allAt(t, e, to) {
			ok, why = false, "not every machine at "+to
		}
		return ok, why, err
	})
	mon.check(t)
	assertConverged(t, e, 3, to)
}

func allAt(t *testing.T, e *env, version string) bool {
	machines, err := e.Sim.Machines(context.Background())
	if err != nil {
		return false
	}
	for _, m := range machines {
		if m.Spec.Version != version {
			return false
		}
	}
	return true
}

// Interrupted at any point, the same command finishes the job.
func TestInterruptAndResume(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	for _, at := range []func(map[string]any) bool{
		isAction("pause", "done"),
		isAction("await-join", "waiting"),
		isAction("delete", "done"),
	} {
		run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
		run.Until(t, at)
		if code := run.Interrupt(); code != 130 {
			t.Fatalf("interrupted upgrade: exit %d, want 130", code)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to); r.Code != 0 {
		t.Fatalf("resumed upgrade: exit %d", r.Code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}
