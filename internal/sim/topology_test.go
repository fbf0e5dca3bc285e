package sim_test

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

// TestTopology: a topology cluster's KCP and workers' MachineDeployment are
// the topology controller's; a new spec.topology.version with no tool
// involved makes the real controllers roll the control plane first, then the
// workers — the baseline the tool's topology support is measured against.
func TestTopology(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, sim.Options{Replicas: 3, Workers: 2, Topology: true, ProvisionDelay: 200 * time.Millisecond, DeleteDelay: 200 * time.Millisecond}).Sim
	ctx := context.Background()
	c := s.ManagementClient()

	t.Run("the topology controller owns the KCP and the MachineDeployment", func(t *testing.T) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
			t.Fatal(err)
		}
		mds := &clusterv1.MachineDeploymentList{}
		if err := c.List(ctx, mds, client.InNamespace(s.ClusterKey().Namespace)); err != nil {
			t.Fatal(err)
		}
		if len(mds.Items) != 1 {
			t.Fatalf("%d MachineDeployments, want the topology's md-0", len(mds.Items))
		}
		for _, o := range []client.Object{kcp, &mds.Items[0]} {
			if _, owned := o.GetLabels()[clusterv1.ClusterTopologyOwnedLabel]; !owned {
				t.Errorf("%s labels %v: want the topology controller's %s", o.GetName(), o.GetLabels(), clusterv1.ClusterTopologyOwnedLabel)
			}
		}
		if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused {
			t.Error("KCP still paused after start-up")
		}
	})

	t.Run("a new topology version rolls the control plane, then the workers", func(t *testing.T) {
		const target = "v1.36.3"
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, s.ClusterKey(), cluster); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(cluster.DeepCopy())
		cluster.Spec.Topology.Version = target
		if err := c.Patch(ctx, cluster, patch); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		var controlPlaneDone time.Duration
		simtest.Eventually(t, 10*time.Minute, "every machine at "+target, func(ctx context.Context) (bool, string, error) {
			cp, err := s.Machines(ctx)
			if err != nil {
				return false, "", err
			}
			workers, err := s.Workers(ctx)
			if err != nil {
				return false, "", err
			}
			oldCP := 0
			for _, m := range cp {
				if m.Spec.Version != target {
					oldCP++
				}
			}
			newWorkers, oldWorkers := 0, 0
			for _, m := range workers {
				if m.Spec.Version == target {
					newWorkers++
				} else {
					oldWorkers++
				}
			}
			if oldCP > 0 && newWorkers > 0 {
				t.Fatalf("a worker at %s while %d control-plane machines are not: the topology controller upgrades the control plane first", target, oldCP)
			}
			if oldCP == 0 && controlPlaneDone == 0 {
				controlPlaneDone = time.Since(began)
			}
			if oldCP > 0 || oldWorkers > 0 || len(workers) != 2 {
				return false, fmt.Sprintf("%d control-plane and %d worker machines not at %s", oldCP, oldWorkers, target), nil
			}
			ok, why, err := s.Ready(ctx)
			return ok, why, err
		})
		t.Logf("the topology controller and KCP rolled the control plane to %s in %.1fs, and the workers by %.1fs",
			target, controlPlaneDone.Seconds(), time.Since(began).Seconds())
	})
}
