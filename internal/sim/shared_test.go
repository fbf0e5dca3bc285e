package sim_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// TestClustersShareANamespace: two simulators on one management cluster, in
// one namespace beside inert clusters, each provision their own Cluster's
// machines and nothing else, and Cluster API's controllers and webhooks take
// the inert clusters as created and leave them alone.
func TestClustersShareANamespace(t *testing.T) {
	t.Parallel()
	const namespace = "shared-namespace"
	ctx := context.Background()
	labels := map[string]string{"env": "sim"}
	alpha := simtest.Start(t, sim.Options{ClusterName: "alpha", Namespace: namespace, Replicas: 1, Labels: labels}).Sim
	c := alpha.ManagementClient()

	// Through the webhooks, and in front of the controllers, which would
	// write to any object that differed from what they expect of a paused
	// cluster's.
	if err := sim.CreateInertClusters(ctx, c, namespace, 2, 3, "v1.35.2"); err != nil {
		t.Fatal(err)
	}
	inert := inertVersions(t, c, namespace)
	if len(inert) != 2*(1+1+3) {
		t.Fatalf("%d inert Clusters, KCPs and Machines, want 10: %v", len(inert), inert)
	}

	// Its start-up gives the controllers tens of seconds with the inert
	// objects.
	beta := simtest.Start(t, sim.Options{ClusterName: "beta", Namespace: namespace, Replicas: 1, Labels: labels}).Sim

	if ok, why, err := alpha.Ready(ctx); err != nil || !ok {
		t.Errorf("alpha no longer ready once beta started: %s %v", why, err)
	}
	for _, s := range []*sim.Sim{alpha, beta} {
		name := s.ClusterKey().Name
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, s.ClusterKey(), cluster); err != nil {
			t.Fatal(err)
		}
		if cluster.Labels["env"] != "sim" {
			t.Errorf("Cluster %s: labels %v, want env=sim", name, cluster.Labels)
		}
		machines, err := s.Machines(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, m := range machines {
			names = append(names, m.Name)
		}
		nodes := s.Nodes()
		if got := slices.Sorted(maps.Keys(nodes)); !slices.Equal(got, names) {
			t.Errorf("cluster %s: its provider holds hosts for machines %v, want its own %v", name, got, names)
		}
		for _, m := range machines {
			n := nodes[m.Name]
			if m.Spec.ProviderID != n.ProviderID || !strings.HasPrefix(n.ProviderID, "sim://"+name+"/") || m.Status.NodeRef.Name != n.Name {
				t.Errorf("machine %s of %s: providerID %q, nodeRef %q; its provider's host %+v", m.Name, name, m.Spec.ProviderID, m.Status.NodeRef.Name, n)
			}
			other := alpha
			if s == alpha {
				other = beta
			}
			if err := s.WorkloadClient().Get(ctx, client.ObjectKey{Name: n.Name}, &corev1.Node{}); err != nil {
				t.Errorf("node %s of %s: %v", n.Name, name, err)
			}
			if err := other.WorkloadClient().Get(ctx, client.ObjectKey{Name: n.Name}, &corev1.Node{}); !apierrors.IsNotFound(err) {
				t.Errorf("node %s of %s in the other workload cluster: %v", n.Name, name, err)
			}
		}
	}

	if now := inertVersions(t, c, namespace); !maps.Equal(now, inert) {
		t.Errorf("inert objects changed (kind/name: resourceVersion)\nbefore %v\nafter  %v", inert, now)
	}
}

// inertVersions are the resource versions of the inert clusters' Clusters,
// KCPs and Machines in namespace, by kind and name.
func inertVersions(t *testing.T, c client.Client, namespace string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	clusters := &clusterv1.ClusterList{}
	if err := c.List(ctx, clusters, client.InNamespace(namespace), client.MatchingLabels{sim.InertLabel: sim.InertLabelValue}); err != nil {
		t.Fatal(err)
	}
	for _, cluster := range clusters.Items {
		out["Cluster/"+cluster.Name] = cluster.ResourceVersion
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster.Spec.ControlPlaneRef.Name}, kcp); err != nil {
			t.Fatal(err)
		}
		out["KubeadmControlPlane/"+kcp.Name] = kcp.ResourceVersion
		machines := &clusterv1.MachineList{}
		if err := c.List(ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}); err != nil {
			t.Fatal(err)
		}
		for _, m := range machines.Items {
			out["Machine/"+m.Name] = m.ResourceVersion
		}
	}
	return out
}
