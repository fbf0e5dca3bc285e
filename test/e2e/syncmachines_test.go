package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// An operator raises the KCP's drain timeout while the run holds it paused and
// waits on a deleting machine (as one would to unstick a drain a
// PodDisruptionBudget holds): the paused KCP pushes nothing, so the run does —
// the raised timeout reaches the deleting Machine, and the replacement, during
// the run, and the run goes on to finish.
func TestRaisedDrainTimeoutReachesTheDeletingMachine(t *testing.T) {
	t.Parallel()
	// The deleted machine's infrastructure takes its time to go: the run
	// waits on the deleting Machine meanwhile.
	e := simtest.Start(t, sim.Options{Replicas: 1, Version: from, ProvisionDelay: time.Second, DeleteDelay: 40 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()

	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	// Machines made as KCP makes them are in sync: nothing is synced
	// before the operator's change.
	early := false
	before := func(want string) func(map[string]any) bool {
		return func(ev map[string]any) bool {
			early = early || ev["action"] == "sync-machines"
			return ev["action"] == want && (ev["phase"] == "done" || want == "await-deletion")
		}
	}
	released := run.Until(t, before("release"))
	victim, _ := released["machine"].(string)
	run.Until(t, before("await-deletion"))
	if early {
		t.Error("the run synced machines before the KCP changed")
	}

	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; !paused {
		t.Fatal("the KCP is not paused while the run waits")
	}
	patch := []byte(`{"spec":{"machineTemplate":{"spec":{"deletion":{"nodeDrainTimeoutSeconds":600}}}}}`)
	if err := c.Patch(ctx, kcp, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}

	synced := run.Until(t, func(ev map[string]any) bool { return ev["action"] == "sync-machines" && ev["phase"] == "done" })
	t.Logf("sync: %v", synced["message"])
	m := &clusterv1.Machine{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: victim}, m); err != nil {
		t.Fatalf("machine %s after the sync (%v): %v", victim, synced["message"], err)
	}
	if m.DeletionTimestamp.IsZero() {
		t.Fatalf("machine %s is not deleting", victim)
	}
	if got := m.Spec.Deletion.NodeDrainTimeoutSeconds; got == nil || *got != 600 {
		t.Fatalf("deleting machine %s has nodeDrainTimeoutSeconds %v after the sync, want 600", victim, fmt.Sprint(deref(got)))
	}

	if code := run.Wait(); code != 0 {
		t.Fatalf("upgrade: exit %d", code)
	}
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		if got := m.Spec.Deletion.NodeDrainTimeoutSeconds; got == nil || *got != 600 {
			t.Errorf("machine %s has nodeDrainTimeoutSeconds %v after the run, want 600", m.Name, deref(got))
		}
	}
	assertConverged(t, e, 1, to)
}

func deref(v *int32) any {
	if v == nil {
		return "unset"
	}
	return *v
}
