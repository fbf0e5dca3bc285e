package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/audit"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

const (
	from = "v1.35.2"
	to   = "v1.36.3"
)

// Both three-replica upgrades run on three failure domains, as a real
// provider's zones: the machines start one per domain and must end so.
func TestUpgradeThreeReplicasSurgeOne(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, FailureDomains: 3, Version: from, ProvisionDelay: 2 * time.Second, DeleteDelay: time.Second})
	e.AwaitKCP = true
	simtest.AssertOnePerDomain(t, e.Sim)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "-o", "json")
	mon.check(t)
	if r.Code != 0 {
		t.Fatalf("upgrade exit %d", r.Code)
	}
	if strings.Contains(r.Stderr, "goroutine") || strings.Contains(r.Stderr, "SetLogger") {
		t.Errorf("stderr carries a library's warning with its stack:\n%s", simtest.Tail(r.Stderr, 20))
	}
	evs := simtest.Events(t, r.Stdout)
	for _, ev := range evs {
		for _, k := range []string{"time", "cluster", "namespace", "action", "phase"} {
			if _, ok := ev[k]; !ok {
				t.Fatalf("event lacks %q: %v", k, ev)
			}
		}
	}
	// The summary closes the run, after the hand-back and KCP's agreement
	// that the rollout is done, which it accounts for.
	if last, settled := evs[len(evs)-1], evs[len(evs)-2]; last["action"] != "summary" || settled["action"] != "await-kcp" || settled["phase"] != "done" {
		t.Errorf("last events %v, %v; want KCP's agreement after the hand-back, then the summary", settled, last)
	}
	// Done means done: when the tool exits, KCP has already reconciled and
	// reports the target, not what it saw before it was paused.
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := e.Sim.ManagementClient().Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	if v := kcp.Status.Versions; kcp.Status.ObservedGeneration != kcp.Generation || len(v) != 1 || v[0].Version != to || v[0].Replicas != 3 ||
		conditions.IsTrue(kcp, clusterv1.PausedCondition) {
		t.Errorf("at exit KCP reports generation %d of %d, versions %v, Paused %v; want the current spec, 3 machines at %s, not paused",
			kcp.Status.ObservedGeneration, kcp.Generation, v, conditions.IsTrue(kcp, clusterv1.PausedCondition), to)
	}
	// ... and has already moved kube-proxy, which it does in that reconcile.
	proxy := &appsv1.DaemonSet{}
	if err := e.Sim.WorkloadClient().Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "kube-proxy"}, proxy); err != nil {
		t.Fatal(err)
	} else if img := proxy.Spec.Template.Spec.Containers[0].Image; img != "registry.k8s.io/kube-proxy:"+to {
		t.Errorf("at exit kube-proxy runs %s, want KCP's retag to %s", img, to)
	}
	// It counts the run's round trips to each cluster and to etcd.
	if req, _ := evs[len(evs)-1]["requests"].(map[string]any); req == nil ||
		req["management"].(float64) < 1 || req["workload"].(float64) < 1 || req["etcd"].(float64) < 1 {
		t.Errorf("summary requests %v: want round trips counted to the management and workload API servers and to etcd", evs[len(evs)-1]["requests"])
	} else {
		t.Logf("requests: %v", req)
	}
	assertConverged(t, e, 3, to)
	simtest.AssertOnePerDomain(t, e.Sim)
	assertKCPIdle(t, e)
	assertAuditTrail(t, ctx, e, evs)

	// Re-running the finished upgrade has nothing to do.
	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to); r.Code != 0 || !strings.Contains(r.Stderr, "nothing to do") {
		t.Errorf("re-run: exit %d, want 0 with \"nothing to do\"", r.Code)
	}
	// status tells a colleague what was done last, and when it finished.
	var st struct {
		Operation     any
		LastOperation *struct {
			Operation, Target string
			Finished          *time.Time
		}
	}
	if r := e.Plugin(t, ctx, "status", "demo", "-o", "json"); r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &st) != nil {
		t.Fatalf("status -o json: exit %d\n%s", r.Code, r.Stdout)
	}
	if l := st.LastOperation; st.Operation != nil || l == nil || l.Operation != "upgrade" || l.Target != to || l.Finished == nil {
		t.Errorf("status after the upgrade: operation %v, last operation %+v; want none in progress and the finished upgrade to %s", st.Operation, l, to)
	}
}

func TestUpgradeThreeReplicasSurgeZero(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, FailureDomains: 3, Version: from, ProvisionDelay: 2 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 3, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--max-surge", "0")
	mon.check(t)
	if r.Code != 0 {
		t.Fatalf("upgrade exit %d", r.Code)
	}
	assertConverged(t, e, 3, to)
	simtest.AssertOnePerDomain(t, e.Sim)
}

// The scenario of CAPI issue 2915: one replica, room for one more machine.
func TestUpgradeOneReplicaCapacityTwo(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 1, Version: from, Capacity: 2, ProvisionDelay: 2 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 2, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to)
	mon.check(t)
	if r.Code != 0 {
		t.Fatalf("upgrade exit %d", r.Code)
	}
	assertConverged(t, e, 1, to)
}

// An upgrade started while a control-plane machine is deleting finishes that
// deletion first, and never counts the deleting machine as one to replace.
// Another controller's pre-drain hook holds the deletion until the tool is
// seen waiting on it: on a loaded machine the deletion would otherwise be
// over before the tool's first read.
func TestUpgradeWaitsForDeletingMachine(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 2 * time.Second, DeleteDelay: 3 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := &machines[0]
	const hold = clusterv1.PreDrainDeleteHookAnnotationPrefix + "/e2e-hold"
	patch := client.MergeFrom(victim.DeepCopy())
	victim.Annotations[hold] = ""
	if err := c.Patch(ctx, victim, patch); err != nil {
		t.Fatal(err)
	}
	// KCP (running) waits for the deletion before it does anything else.
	if err := c.Delete(ctx, victim); err != nil {
		t.Fatal(err)
	}
	simtest.Eventually(t, 10*time.Minute, victim.Name+" deleting", func(ctx context.Context) (bool, string, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(victim), victim)
		return err == nil && !victim.DeletionTimestamp.IsZero(), "not deleting yet", err
	})
	mon := watchInvariants(t, e, 4, 2)
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	first := run.Until(t, func(ev map[string]any) bool {
		a := stringOf(ev["action"])
		return a == "create" || a == "delete" || a == "await-deletion"
	})
	if got := stringOf(first["action"]) + " " + stringOf(first["machine"]); got != "await-deletion "+victim.Name {
		t.Errorf("first step %q, want waiting for the deletion of %s", got, victim.Name)
	}
	patch = client.MergeFrom(victim.DeepCopy())
	delete(victim.Annotations, hold)
	if err := c.Patch(ctx, victim, patch); err != nil {
		t.Fatal(err)
	}
	if code := run.Wait(); code != 0 {
		t.Fatalf("upgrade exit %d", code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}

// assertAuditTrail: `kubectl events` on the KubeadmControlPlane lists every
// step the run reported done or failed, with its machine as related object,
// reported by cp-rollout, but for the waits that ended well.
func assertAuditTrail(t *testing.T, ctx context.Context, e *env, evs []map[string]any) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "kubectl", "events", "-n", e.Sim.KCPKey().Namespace,
		"--for", "kubeadmcontrolplane/"+e.Sim.KCPKey().Name, "-o", "json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl events: %v", err)
	}
	var list corev1.EventList
	if err := json.Unmarshal(out, &list); err != nil {
		t.Fatalf("kubectl events -o json: %v\n%s", err, out)
	}
	recorded := map[string]int{}
	for _, ev := range list.Items {
		if ev.ReportingController == "cp-rollout" {
			machine := ""
			if ev.Related != nil {
				machine = ev.Related.Name
			}
			recorded[ev.Action+" "+machine]++
			if ev.Type == corev1.EventTypeNormal && !audit.Records(ev.Action, progress.Done) {
				t.Errorf("kubectl events lists %s %s %q: a wait is recorded only when it fails", ev.Action, machine, ev.Message)
			}
		}
	}
	want := map[string]int{}
	for _, ev := range evs {
		if ev["action"] != "summary" && audit.Records(stringOf(ev["action"]), progress.Phase(stringOf(ev["phase"]))) {
			want[stringOf(ev["action"])+" "+stringOf(ev["machine"])]++
		}
	}
	for step, n := range want {
		if recorded[step] < n {
			t.Errorf("kubectl events lists %q %d times, the run did it %d times", step, recorded[step], n)
		}
	}
	if t.Failed() {
		t.Logf("recorded: %v", recorded)
	}
}
