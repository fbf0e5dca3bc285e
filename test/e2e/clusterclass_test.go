package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// A cluster built from a ClusterClass that declares its Kubernetes versions
// (Cluster API's chained upgrades), two minors behind: the upgrade follows
// the topology controller's own plan through the minor in between, without
// --via. For each hop the tool sets the target in the Cluster's topology,
// rolls the control plane while the topology controller holds the workers,
// hands back, and follows the topology controller's upgrade of the workers
// (between the hops because the topology controller requires it, after the
// last one because of --wait-workers).
func TestClusterClassUpgradeThroughTwoMinors(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, Workers: 2, Topology: true, Version: "v1.34.3",
		ClassVersions:  []string{"v1.34.3", "v1.35.0", "v1.35.2", "v1.36.3"},
		ProvisionDelay: 500 * time.Millisecond, DeleteDelay: 500 * time.Millisecond})
	e.AwaitKCP = true
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()
	before := machineSet(t, e)

	t.Run("upgrade through two minors with --wait-workers", func(t *testing.T) {
		// The class's plan: the latest version it declares of v1.35, then
		// the target.
		if r := e.Plugin(t, ctx, "plan", "demo", "--version", to); r.Code != 0 || !strings.Contains(r.Stdout, "1/2 "+from) || !strings.Contains(r.Stdout, "2/2 "+to) {
			t.Fatalf("plan: exit %d, want the hops %s and %s:\n%s", r.Code, from, to, r.Stdout)
		}
		mon := watchInvariants(t, e, 4, 2)
		r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--wait-workers", "-o", "json")
		mon.check(t)
		if r.Code != 0 {
			t.Fatalf("upgrade exit %d:\n%s", r.Code, simtest.Tail(r.Stderr, 20))
		}
		evs := simtest.Events(t, r.Stdout)
		reported := map[string]bool{}
		for _, ev := range evs {
			if ev["action"] == "create" && ev["phase"] == "done" {
				reported[ev["machine"].(string)] = true
			}
		}
		// Every control-plane machine is one that was there or one the tool
		// reported creating: KCP made none on its own.
		for name := range machineSet(t, e) {
			if !before[name] && !reported[name] {
				t.Errorf("control-plane machine %s was created, but the tool reported creating only %v", name, reported)
			}
		}
		if len(reported) != 6 {
			t.Errorf("the tool reported creating %d machines, want 3 in each hop", len(reported))
		}
		var workersDone []string
		for _, ev := range evs {
			if ev["action"] == "await-workers" && ev["phase"] == "done" {
				workersDone = append(workersDone, stringOf(ev["hopVersion"]))
			}
		}
		if got := strings.Join(workersDone, " "); got != from+" "+to {
			t.Errorf("the workers were awaited after the hops %q, want after each (%s %s)", got, from, to)
		}
		// The target went where the topology controller reads it.
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, e.Sim.ClusterKey(), cluster); err != nil {
			t.Fatal(err)
		}
		if cluster.Spec.Topology.Version != to {
			t.Errorf("Cluster spec.topology.version %s, want %s", cluster.Spec.Topology.Version, to)
		}
		// The run ended once the topology controller had upgraded the workers.
		if last := evs[len(evs)-2]; last["action"] != "await-workers" || last["phase"] != "done" {
			t.Errorf("next to last event %v, want the workers' upgrade done", last)
		}
		assertWorkersAt(t, ctx, e, 2, to)
		assertConverged(t, e, 3, to)
		assertKCPIdle(t, e)
		assertTopologySettled(t, e)
	})
}

// On a ClusterClass cluster the control-plane replicas live in the topology
// too: scale up and down sets them there; a replace changes no target.
func TestClusterClassScaleAndReplace(t *testing.T) {
	t.Parallel()
	e := classSim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()

	// Scaling adds or removes one machine at a time: never more than 5.
	for _, replicas := range []int32{5, 3} {
		t.Run(fmt.Sprintf("scale to %d", replicas), func(t *testing.T) {
			mon := watchInvariants(t, e, 5, 2)
			r := e.Plugin(t, ctx, "scale", "demo", "--replicas", fmt.Sprint(replicas))
			mon.check(t)
			if r.Code != 0 {
				t.Fatalf("scale exit %d:\n%s", r.Code, simtest.Tail(r.Stderr, 20))
			}
			cluster := &clusterv1.Cluster{}
			if err := c.Get(ctx, e.Sim.ClusterKey(), cluster); err != nil {
				t.Fatal(err)
			}
			if got := ptr.Deref(cluster.Spec.Topology.ControlPlane.Replicas, 0); got != replicas {
				t.Errorf("Cluster spec.topology.controlPlane.replicas %d, want %d", got, replicas)
			}
			assertConverged(t, e, int(replicas), to)
			assertKCPIdle(t, e)
		})
	}

	t.Run("replace", func(t *testing.T) {
		names := machineSet(t, e)
		var victim string
		for name := range names {
			victim = name
			break
		}
		mon := watchInvariants(t, e, 4, 2)
		r := e.Plugin(t, ctx, "replace", "demo", victim)
		mon.check(t)
		if r.Code != 0 {
			t.Fatalf("replace exit %d:\n%s", r.Code, simtest.Tail(r.Stderr, 20))
		}
		if machineSet(t, e)[victim] {
			t.Errorf("machine %s still there after its replace", victim)
		}
		assertConverged(t, e, 3, to)
		assertKCPIdle(t, e)
	})

	// status shows where the target is set.
	if r := e.Plugin(t, ctx, "status", "demo"); r.Code != 0 || !strings.Contains(r.Stdout, "TOPOLOGY") || !strings.Contains(r.Stdout, "ClusterClass demo-class") {
		t.Errorf("status: exit %d, want a TOPOLOGY line naming ClusterClass demo-class:\n%s", r.Code, r.Stdout)
	}
}

// classSim is a ClusterClass cluster of 3 control-plane machines at the
// target version, whose machines come and go within a second, with KCP
// awaited at every hand-back.
func classSim(t *testing.T) *env {
	t.Helper()
	e := simtest.Start(t, sim.Options{Replicas: 3, Topology: true, Version: to,
		ProvisionDelay: 500 * time.Millisecond, DeleteDelay: 500 * time.Millisecond})
	e.AwaitKCP = true
	return e
}

func machineSet(t *testing.T, e *env) map[string]bool {
	t.Helper()
	machines, err := e.Sim.Machines(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range machines {
		names[m.Name] = true
	}
	return names
}

// assertTopologySettled waits until the topology controller reports the
// Cluster reconciled with nothing pending: control plane and workers at the
// topology's version.
// assertWorkersAt checks, when the run has exited, that every worker machine
// runs version and none is deleting: --wait-workers waited for that.
func assertWorkersAt(t *testing.T, ctx context.Context, e *env, replicas int, version string) {
	t.Helper()
	workers, err := e.Sim.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		if w.Spec.Version != version || !w.DeletionTimestamp.IsZero() {
			t.Errorf("at exit worker %s is at %s (deleting %v), want every worker at %s", w.Name, w.Spec.Version, !w.DeletionTimestamp.IsZero(), version)
		}
	}
	if len(workers) != replicas {
		t.Errorf("%d workers at exit, want %d", len(workers), replicas)
	}
}

func assertTopologySettled(t *testing.T, e *env) {
	t.Helper()
	simtest.Eventually(t, 2*time.Minute, "the Cluster's topology reconciled", func(ctx context.Context) (bool, string, error) {
		cluster := &clusterv1.Cluster{}
		if err := e.Sim.ManagementClient().Get(ctx, e.Sim.ClusterKey(), cluster); err != nil {
			return false, "", err
		}
		cond := conditions.Get(cluster, clusterv1.ClusterTopologyReconciledCondition)
		if cond == nil || cond.Status != "True" || cond.ObservedGeneration != cluster.Generation {
			return false, fmt.Sprintf("TopologyReconciled %+v", cond), nil
		}
		mds := &clusterv1.MachineDeploymentList{}
		if err := e.Sim.ManagementClient().List(ctx, mds, client.InNamespace(e.Sim.ClusterKey().Namespace)); err != nil {
			return false, "", err
		}
		for _, md := range mds.Items {
			if v := md.Spec.Template.Spec.Version; v != cluster.Spec.Topology.Version {
				return false, fmt.Sprintf("MachineDeployment %s at %s, the topology at %s", md.Name, v, cluster.Spec.Topology.Version), nil
			}
		}
		return true, "", nil
	})
}
