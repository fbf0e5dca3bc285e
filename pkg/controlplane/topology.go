package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// On a Cluster with a ClusterClass topology the topology controller owns the
// KubeadmControlPlane's version and replicas: it copies
// Cluster.spec.topology into the KCP with server-side apply, forcing its
// ownership, so a target set on the KCP alone is written back. The target is
// therefore set on the Cluster, and the run waits until the topology
// controller has copied it (docs/topology.md has the whole hand-over).

// ManagedByTopology reports whether a ClusterClass topology manages cluster.
func ManagedByTopology(cluster *clusterv1.Cluster) bool { return cluster.Spec.Topology.IsDefined() }

// TopologyTimeout bounds the wait for the topology controller to copy a
// target from the Cluster into the KubeadmControlPlane.
var TopologyTimeout = 2 * time.Minute

// SetTarget sets the version and replicas (empty and nil leave a field
// alone) where their owner reads them: on the KubeadmControlPlane, or on a
// topology Cluster, whose topology controller then writes them into the KCP
// (SetTarget returns once it has).
func (c *Client) SetTarget(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, version string, replicas *int32) error {
	if ManagedByTopology(cluster) {
		if err := c.setTopologyTarget(ctx, cluster, version, replicas); err != nil {
			return err
		}
		return c.awaitTopologyCopy(ctx, cluster, kcp, version, replicas)
	}
	spec := map[string]any{}
	if version != "" && version != kcp.Spec.Version {
		spec["version"] = version
	}
	if replicas != nil && ptr.Deref(kcp.Spec.Replicas, 1) != *replicas {
		spec["replicas"] = *replicas
	}
	if err := c.mergeSpec(ctx, kcp, spec); err != nil {
		return fmt.Errorf("setting the target on KubeadmControlPlane %s: %w", kcp.Name, err)
	}
	return nil
}

// setTopologyTarget patches spec.topology.version and
// spec.topology.controlPlane.replicas on the Cluster. The Cluster's
// admission webhook checks the version as it checks any topology upgrade.
func (c *Client) setTopologyTarget(ctx context.Context, cluster *clusterv1.Cluster, version string, replicas *int32) error {
	topology := map[string]any{}
	if version != "" && version != cluster.Spec.Topology.Version {
		topology["version"] = version
	}
	if replicas != nil && ptr.Deref(cluster.Spec.Topology.ControlPlane.Replicas, -1) != *replicas {
		topology["controlPlane"] = map[string]any{"replicas": *replicas}
	}
	if len(topology) == 0 {
		return nil
	}
	if err := c.mergeSpec(ctx, cluster, map[string]any{"topology": topology}); err != nil {
		return fmt.Errorf("setting the target on Cluster %s (spec.topology): %w", cluster.Name, err)
	}
	return nil
}

// mergeSpec merge-patches spec fields of obj, guarded by its UID.
func (c *Client) mergeSpec(ctx context.Context, obj client.Object, spec map[string]any) error {
	if len(spec) == 0 {
		return nil
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": obj.GetUID()}, "spec": spec})
	if err != nil {
		return err
	}
	return c.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, body))
}

// awaitTopologyCopy waits until the KubeadmControlPlane asks for version and
// replicas. The topology controller copies them only while it sees the
// control plane neither provisioning nor upgrading; a KCP paused in a
// settled state qualifies. If it does not, its TopologyReconciled condition
// on the Cluster says why, and the error repeats it (exit 4).
func (c *Client) awaitTopologyCopy(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, version string, replicas *int32) error {
	live := kcp.DeepCopy()
	copied := func() bool {
		return (version == "" || live.Spec.Version == version) && (replicas == nil || ptr.Deref(live.Spec.Replicas, 1) == *replicas)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, TopologyTimeout, true, func(ctx context.Context) (bool, error) {
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(kcp), live); err != nil {
			return false, nil // transient; the timeout bounds it
		}
		return copied(), nil
	})
	if err == nil || ctx.Err() != nil {
		return err
	}
	seen := "no TopologyReconciled condition"
	if err := c.c.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err == nil {
		if cond := conditions.Get(cluster, clusterv1.ClusterTopologyReconciledCondition); cond != nil {
			seen = fmt.Sprintf("TopologyReconciled=%s (%s): %s", cond.Status, cond.Reason, cond.Message)
		}
	}
	return exitcode.Timeoutf("the topology controller did not copy the target from Cluster %s into KubeadmControlPlane %s within %s (it asks for %s, %d replicas); the Cluster says %s",
		cluster.Name, kcp.Name, TopologyTimeout, live.Spec.Version, ptr.Deref(live.Spec.Replicas, 1), seen)
}

// MachineDeployments lists the cluster's MachineDeployments (by the
// cluster-name label every MachineDeployment of a Cluster carries).
func (c *Client) MachineDeployments(ctx context.Context) ([]clusterv1.MachineDeployment, error) {
	list := &clusterv1.MachineDeploymentList{}
	if err := c.c.List(ctx, list, client.InNamespace(c.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: c.Cluster}); err != nil {
		return nil, fmt.Errorf("listing the MachineDeployments of %s/%s: %w", c.Namespace, c.Cluster, err)
	}
	return list.Items, nil
}
