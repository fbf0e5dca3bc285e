package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/test/builder"

	"github.com/cp-rollout/cp-rollout/pkg/inplace"
)

// TestSyncMachine: on a real API server, machines made as KCP makes them, then
// a KCP spec changed in every in-place-mutable field while paused. SyncMachine
// changes exactly those fields — on a deleting machine only the deletion
// timeouts, as KCP does — and a second sync, as KCP's own after the
// hand-back, changes nothing.
func TestSyncMachine(t *testing.T) {
	c := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	tmpl := &unstructured.Unstructured{}
	tmpl.SetGroupVersionKind(builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureMachineTemplateKind))
	tmpl.SetNamespace("default")
	tmpl.SetName("demo")
	if err := unstructured.SetNestedMap(tmpl.Object, map[string]any{"spec": map[string]any{}}, "spec", "template"); err != nil {
		t.Fatal(err)
	}
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp", Namespace: "default"}}
	kcp.Spec.Version, kcp.Spec.Replicas = "v1.36.3", ptr.To(int32(3))
	kcp.Spec.MachineTemplate.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: builder.InfrastructureGroupVersion.Group, Kind: builder.GenericInfrastructureMachineTemplateKind, Name: "demo"}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}}
	cluster.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: kcp.Name}
	for _, obj := range []client.Object{tmpl, kcp, cluster} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	cp := New(c, "default", "demo")
	var made []*clusterv1.Machine
	for range 2 {
		m, err := cp.CreateMachine(ctx, kcp, cluster, "", true)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, m)
	}
	staying, going := made[0].Name, made[1].Name
	// A finalizer of the test's holds the deletion, as the Machine
	// controller's would while the node drains.
	if err := c.Patch(ctx, made[1], client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":["test/hold"]}}`))); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, made[1]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Patch(context.Background(), made[1], client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
	})

	// The operator's change, made while the KCP is paused.
	if err := c.Get(ctx, client.ObjectKeyFromObject(kcp), kcp); err != nil {
		t.Fatal(err)
	}
	kcp.Spec.MachineTemplate.ObjectMeta.Labels = map[string]string{"tier": "gold"}
	kcp.Spec.MachineTemplate.ObjectMeta.Annotations = map[string]string{"example.com/note": "x"}
	kcp.Spec.MachineTemplate.Spec.Deletion = controlplanev1.KubeadmControlPlaneMachineTemplateDeletionSpec{
		NodeDrainTimeoutSeconds: ptr.To(int32(600)), NodeVolumeDetachTimeoutSeconds: ptr.To(int32(300)), NodeDeletionTimeoutSeconds: ptr.To(int32(20))}
	kcp.Spec.MachineTemplate.Spec.ReadinessGates = []clusterv1.MachineReadinessGate{{ConditionType: "Example"}}
	if err := c.Update(ctx, kcp); err != nil {
		t.Fatal(err)
	}

	before, err := cp.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// No webhook runs here: an unset node deletion timeout reads as the
	// 10s the Machine webhook stores.
	if got := strings.Join(inplace.Drift(before, before.Machines[going]), ", "); got !=
		"nodeDrainTimeoutSeconds unset → 600s, nodeVolumeDetachTimeoutSeconds unset → 300s, nodeDeletionTimeoutSeconds 10s → 20s" {
		t.Errorf("drift of the deleting machine: %s", got)
	}
	if got := strings.Join(inplace.Drift(before, before.Machines[staying]), ", "); got !=
		"label tier=gold, annotation example.com/note, nodeDrainTimeoutSeconds unset → 600s, nodeVolumeDetachTimeoutSeconds unset → 300s, "+
			"nodeDeletionTimeoutSeconds 10s → 20s, readiness gate Example, InfraMachine label tier=gold, InfraMachine annotation example.com/note, "+
			"KubeadmConfig label tier=gold, KubeadmConfig annotation example.com/note" {
		t.Errorf("drift of the other machine: %s", got)
	}
	after := syncAll(ctx, t, cp, before)
	for _, m := range after.Machines {
		if drift := inplace.Drift(after, m); len(drift) > 0 {
			t.Errorf("machine %s still differs after the sync: %v", m.Name, drift)
		}
	}

	// Exactly those fields changed.
	deletion := clusterv1.MachineDeletionSpec{NodeDrainTimeoutSeconds: ptr.To(int32(600)), NodeVolumeDetachTimeoutSeconds: ptr.To(int32(300)), NodeDeletionTimeoutSeconds: ptr.To(int32(20))}
	want := before.Machines[going].DeepCopy()
	want.Spec.Deletion = deletion
	sameMachine(t, want, after.Machines[going])

	want = before.Machines[staying].DeepCopy()
	want.Spec.Deletion = deletion
	want.Labels["tier"] = "gold"
	want.Annotations["example.com/note"] = "x"
	want.Spec.ReadinessGates = append(want.Spec.ReadinessGates, clusterv1.MachineReadinessGate{ConditionType: "Example"})
	sameMachine(t, want, after.Machines[staying])

	infra := before.InfraResources[staying].DeepCopy()
	infra.SetLabels(with(infra.GetLabels(), "tier", "gold"))
	infra.SetAnnotations(with(infra.GetAnnotations(), "example.com/note", "x"))
	got := after.InfraResources[staying]
	if !equality.Semantic.DeepEqual(infra.Object["spec"], got.Object["spec"]) ||
		!equality.Semantic.DeepEqual(infra.GetLabels(), got.GetLabels()) || !equality.Semantic.DeepEqual(infra.GetAnnotations(), got.GetAnnotations()) {
		t.Errorf("InfraMachine after the sync:\n got %v %v %v\nwant %v %v %v", got.GetLabels(), got.GetAnnotations(), got.Object["spec"],
			infra.GetLabels(), infra.GetAnnotations(), infra.Object["spec"])
	}
	config := before.KubeadmConfigs[staying].DeepCopy()
	config.Labels = with(config.Labels, "tier", "gold")
	config.Annotations = with(config.Annotations, "example.com/note", "x")
	if gotConfig := after.KubeadmConfigs[staying]; !equality.Semantic.DeepEqual(config.Spec, gotConfig.Spec) ||
		!equality.Semantic.DeepEqual(config.Labels, gotConfig.Labels) || !equality.Semantic.DeepEqual(config.Annotations, gotConfig.Annotations) {
		t.Errorf("KubeadmConfig after the sync:\n got %v %v\nwant %v %v", gotConfig.Labels, gotConfig.Annotations, config.Labels, config.Annotations)
	}
	for _, piece := range []client.Object{before.InfraResources[going], before.KubeadmConfigs[going]} {
		if piece.GetLabels()["tier"] != "" {
			t.Errorf("%s of the deleting machine was given labels: KCP syncs only its deletion timeouts", piece.GetName())
		}
	}

	// KCP's own sync after the hand-back writes what this one wrote, under
	// the same managers: it changes nothing.
	versions := versionsOf(after)
	if got := versionsOf(syncAll(ctx, t, cp, after)); !equality.Semantic.DeepEqual(versions, got) {
		t.Errorf("a second sync changed objects: resourceVersions %v, then %v", versions, got)
	}
}

// syncAll syncs every machine of snapshot and reads the control plane again.
func syncAll(ctx context.Context, t *testing.T, cp *Client, snapshot *kcpstate.ControlPlane) *kcpstate.ControlPlane {
	t.Helper()
	for _, m := range snapshot.Machines {
		if err := cp.SyncMachine(ctx, snapshot, m); err != nil {
			t.Fatal(err)
		}
	}
	read, err := cp.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return read
}

// sameMachine compares what a sync may touch: metadata a person or a
// controller sets, and the spec.
func sameMachine(t *testing.T, want, got *clusterv1.Machine) {
	t.Helper()
	if !equality.Semantic.DeepEqual(want.Spec, got.Spec) {
		t.Errorf("machine %s spec:\n got %+v\nwant %+v", got.Name, got.Spec, want.Spec)
	}
	if !equality.Semantic.DeepEqual(want.Labels, got.Labels) || !equality.Semantic.DeepEqual(want.Annotations, got.Annotations) {
		t.Errorf("machine %s metadata:\n got %v %v\nwant %v %v", got.Name, got.Labels, got.Annotations, want.Labels, want.Annotations)
	}
	if !equality.Semantic.DeepEqual(want.OwnerReferences, got.OwnerReferences) || !equality.Semantic.DeepEqual(want.Finalizers, got.Finalizers) {
		t.Errorf("machine %s owners or finalizers changed: %v %v", got.Name, got.OwnerReferences, got.Finalizers)
	}
}

func with(m map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for key, val := range m {
		out[key] = val
	}
	return out
}

// versionsOf is the resourceVersion of every machine of cp and of its
// InfraMachine and KubeadmConfig.
func versionsOf(cp *kcpstate.ControlPlane) map[string]string {
	out := map[string]string{}
	for name, m := range cp.Machines {
		out["Machine "+name] = m.ResourceVersion
	}
	for name, infra := range cp.InfraResources {
		out["InfraMachine "+name] = infra.GetResourceVersion()
	}
	for name, config := range cp.KubeadmConfigs {
		out["KubeadmConfig "+name] = config.ResourceVersion
	}
	return out
}
