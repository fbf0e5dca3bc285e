package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// deadMachineSim starts a 3-replica simulator and breaks its oldest
// control-plane machine for good, as a crashed host whose kubelet still
// reports: its etcd member stopped, its API server pod unready. It returns the
// machine's name and an invariant monitor that wants two healthy voters
// throughout.
func deadMachineSim(t *testing.T, ctx context.Context) (e *env, dead string, mon *monitor) {
	t.Helper()
	e = fastSim(t, 3)
	oldest := oldestMachine(t, ctx, e)
	node := oldest.Status.NodeRef.Name
	if err := e.Sim.StopMember(node); err != nil {
		t.Fatal(err)
	}
	if err := e.Sim.SetStaticPodReady(ctx, node, "kube-apiserver", false); err != nil {
		t.Fatal(err)
	}
	return e, oldest.Name, watchInvariants(t, e, 4, 2)
}

// oldestMachine is the cluster's oldest control-plane machine.
func oldestMachine(t *testing.T, ctx context.Context, e *env) clusterv1.Machine {
	t.Helper()
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldest := machines[0]
	for _, m := range machines[1:] {
		if m.CreationTimestamp.Before(&oldest.CreationTimestamp) {
			oldest = m
		}
	}
	return oldest
}

// machineGone fails the test if machine is still there.
func machineGone(t *testing.T, ctx context.Context, e *env, machine string) {
	t.Helper()
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		if m.Name == machine {
			t.Errorf("machine %s is still there", machine)
		}
	}
}

// machineSteps lists the machine steps a run's JSON events report done, in
// order, as "create NAME" or "delete NAME".
func machineSteps(t *testing.T, stdout string) []string {
	t.Helper()
	var steps []string
	for _, ev := range simtest.Events(t, stdout) {
		if ev["phase"] == "done" && (ev["action"] == "create" || ev["action"] == "delete") {
			machine, _ := ev["machine"].(string)
			steps = append(steps, ev["action"].(string)+" "+machine)
		}
	}
	return steps
}

// A machine dead for good (member stopped, API server pod unready) stalls any
// rollout: `upgrade` refuses at once, changing nothing and naming the machine
// and the replace command; `replace` of it then deletes it first (its member
// is lost, so a surge would count against quorum) and converges with two
// healthy voters throughout, and KCP, handed back, finds nothing to do.
func TestReplaceDeadMachine(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e, dead, mon := deadMachineSim(t, ctx)

	before := quietVersions(t, e)
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to)
	if r.Code != 3 {
		t.Fatalf("upgrade with machine %s dead: exit %d, want 3", dead, r.Code)
	}
	for _, want := range []string{"machine " + dead, "kubectl cp-rollout replace demo " + dead, "--replace-unhealthy", "nothing was changed"} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("upgrade's refusal lacks %q:\n%s", want, r.Stderr)
		}
	}
	assertUnchanged(t, before, versions(t, e))

	began := time.Now()
	r = e.Plugin(t, ctx, "replace", "demo", dead, "-o", "json")
	if r.Code != 0 {
		t.Fatalf("replace of dead machine %s: exit %d", dead, r.Code)
	}
	t.Logf("replace of a dead machine took %s", time.Since(began).Round(100*time.Millisecond))
	if steps := machineSteps(t, r.Stdout); len(steps) != 2 || steps[0] != "delete "+dead || !strings.HasPrefix(steps[1], "create ") {
		t.Errorf("machine steps %q, want the dead machine deleted before its replacement is created", steps)
	}
	mon.check(t)
	machineGone(t, ctx, e, dead)
	assertConverged(t, e, 3, from)
	assertKCPIdle(t, e)
}

// `upgrade --replace-unhealthy` replaces the dead machine as its first step,
// then upgrades the others.
func TestUpgradeReplacesUnhealthy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e, dead, mon := deadMachineSim(t, ctx)

	plan := e.Plugin(t, ctx, "plan", "demo", "--version", to, "--replace-unhealthy")
	if plan.Code != 0 || !strings.Contains(plan.Stdout, dead) {
		t.Errorf("plan --replace-unhealthy: exit %d, want 0 and a plan that names %s:\n%s", plan.Code, dead, plan.Stdout)
	}
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--replace-unhealthy", "-o", "json")
	if r.Code != 0 {
		t.Fatalf("upgrade --replace-unhealthy with machine %s dead: exit %d", dead, r.Code)
	}
	if steps := machineSteps(t, r.Stdout); len(steps) == 0 || steps[0] != "delete "+dead {
		t.Errorf("machine steps %q, want the dead machine %s deleted first", steps, dead)
	}
	mon.check(t)
	machineGone(t, ctx, e, dead)
	assertConverged(t, e, 3, to)
	assertKCPIdle(t, e)
}

// KCP alone, for comparison: `kubectl delete machine` of the dead machine,
// and KCP (never paused) removes its member, lets it go and creates a
// replacement. It logs the time it took beside the tool's replace.
func TestDeadMachineKCPAlone(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e, dead, mon := deadMachineSim(t, ctx)
	c := e.Sim.ManagementClient()
	m := &clusterv1.Machine{}
	m.Namespace, m.Name = e.Sim.ClusterKey().Namespace, dead
	began := time.Now()
	if err := c.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	simtest.Eventually(t, 14*time.Minute, "KCP replaced the dead machine", func(ctx context.Context) (bool, string, error) {
		machines, err := e.Sim.Machines(ctx)
		if err != nil {
			return false, "", err
		}
		healthy := 0
		for _, mc := range machines {
			if mc.Name == dead {
				return false, "the dead machine is still there", nil
			}
			if mc.Status.NodeRef.IsDefined() && mc.DeletionTimestamp.IsZero() {
				healthy++
			}
		}
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
			return false, "", err
		}
		return healthy == 3 && kcp.Status.ReadyReplicas != nil && *kcp.Status.ReadyReplicas == 3, "waiting for three ready machines", nil
	})
	t.Logf("KCP alone replaced a dead machine deleted with kubectl in %s", time.Since(began).Round(100*time.Millisecond))
	mon.check(t)
	assertConverged(t, e, 3, from)
}

// A drain a PodDisruptionBudget holds: the first victim's node runs a pod
// whose budget allows no disruption, so Cluster API's drain would wait for it
// without end (the KCP sets no drain timeout). The operator lowers the KCP's
// nodeDrainTimeoutSeconds while the run waits on the deleting machine; the
// paused KCP pushes nothing, the run does (sync-machines), the drain gives
// up on that pod when the timeout passes, and the run converges.
func TestDrainBlockedByPDB(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()
	// With surge 1 on one failure domain the oldest outdated machine goes first.
	oldest := oldestMachine(t, ctx, e)
	if err := e.Sim.BlockDrain(ctx, oldest.Name, oldest.Status.NodeRef.Name); err != nil {
		t.Fatal(err)
	}
	mon := watchInvariants(t, e, 4, 2)
	began := time.Now()
	// The readiness checks see the budget and block (drain-blockers); the
	// scenario is the run that goes on knowingly.
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json", "--skip-check", "drain-blockers")
	run.Until(t, func(ev map[string]any) bool {
		return ev["action"] == "await-deletion" && ev["machine"] == oldest.Name
	})
	simtest.Eventually(t, 2*time.Minute, "Cluster API's drain of "+oldest.Name+" held by the budget", func(ctx context.Context) (bool, string, error) {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: oldest.Namespace, Name: oldest.Name}, m); err != nil {
			return false, "", err
		}
		d := conditions.Get(m, clusterv1.MachineDeletingCondition)
		return d != nil && d.Reason == clusterv1.MachineDeletingDrainingNodeReason, fmt.Sprintf("Deleting is %v", d), nil
	})
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"spec":{"machineTemplate":{"spec":{"deletion":{"nodeDrainTimeoutSeconds":5}}}}}`)
	if err := c.Patch(ctx, kcp, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	if code := run.Wait(); code != 0 {
		t.Fatalf("upgrade with a drain held by a PodDisruptionBudget: exit %d\n%s", code, simtest.Tail(run.Stderr(), 15))
	}
	t.Logf("upgrade with a blocked drain unstuck by the KCP's drain timeout took %s", time.Since(began).Round(100*time.Millisecond))
	mon.check(t)
	machineGone(t, ctx, e, oldest.Name)
	assertConverged(t, e, 3, to)
	assertKCPIdle(t, e)
}
