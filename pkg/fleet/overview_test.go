package fleet

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// On a real API server with Cluster API's CRDs: a fleet of inert clusters,
// one reconciled by KCP, one mid-rollout (paused with this tool's record,
// locked, machines out of date), one paused by someone else with a machine
// deleting, and a Cluster whose control plane is not a KubeadmControlPlane.
// Pages of two make every list follow continue tokens.
func TestSelectAndOverviewReadTheFleetFromTheManagementCluster(t *testing.T) {
	listPage = 2
	t.Cleanup(func() { listPage = 500 })
	ctx := context.Background()
	cfg := apiservertest.StartCAPI(t)
	c, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLister(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "fleet"
	if err := sim.CreateInertClusters(ctx, c, ns, 3, 3, "v1.35.2"); err != nil {
		t.Fatal(err)
	}
	// inert-2 is mid-upgrade: paused with our record, its lock held.
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inert-2-control-plane"}, kcp); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "alice@ops/pid-1", Started: time.Now()})
	patch := client.MergeFrom(kcp.DeepCopy())
	kcp.Annotations = map[string]string{clusterv1.PausedAnnotation: "", record.Annotation: string(raw)}
	kcp.Spec.Version = "v1.36.3"
	if err := c.Patch(ctx, kcp, patch); err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: runlock.LeaseName("inert-2")},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("alice@ops/pid-1"), LeaseDurationSeconds: ptr.To(int32(15)),
			RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}
	if err := c.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	machines := &clusterv1.MachineList{}
	if err := c.List(ctx, machines, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: "inert-2"}); err != nil {
		t.Fatal(err)
	}
	// One machine already at the new version, one at the old (not up to
	// date), one at the new version that KCP marked out of date.
	for i, m := range machines.Items {
		patch := client.MergeFrom(m.DeepCopy())
		if i != 1 {
			m.Spec.Version = "v1.36.3"
		}
		if err := c.Patch(ctx, &m, patch); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			status := client.MergeFrom(m.DeepCopy())
			conditions.Set(&m, metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionFalse, Reason: "NotUpToDate"})
			if err := c.Status().Patch(ctx, &m, status); err != nil {
				t.Fatal(err)
			}
		}
	}
	// inert-1's KCP, which reconciles, reports one machine out of date by
	// its own comparison, which the machines' versions do not show.
	kcp1 := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inert-1-control-plane"}, kcp1); err != nil {
		t.Fatal(err)
	}
	status := client.MergeFrom(kcp1.DeepCopy())
	kcp1.Status.UpToDateReplicas = ptr.To(int32(2))
	if err := c.Status().Patch(ctx, kcp1, status); err != nil {
		t.Fatal(err)
	}
	// inert-3 is paused by someone else, and a machine is being deleted (its
	// finalizer holds it).
	kcp3 := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "inert-3-control-plane"}, kcp3); err != nil {
		t.Fatal(err)
	}
	patch = client.MergeFrom(kcp3.DeepCopy())
	kcp3.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	if err := c.Patch(ctx, kcp3, patch); err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, machines, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: "inert-3"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &machines.Items[0]); err != nil {
		t.Fatal(err)
	}
	// A Cluster whose control plane is someone else's.
	other := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other", Labels: map[string]string{sim.InertLabel: sim.InertLabelValue}},
		Spec: clusterv1.ClusterSpec{Paused: ptr.To(true), ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: "controlplane.cluster.x-k8s.io", Kind: "TalosControlPlane", Name: "other"}},
	}
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}

	inert := labels.SelectorFromSet(labels.Set{sim.InertLabel: sim.InertLabelValue})
	clusters, skipped, err := Select(ctx, l, Scope{Namespace: ns, Selector: inert})
	if err != nil {
		t.Fatal(err)
	}
	if len(clusters) != 3 || clusters[0].Name != "inert-1" || clusters[2].Name != "inert-3" {
		t.Errorf("selected %v, want inert-1 … inert-3 in order", clusters)
	}
	if len(skipped) != 1 || skipped[0].Name != "other" || skipped[0].Reason != "its control plane is a TalosControlPlane, not a KubeadmControlPlane" {
		t.Errorf("skipped %+v, want other, for its TalosControlPlane", skipped)
	}
	if clusters, skipped, err := Select(ctx, l, Scope{Selector: labels.SelectorFromSet(labels.Set{"env": "prod"})}); err != nil || len(clusters)+len(skipped) != 0 {
		t.Errorf("env=prod in every namespace selected %v, %v (%v), want nothing", clusters, skipped, err)
	}

	rows, err := Overview(ctx, l, Scope{Selector: inert}) // every namespace
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Row{}
	for _, r := range rows {
		byName[r.Name] = r
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4: %+v", len(rows), rows)
	}
	if r := byName["inert-1"]; r.Version != "v1.35.2" || r.Replicas != 3 || r.Machines != 3 || r.UpToDate != 2 || r.Paused || r.Lock != nil || r.Operation != nil {
		t.Errorf("inert-1, reconciled by KCP: %+v, want KCP's own 2 of 3 up to date", r)
	}
	r := byName["inert-2"]
	if r.Version != "v1.36.3" || r.Machines != 3 || r.UpToDate != 1 || !r.Paused || !r.PausedByUs {
		t.Errorf("inert-2, mid-upgrade: %+v, want v1.36.3 with 1 of 3 up to date, paused by us", r)
	}
	if r.Operation == nil || r.Operation.Target != "v1.36.3" || r.Lock == nil || r.Lock.Holder != "alice@ops/pid-1" || !r.Lock.Live {
		t.Errorf("inert-2: operation %+v, lock %+v, want the upgrade's record and alice's live lock", r.Operation, r.Lock)
	}
	if r := byName["inert-3"]; r.Machines != 3 || r.UpToDate != 2 || !r.Paused || r.PausedByUs {
		t.Errorf("inert-3, paused by someone else, a machine deleting: %+v, want 2 of 3 machines up to date", r)
	}
	// Who acts: the run holding inert-2's lock; nobody on inert-3, whose
	// pause holds KCP back; nobody on inert-1, whose KCP reports no work.
	for name, want := range map[string]string{"inert-1": "nobody", "inert-2": "cp-rollout (upgrade by alice@ops/pid-1)", "inert-3": "nobody (KCP paused)"} {
		if a := byName[name].Acting; a == nil || a.String() != want {
			t.Errorf("%s: acting %v, want %s", name, a, want)
		}
	}
	if r := byName["other"]; r.Problem == "" || r.ControlPlane != "" || r.Acting != nil {
		t.Errorf("other: %+v, want its problem and no control plane", r)
	}
}
