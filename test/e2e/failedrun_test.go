package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// A run that fails mid-rollout on an unsafe state (an old machine's etcd
// member stops while the replacement joins) exits 3 and leaves its pause
// explained where people look: a Warning Event on the Cluster and on the
// KubeadmControlPlane saying what the pause blocks and the two ways on, the
// same words on stderr, and status's one line "paused by cp-rollout since T,
// last run failed: REASON". Re-run with --on-failure handback, it still exits
// 3, and keeps the pause while the replacement is joining, or gives the
// control plane back to KCP once nothing is in flight.
func TestFailedRunLeavesAnExplainedPause(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	node, run := failAfterCreate(t, ctx, e)
	blocked := []string{"stays paused by cp-rollout", "remediat", "certificates", "ControlPlaneIsStable", "MachineDeployment rollouts",
		"Re-run the same command to resume", "kubectl cp-rollout handback demo -n " + e.Sim.ClusterKey().Namespace}
	for _, says := range blocked {
		if !strings.Contains(run.Stderr(), says) {
			t.Errorf("stderr does not say %q:\n%s", says, simtest.Tail(run.Stderr(), 10))
		}
	}

	var events eventsv1.EventList
	if err := e.Sim.ManagementClient().List(ctx, &events, client.InNamespace(e.Sim.ClusterKey().Namespace)); err != nil {
		t.Fatal(err)
	}
	warned := map[string]bool{}
	for _, ev := range events.Items {
		if ev.Reason != "PausedAfterFailure" {
			continue
		}
		if ev.Type != "Warning" || ev.ReportingController != "cp-rollout" || !strings.Contains(ev.Note, "failed (exit 3, unsafe)") || !strings.Contains(ev.Note, node) {
			t.Errorf("event %s on %s/%s: %s by %s: %q", ev.Name, ev.Regarding.Kind, ev.Regarding.Name, ev.Type, ev.ReportingController, ev.Note)
		}
		for _, says := range blocked {
			if !strings.Contains(ev.Note, says) {
				t.Errorf("event on %s does not say %q: %q", ev.Regarding.Kind, says, ev.Note)
			}
		}
		warned[ev.Regarding.Kind+"/"+ev.Regarding.Name] = true
	}
	if !warned["Cluster/demo"] || !warned["KubeadmControlPlane/"+e.Sim.KCPKey().Name] {
		t.Errorf("PausedAfterFailure Warning Events on %v, want the Cluster and the KubeadmControlPlane", warned)
	}

	st := e.Plugin(t, ctx, "status", "demo")
	line := ""
	for _, l := range strings.Split(st.Stdout, "\n") {
		if strings.HasPrefix(l, "CONTROL PLANE") {
			line = l
		}
	}
	if !strings.Contains(line, "paused by cp-rollout since ") || !strings.Contains(line, ", last run failed: ") || !strings.Contains(line, node) {
		t.Errorf("status's control-plane line %q: want the pause and the failure naming %s", line, node)
	}
	var js struct {
		ControlPlane struct{ State string }
		Operation    *record.Record
	}
	if r := e.Plugin(t, ctx, "status", "demo", "-o", "json"); json.Unmarshal([]byte(r.Stdout), &js) != nil ||
		js.Operation == nil || js.Operation.LastFailure == nil || js.Operation.LastFailure.ExitCode != 3 || !strings.Contains(js.ControlPlane.State, "last run failed: ") {
		t.Errorf("status -o json: state %q, operation %+v", js.ControlPlane.State, js.Operation)
	}

	// The replacement cannot join while the member is down (etcd refuses a
	// new member that would leave no quorum without it): it is in flight,
	// so --on-failure handback keeps the pause and says why.
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--unhealthy-grace", "3s", "--on-failure", "handback")
	if r.Code != 3 || !strings.Contains(r.Stderr, "stays paused: machine ") || !strings.Contains(r.Stderr, "is still joining") {
		t.Fatalf("re-run with --on-failure handback while the replacement joins: exit %d, stderr:\n%s", r.Code, simtest.Tail(r.Stderr, 15))
	}
	if _, paused := kcpOf(t, e).Annotations[clusterv1.PausedAnnotation]; !paused {
		t.Fatal("handed back while the replacement was still joining")
	}

	// Once the member is back the replacement joins; then the member stops
	// again. Nothing is in flight now: the re-run, refused on the stopped
	// member, still exits 3, and hands back.
	if err := e.Sim.RestartMember(ctx, node); err != nil {
		t.Fatal(err)
	}
	awaitReplacementsHealthy(t, ctx, e)
	if err := e.Sim.StopMember(node); err != nil {
		t.Fatal(err)
	}
	r = e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--unhealthy-grace", "3s", "--on-failure", "handback")
	if r.Code != 3 || !strings.Contains(r.Stderr, "handed back to KCP") {
		t.Fatalf("re-run with --on-failure handback: exit %d, stderr:\n%s", r.Code, simtest.Tail(r.Stderr, 15))
	}
	kcp := kcpOf(t, e)
	if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused || kcp.Annotations[record.Annotation] != "" {
		t.Errorf("after --on-failure handback the KubeadmControlPlane still carries %v", kcp.Annotations)
	}
}

// failAfterCreate makes an upgrade fail with exit 3 mid-rollout: an old
// member stops right after the first replacement is created. It returns that
// member's node and the finished run. Not the leader's member: its election
// would only blur which fault stopped the run.
func failAfterCreate(t *testing.T, ctx context.Context, e *env) (string, *simtest.Running) {
	t.Helper()
	node := nonLeaderNode(t, ctx, e)
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json", "--unhealthy-grace", "3s")
	run.Until(t, isAction("create", "done"))
	if err := e.Sim.StopMember(node); err != nil {
		t.Fatal(err)
	}
	if code := run.Wait(); code != 3 {
		t.Fatalf("exit %d after member %s stopped, want 3; stderr:\n%s", code, node, simtest.Tail(run.Stderr(), 15))
	}
	return node, run
}

// nonLeaderNode names the node of an etcd member that does not lead.
func nonLeaderNode(t *testing.T, ctx context.Context, e *env) string {
	t.Helper()
	members, err := e.Sim.EtcdMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.Sim.EtcdClient(ctx, members[0].ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	status, err := c.Status(ctx, members[0].ClientURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if m.ID != status.Leader && m.Name != "" {
			return m.Name
		}
	}
	t.Fatalf("no member but the leader among %+v", members)
	return ""
}

// awaitReplacementsHealthy waits until every machine at the target version
// is healthy as status sees it.
func awaitReplacementsHealthy(t *testing.T, ctx context.Context, e *env) {
	t.Helper()
	last := ""
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		r := e.Plugin(t, ctx, "status", "demo", "-o", "json")
		last = r.Stdout
		var st struct {
			Machines []struct{ Name, Version, Problem string }
		}
		if json.Unmarshal([]byte(r.Stdout), &st) != nil {
			continue
		}
		healthy, joining := 0, 0
		for _, m := range st.Machines {
			switch {
			case m.Version != to:
			case m.Problem == "":
				healthy++
			default:
				joining++
			}
		}
		if healthy > 0 && joining == 0 {
			return
		}
	}
	t.Fatalf("the replacement never became healthy; last status:\n%s", last)
}

// What a failed run's pause holds back, and what handing back gives back:
// while the KubeadmControlPlane stays paused mid-upgrade, Cluster API's
// MachineSet preflight creates no worker machine for a scaled-up
// MachineDeployment (ControlPlaneIsStable). Once the operator has fixed the
// fault and run `handback`, KCP finishes the upgrade, and the
// MachineDeployment, moved to the new version as the kubeadm skew policy
// asks (KubeadmVersionSkew: workers join at the control plane's minor),
// rolls out and scales.
func TestWorkersScaleAfterHandbackOfAFailedRun(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, Workers: 1, Version: from, ProvisionDelay: time.Second, DeleteDelay: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()

	node, _ := failAfterCreate(t, ctx, e)

	mds := &clusterv1.MachineDeploymentList{}
	if err := c.List(ctx, mds, client.InNamespace(e.Sim.ClusterKey().Namespace)); err != nil || len(mds.Items) != 1 {
		t.Fatalf("MachineDeployments: %v, %d", err, len(mds.Items))
	}
	md := &mds.Items[0]
	if err := c.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":2}}`))); err != nil {
		t.Fatal(err)
	}
	workers := func() (n, at int) {
		ws, err := e.Sim.Workers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if w.DeletionTimestamp.IsZero() {
				n++
				if w.Spec.Version == to && w.Status.NodeRef.IsDefined() {
					at++
				}
			}
		}
		return n, at
	}
	// Long enough for the MachineSet controller to have created the worker
	// were it free to: machines of this simulator appear within a second.
	time.Sleep(15 * time.Second)
	if n, _ := workers(); n != 1 {
		t.Fatalf("%d worker machines while the control plane stays paused mid-upgrade, want 1 (held back by the MachineSet preflight)", n)
	}

	if err := e.Sim.RestartMember(ctx, node); err != nil {
		t.Fatal(err)
	}
	if r := e.Plugin(t, ctx, "handback", "demo"); r.Code != 0 {
		t.Fatalf("handback: exit %d", r.Code)
	}
	simtest.Eventually(t, 8*time.Minute, "KCP finished the upgrade", func(ctx context.Context) (bool, string, error) {
		v := kcpOf(t, e).Status.Versions
		return len(v) == 1 && v[0].Version == to, fmt.Sprintf("KCP reports %v", v), nil
	})
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"version":%q}}}}`, to)
	if err := c.Patch(ctx, md, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	simtest.Eventually(t, 5*time.Minute, "two workers at "+to, func(ctx context.Context) (bool, string, error) {
		n, at := workers()
		return n == 2 && at == 2, fmt.Sprintf("%d workers, %d of them at %s with a node", n, at, to), nil
	})
}
