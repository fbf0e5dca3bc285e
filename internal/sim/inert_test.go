package sim_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/test/builder"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
)

// TestCreateInertClusters: on a bare API server with Cluster API's CRDs,
// inert clusters are paused Clusters whose KCP and Machines report what a
// healthy control plane reports, linked as Cluster API links them.
func TestCreateInertClusters(t *testing.T) {
	t.Parallel()
	c, err := client.New(apiservertest.StartCAPI(t), client.Options{Scheme: sim.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const namespace, version = "fleet", "v1.35.2"
	began := time.Now()
	if err := sim.CreateInertClusters(ctx, c, namespace, 3, 3, version); err != nil {
		t.Fatal(err)
	}
	t.Logf("3 inert clusters of 3 machines in %s", time.Since(began))

	clusters := &clusterv1.ClusterList{}
	if err := c.List(ctx, clusters, client.InNamespace(namespace), client.MatchingLabels{sim.InertLabel: sim.InertLabelValue}); err != nil {
		t.Fatal(err)
	}
	if len(clusters.Items) != 3 {
		t.Fatalf("%d inert Clusters, want 3", len(clusters.Items))
	}
	for _, cluster := range clusters.Items {
		if !ptr.Deref(cluster.Spec.Paused, false) || cluster.Status.Phase != string(clusterv1.ClusterPhaseProvisioned) ||
			!ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) ||
			!conditions.IsTrue(&cluster, clusterv1.AvailableCondition) || !conditions.IsTrue(&cluster, clusterv1.PausedCondition) {
			t.Errorf("Cluster %s: paused %v, status %+v; want paused, provisioned, initialized, Available", cluster.Name, cluster.Spec.Paused, cluster.Status)
		}

		infra := &unstructured.Unstructured{}
		infra.SetGroupVersionKind(builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureClusterKind))
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster.Spec.InfrastructureRef.Name}, infra); err != nil {
			t.Fatalf("Cluster %s: infrastructure: %v", cluster.Name, err)
		}
		if ok, _, _ := unstructured.NestedBool(infra.Object, "status", "initialization", "provisioned"); !ok {
			t.Errorf("Cluster %s: infrastructure not provisioned", cluster.Name)
		}

		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster.Spec.ControlPlaneRef.Name}, kcp); err != nil {
			t.Fatalf("Cluster %s: KCP: %v", cluster.Name, err)
		}
		st := kcp.Status
		if ptr.Deref(kcp.Spec.Replicas, 0) != 3 || kcp.Spec.Version != version || st.Version != version ||
			ptr.Deref(st.Replicas, 0) != 3 || ptr.Deref(st.ReadyReplicas, 0) != 3 || ptr.Deref(st.UpToDateReplicas, 0) != 3 || ptr.Deref(st.AvailableReplicas, 0) != 3 ||
			!ptr.Deref(st.Initialization.ControlPlaneInitialized, false) || !conditions.IsTrue(kcp, controlplanev1.KubeadmControlPlaneEtcdClusterHealthyCondition) ||
			kcp.Spec.Rollout.Strategy.Type != controlplanev1.RollingUpdateStrategyType {
			t.Errorf("KCP %s: spec %+v status %+v; want 3 replicas at %s, all ready and up to date, the webhook's defaults", kcp.Name, kcp.Spec, st, version)
		}

		machines := &clusterv1.MachineList{}
		if err := c.List(ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}, client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
			t.Fatal(err)
		}
		if len(machines.Items) != 3 {
			t.Fatalf("Cluster %s: %d control-plane Machines, want 3", cluster.Name, len(machines.Items))
		}
		nodes := map[string]bool{}
		for _, m := range machines.Items {
			owner := metav1.GetControllerOf(&m)
			if owner == nil || owner.Kind != "KubeadmControlPlane" || owner.UID != kcp.UID {
				t.Errorf("Machine %s: controller %+v, want KCP %s", m.Name, owner, kcp.Name)
			}
			if m.Spec.Version != version || m.Labels[clusterv1.MachineControlPlaneNameLabel] != kcp.Name ||
				!m.Spec.Bootstrap.ConfigRef.IsDefined() || !m.Spec.InfrastructureRef.IsDefined() || ptr.Deref(m.Spec.Deletion.NodeDeletionTimeoutSeconds, 0) != 10 {
				t.Errorf("Machine %s: labels %v spec %+v; want KCP's machine at %s with the webhook's defaults", m.Name, m.Labels, m.Spec, version)
			}
			if _, ok := m.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]; !ok {
				t.Errorf("Machine %s lacks KCP's pre-terminate hook", m.Name)
			}
			if m.Status.Phase != string(clusterv1.MachinePhaseRunning) || !m.Status.NodeRef.IsDefined() || nodes[m.Status.NodeRef.Name] || m.Status.NodeRef.Name == m.Name {
				t.Errorf("Machine %s: phase %q, nodeRef %q; want Running on a node of its own", m.Name, m.Status.Phase, m.Status.NodeRef.Name)
			}
			nodes[m.Status.NodeRef.Name] = true
			for _, ct := range []string{clusterv1.ReadyCondition, clusterv1.AvailableCondition, clusterv1.MachineUpToDateCondition, clusterv1.PausedCondition,
				controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition} {
				if !conditions.IsTrue(&m, ct) {
					t.Errorf("Machine %s: %s is %+v, want True", m.Name, ct, conditions.Get(&m, ct))
				}
			}
			for _, gate := range m.Spec.ReadinessGates {
				if !conditions.IsTrue(&m, gate.ConditionType) {
					t.Errorf("Machine %s: readiness gate %s not True", m.Name, gate.ConditionType)
				}
			}
			if conditions.IsTrue(&m, clusterv1.DeletingCondition) {
				t.Errorf("Machine %s reports Deleting", m.Name)
			}
		}
	}

	t.Run("refuses what Cluster API's webhooks refuse", func(t *testing.T) {
		for _, bad := range []struct {
			machines int
			version  string
		}{{2, version}, {0, version}, {3, "one.two"}} {
			if err := sim.CreateInertClusters(ctx, c, "refused", 1, bad.machines, bad.version); err == nil {
				t.Errorf("%d machines at %q: created", bad.machines, bad.version)
			}
		}
		list := &clusterv1.ClusterList{}
		if err := c.List(ctx, list, client.InNamespace("refused")); err != nil || len(list.Items) > 0 {
			t.Errorf("refused calls left %d Clusters behind (%v)", len(list.Items), err)
		}
	})
}
