package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

	"github.com/cp-rollout/cp-rollout/pkg/sim"
	"github.com/cp-rollout/cp-rollout/pkg/sim/member"
)

func fastSim(t *testing.T, replicas int32) *env {
	return startSim(t, sim.Options{Replicas: replicas, Version: from, ProvisionDelay: time.Second, DeleteDelay: 500 * time.Millisecond})
}

// versions records the resourceVersion of the Cluster, the KCP and every
// Machine: equal before and after means nothing was changed.
func versions(t *testing.T, e *env) map[string]string {
	t.Helper()
	ctx := context.Background()
	c := e.sim.ManagementClient()
	out := map[string]string{}
	cluster := &clusterv1.Cluster{}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, e.sim.ClusterKey(), cluster); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, e.sim.KCPKey(), kcp); err != nil {
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

func TestScaleUpThenDown(t *testing.T) {
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	mon := watchInvariants(t, e, 5, 2)
	if r := e.plugin(t, ctx, "scale", "demo", "--replicas", "5"); r.code != 0 {
		t.Fatalf("scale to 5: exit %d", r.code)
	}
	mon.check(t)
	assertConverged(t, e, 5, from)

	mon = watchInvariants(t, e, 5, 3)
	if r := e.plugin(t, ctx, "scale", "demo", "--replicas", "3"); r.code != 0 {
		t.Fatalf("scale to 3: exit %d", r.code)
	}
	mon.check(t)
	assertConverged(t, e, 3, from)
}

func TestReplaceOneMachine(t *testing.T) {
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, surge := range []string{"1", "0"} {
		machines, err := e.sim.Machines(ctx)
		if err != nil {
			t.Fatal(err)
		}
		victim := machines[1].Name
		max := 4
		if surge == "0" {
			max = 3
		}
		mon := watchInvariants(t, e, max, 2)
		if r := e.plugin(t, ctx, "replace", "demo", victim, "--max-surge", surge); r.code != 0 {
			t.Fatalf("replace %s (surge %s): exit %d", victim, surge, r.code)
		}
		mon.check(t)
		assertConverged(t, e, 3, from)
		after, _ := e.sim.Machines(ctx)
		for _, m := range after {
			if m.Name == victim {
				t.Fatalf("surge %s: %s still there", surge, victim)
			}
		}
		// A runbook re-running the finished replace (say, after a crash that
		// hid its exit code) is told it is done, not that the machine is unknown.
		if r := e.plugin(t, ctx, "replace", "demo", victim, "--max-surge", surge); r.code != 0 || !strings.Contains(r.stderr, "was replaced by") {
			t.Errorf("re-run of replace %s: exit %d, want 0 saying it was replaced", victim, r.code)
		}
	}
}

func TestPlanExitCodeAndDryRunChangeNothing(t *testing.T) {
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before := quietVersions(t, e)

	if r := e.plugin(t, ctx, "plan", "demo", "--version", from, "--exit-code"); r.code != 0 {
		t.Errorf("plan at the current version: exit %d, want 0", r.code)
	}
	r := e.plugin(t, ctx, "plan", "demo", "--version", to, "--exit-code", "-o", "json")
	if r.code != 10 {
		t.Errorf("plan of an upgrade: exit %d, want 10", r.code)
	}
	var plan struct {
		Steps []struct{ Action, Machine string }
	}
	if err := json.Unmarshal([]byte(r.stdout), &plan); err != nil {
		t.Fatalf("plan -o json: %v\n%s", err, r.stdout)
	}
	if len(plan.Steps) != 6 || plan.Steps[0].Action != "create" || plan.Steps[1].Action != "delete" {
		t.Errorf("plan steps %+v, want create/delete three times", plan.Steps)
	}
	for _, args := range [][]string{
		{"upgrade", "demo", "--version", to, "--dry-run"},
		{"scale", "demo", "--replicas", "5", "--dry-run"},
		{"replace", "demo", plan.Steps[1].Machine, "--dry-run"},
	} {
		if r := e.plugin(t, ctx, args...); r.code != 0 || !strings.Contains(r.stdout, "create") {
			t.Errorf("%v: exit %d, want 0 and a plan:\n%s", args, r.code, r.stdout)
		}
	}
	assertUnchanged(t, before, versions(t, e))
}

func TestBadInputChangesNothing(t *testing.T) {
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A worker machine of the same cluster: not a control-plane machine.
	worker := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "demo-md-0-abc12", Namespace: "default",
		Labels: map[string]string{clusterv1.ClusterNameLabel: "demo"}}}
	worker.Spec.ClusterName = "demo"
	worker.Spec.Bootstrap.DataSecretName = ptrTo("none")
	worker.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "GenericInfrastructureMachine", Name: "none"}
	if err := e.sim.ManagementClient().Create(ctx, worker); err != nil {
		t.Fatal(err)
	}
	// A Cluster whose control plane is not a KubeadmControlPlane.
	other := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "no-kcp", Namespace: "default"}}
	other.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.example.com", Kind: "OtherControlPlane", Name: "x"}
	if err := e.sim.ManagementClient().Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	badConfig := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(badConfig, []byte("namespace: default\n\tcontext: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// expect runs the plugin and checks its exit code and one-line reason,
	// which must name every fragment in says.
	expect := func(args []string, code int, says ...string) {
		t.Helper()
		r := e.plugin(t, ctx, args...)
		named := true
		for _, s := range says {
			named = named && strings.Contains(r.stderr, s)
		}
		if r.code != code || !named {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", args, r.code, r.stderr, code, says)
		}
		if lines := strings.Count(strings.TrimSpace(r.stderr), "\n") + 1; lines > 2 {
			t.Errorf("%v: %d lines on stderr, want the reason and at most a usage hint", args, lines)
		}
	}
	before := quietVersions(t, e)
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"upgrade", "demo", "--version", "1.36.3"}, 2, `must start with "v"`},
		{[]string{"upgrade", "demo", "--version", "v1.36"}, 2, "not a semantic version"},
		{[]string{"upgrade", "demo", "--version", "vlatest"}, 2, "not a semantic version"},
		{[]string{"upgrade", "demo", "--version", "v1.36.3.1"}, 2, "not a semantic version"},
		{[]string{"upgrade", "demo"}, 2, "--version is required"},
		{[]string{"upgrade", "demo", "--version", "v1.34.0"}, 2, "downgrade"},
		{[]string{"upgrade", "demo", "--version", "v1.35.1"}, 2, "downgrade"},
		{[]string{"upgrade", "demo", "--version", "v1.37.0"}, 2, "skips a minor"},
		{[]string{"upgrade", "demo", "--version", "v2.0.0"}, 2, "skips a minor"},
		{[]string{"upgrade", "demo", "--version", to, "--max-surge", "2"}, 2, "--max-surge must be 0 or 1"},
		{[]string{"upgrade", "demo", "--version", to, "--health-timeout", "-1m"}, 2, "must not be negative"},
		{[]string{"upgrade", "demo", "--version", to, "--etcd-endpoint", "https://{{.Nope}}:2379"}, 2, "--etcd-endpoint"},
		{[]string{"scale", "demo", "--replicas", "0"}, 2, "at least 1"},
		{[]string{"scale", "demo", "--replicas", "2"}, 2, "odd"},
		{[]string{"scale", "demo", "--replicas", "4"}, 2, "odd"},
		{[]string{"scale", "demo", "--replicas", "-1"}, 2, "at least 1"},
		{[]string{"scale", "demo"}, 2, "--replicas is required"},
		{[]string{"scale", "demo", "--replicas", "1", "--max-surge", "0"}, 2, "--max-surge 0 needs at least 3"},
		{[]string{"replace", "demo", worker.Name}, 2, "not a control-plane machine"},
		{[]string{"replace", "demo", "no-such-machine"}, 2, "not a control-plane machine"},
		{[]string{"replace", "demo"}, 2, "two arguments"},
		{[]string{"plan", "demo", "--version", to, "--replicas", "3"}, 2, "not several"},
		{[]string{"plan", "demo"}, 2, "needs one of --version, --replicas or --replace"},
		{[]string{"upgrade", "nope", "--version", to}, 3, "cluster default/nope not found"},
		{[]string{"upgrade", "demo", "--version", to, "-n", "no-such-namespace"}, 3, "not found"},
		{[]string{"upgrade", "demo", "--version", to, "--context", "no-such-context"}, 2, "no-such-context"},
		{[]string{"upgrade", "no-kcp", "--version", to}, 3, "not a KubeadmControlPlane"},
		{[]string{"upgrade", "demo", "--version", to, "--kcp-version", "v1.13.2"}, 3, "supports v1.14.x"},
		{[]string{"upgrade", "demo", "--version", to, "--as", "nobody"}, 1, "forbidden"},
		{[]string{"upgrade", "demo", "--version", to, "--config", badConfig}, 2, "line 2"},
		{[]string{"upgarde", "demo"}, 2, "unknown command"},
	} {
		expect(tc.args, tc.code, tc.says)
	}
	// A broken etcd CA Secret: each row breaks it before the command and puts
	// it back after. The tool must refuse, never skip verifying the members.
	for _, tc := range []struct {
		breakCA func(t *testing.T, e *env) (restore func())
		says    []string
	}{
		{withoutEtcdCA, []string{"etcd CA Secret default/demo-etcd not found"}},
		{withOtherEtcdCA, []string{"not signed by the etcd CA in Secret default/demo-etcd", "on node "}},
	} {
		restore := tc.breakCA(t, e)
		expect([]string{"upgrade", "demo", "--version", to}, 3, tc.says...)
		restore()
	}
	// Clusters the tool must not take over: siblings of demo sharing its
	// KubeadmControlPlane and workload cluster, so a wrong take-over would
	// show in demo's resourceVersions.
	sibling(t, e, "stopped", func(c *clusterv1.Cluster) { c.Spec.Paused = ptr.To(true) })
	expect([]string{"upgrade", "stopped", "--version", to}, 3, "cluster stopped is paused")
	sibling(t, e, "classy", func(c *clusterv1.Cluster) {
		c.Spec.Topology = clusterv1.Topology{ClassRef: clusterv1.ClusterClassRef{Name: "some-class"}, Version: from}
	})
	expect([]string{"upgrade", "classy", "--version", to}, 3, "managed by ClusterClass some-class")
	doomed := sibling(t, e, "doomed", func(c *clusterv1.Cluster) { c.Finalizers = []string{"e2e.cp-rollout.io/hold"} })
	if err := e.sim.ManagementClient().Delete(ctx, doomed); err != nil {
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
	if err := e.sim.ManagementClient().Patch(ctx, kcp, patch); err != nil {
		t.Fatal(err)
	}
	paused := quietVersions(t, e) // KCP reports Paused first
	expect([]string{"upgrade", "demo", "--version", to}, 3, "paused by someone else")
	assertUnchanged(t, paused, versions(t, e))
}

// sibling creates a Cluster named name that shares demo's KubeadmControlPlane,
// kubeconfig and etcd CA, changed by mutate.
func sibling(t *testing.T, e *env, name string, mutate func(*clusterv1.Cluster)) *clusterv1.Cluster {
	t.Helper()
	ctx, c := context.Background(), e.sim.ManagementClient()
	demo := &clusterv1.Cluster{}
	if err := c.Get(ctx, e.sim.ClusterKey(), demo); err != nil {
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
	if err := e.sim.ManagementClient().Get(context.Background(), etcdCAKey(e), orig); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.ManagementClient().Delete(context.Background(), orig); err != nil {
		t.Fatal(err)
	}
	return func() { restoreEtcdCA(t, e, orig) }
}

// withOtherEtcdCA puts a freshly generated CA into the etcd CA Secret, one that
// signed none of the members' certificates; restore puts the real one back.
func withOtherEtcdCA(t *testing.T, e *env) func() {
	t.Helper()
	orig := &corev1.Secret{}
	if err := e.sim.ManagementClient().Get(context.Background(), etcdCAKey(e), orig); err != nil {
		t.Fatal(err)
	}
	crt, key, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	other := orig.DeepCopy()
	other.Data[secret.TLSCrtDataName], other.Data[secret.TLSKeyDataName] = crt, key
	if err := e.sim.ManagementClient().Update(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	return func() { restoreEtcdCA(t, e, orig) }
}

// restoreEtcdCA makes the etcd CA Secret hold orig's data again, recreating it
// if it is gone: later rows and the simulator's new members need the real CA.
func restoreEtcdCA(t *testing.T, e *env, orig *corev1.Secret) {
	t.Helper()
	ctx, c := context.Background(), e.sim.ManagementClient()
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

// startPlugin starts `kubectl cp-rollout args... -o json` and streams its
// events; stop sends SIGINT.
type running struct {
	cmd     *exec.Cmd
	events  chan map[string]any
	done    chan struct{}
	code    int
	errPath string
}

// stderr is what the run has written to its standard error so far.
func (r *running) stderr() string {
	raw, _ := os.ReadFile(r.errPath)
	return string(raw)
}

func (e *env) start(t *testing.T, args ...string) *running {
	t.Helper()
	cmd := e.command(t, context.Background(), args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "stderr")
	f, _ := os.Create(logFile)
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &running{cmd: cmd, events: make(chan map[string]any, 1000), done: make(chan struct{}), errPath: logFile}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				r.events <- ev
			}
		}
		_ = cmd.Wait()
		f.Close()
		r.code = cmd.ProcessState.ExitCode()
		raw, _ := os.ReadFile(logFile)
		t.Logf("kubectl cp-rollout %s: exit %d\n%s", strings.Join(args, " "), r.code, tail(string(raw), 20))
		close(r.events)
		close(r.done)
	}()
	return r
}

// until reads events until one matches.
func (r *running) until(t *testing.T, match func(map[string]any) bool) map[string]any {
	t.Helper()
	timeout := time.After(5 * time.Minute)
	for {
		select {
		case ev, ok := <-r.events:
			if !ok {
				t.Fatal("the run ended before the awaited event")
			}
			if match(ev) {
				return ev
			}
		case <-timeout:
			t.Fatal("awaited event did not come")
		}
	}
}

func (r *running) interrupt() int {
	// kubectl execs the plugin in its own place, so this is the plugin's pid.
	_ = r.cmd.Process.Signal(syscall.SIGINT)
	<-r.done
	return r.code
}

func (r *running) wait() int {
	for range r.events {
	}
	<-r.done
	return r.code
}

func isAction(action, phase string) func(map[string]any) bool {
	return func(ev map[string]any) bool { return ev["action"] == action && ev["phase"] == phase }
}

func kcpOf(t *testing.T, e *env) *controlplanev1.KubeadmControlPlane {
	t.Helper()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := e.sim.ManagementClient().Get(context.Background(), e.sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	return kcp
}

func TestStatusDuringUpgrade(t *testing.T) {
	e := startSim(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 4 * time.Second, DeleteDelay: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := e.start(t, "upgrade", "demo", "--version", to, "-o", "json")
	created := run.until(t, isAction("create", "done"))

	r := e.plugin(t, ctx, "status", "demo", "-o", "json")
	if r.code != 0 {
		t.Fatalf("status: exit %d", r.code)
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
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, r.stdout)
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
	if code := run.wait(); code != 0 {
		t.Fatalf("upgrade exit %d", code)
	}
	assertConverged(t, e, 3, to)
}

// Interrupted after its first replacement, a run leaves the KCP paused with
// its record and the lock released; handback gives control to KCP, which
// finishes the rollout by itself, never beyond replicas + 1.
func TestHandbackAfterInterruptedUpgrade(t *testing.T) {
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	run := e.start(t, "upgrade", "demo", "--version", to, "-o", "json")
	run.until(t, isAction("create", "done"))
	if code := run.interrupt(); code != 130 {
		t.Fatalf("interrupted upgrade: exit %d, want 130", code)
	}
	kcp := kcpOf(t, e)
	if _, ok := kcp.Annotations[clusterv1.PausedAnnotation]; !ok {
		t.Fatal("the interrupted run unpaused the KCP")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.plugin(t, ctx, "handback", "demo")
	if r.code != 0 || !strings.Contains(r.stdout, "KCP will now") {
		t.Fatalf("handback: exit %d\n%s", r.code, r.stdout)
	}
	waitFor(t, ctx, func() bool { ok, _, _ := e.sim.Ready(ctx); return ok && allAt(t, e, to) })
	mon.check(t)
	assertConverged(t, e, 3, to)
}

func allAt(t *testing.T, e *env, version string) bool {
	machines, err := e.sim.Machines(context.Background())
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
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	for _, at := range []func(map[string]any) bool{
		isAction("pause", "done"),
		isAction("await-join", "waiting"),
		isAction("delete", "done"),
	} {
		run := e.start(t, "upgrade", "demo", "--version", to, "-o", "json")
		run.until(t, at)
		if code := run.interrupt(); code != 130 {
			t.Fatalf("interrupted upgrade: exit %d, want 130", code)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if r := e.plugin(t, ctx, "upgrade", "demo", "--version", to); r.code != 0 {
		t.Fatalf("resumed upgrade: exit %d", r.code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}
