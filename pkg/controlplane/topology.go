package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/blang/semver/v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
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

// SetTarget sets the version, machine template and replicas (empty and nil
// leave a field alone) where their owner reads them: on the
// KubeadmControlPlane, or on a topology Cluster, whose topology controller
// then writes them into the KCP (SetTarget returns once it has, or fails
// after topologyTimeout). A topology cluster's template is its ClusterClass's:
// the request was refused before it came here.
func (c *Client) SetTarget(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, version, template string, replicas *int32, topologyTimeout time.Duration) error {
	if ManagedByTopology(cluster) {
		if err := c.setTopologyTarget(ctx, cluster, version, replicas); err != nil {
			return err
		}
		return c.awaitTopologyCopy(ctx, cluster, kcp, version, replicas, topologyTimeout)
	}
	spec := map[string]any{}
	if version != "" && version != kcp.Spec.Version {
		spec["version"] = version
	}
	if replicas != nil && ptr.Deref(kcp.Spec.Replicas, 1) != *replicas {
		spec["replicas"] = *replicas
	}
	if template != "" && template != kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name {
		spec["machineTemplate"] = map[string]any{"spec": map[string]any{"infrastructureRef": map[string]any{"name": template}}}
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
// settled state qualifies, and lifecycle hooks (BeforeClusterUpgrade) may
// hold it longer. If it does not within timeout, its TopologyReconciled
// condition on the Cluster says why, and the error repeats it (exit 4).
func (c *Client) awaitTopologyCopy(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, version string, replicas *int32, timeout time.Duration) error {
	live := kcp.DeepCopy()
	copied := func() bool {
		return (version == "" || live.Spec.Version == version) && (replicas == nil || ptr.Deref(live.Spec.Replicas, 1) == *replicas)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
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
	// A lifecycle hook may hold the copy as long as it likes: the way on is a
	// longer limit, so the message names the flag that sets it.
	return exitcode.Timeoutf("the topology controller did not copy the target from Cluster %s into KubeadmControlPlane %s within --topology-timeout %s (it asks for %s, %d replicas); the Cluster says %s",
		cluster.Name, kcp.Name, timeout, live.Spec.Version, ptr.Deref(live.Spec.Replicas, 1), seen)
}

// MachineDeployments lists the cluster's MachineDeployments (by the
// cluster-name label every MachineDeployment of a Cluster carries).
func (c *Client) MachineDeployments(ctx context.Context) ([]clusterv1.MachineDeployment, error) {
	list := &clusterv1.MachineDeploymentList{}
	if err := c.c.List(ctx, list, client.InNamespace(c.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: c.Cluster}); err != nil {
		return nil, fmt.Errorf("listing the MachineDeployments of %s/%s: %w", c.Namespace, c.Cluster, err)
	}
	if !slices.ContainsFunc(list.Items, func(md clusterv1.MachineDeployment) bool {
		return len(md.Status.Versions) == 0 && ptr.Deref(md.Spec.Replicas, 0) > 0
	}) {
		return list.Items, nil
	}
	// Cluster API v1.13's MachineDeployment controller writes no
	// status.versions (v1.14 added it), and its upToDateReplicas still counts
	// the old machines for a moment after the spec changes. The versions are
	// then counted from the machines themselves, deleting ones included, as
	// v1.14's MachineSet controller counts them, so that every release's
	// workers are judged alike (rollout.WorkersBehind).
	machines := &clusterv1.MachineList{}
	if err := c.c.List(ctx, machines, client.InNamespace(c.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: c.Cluster}, client.HasLabels{clusterv1.MachineDeploymentNameLabel}); err != nil {
		return nil, fmt.Errorf("listing the worker machines of %s/%s: %w", c.Namespace, c.Cluster, err)
	}
	for i := range list.Items {
		if md := &list.Items[i]; len(md.Status.Versions) == 0 {
			md.Status.Versions = machineVersions(machines.Items, md.Name)
		}
	}
	return list.Items, nil
}

// machineVersions counts the machines of MachineDeployment md by version, sorted
// by version.
func machineVersions(machines []clusterv1.Machine, md string) []clusterv1.StatusVersion {
	count := map[string]int32{}
	for _, m := range machines {
		if m.Labels[clusterv1.MachineDeploymentNameLabel] == md {
			count[m.Spec.Version]++
		}
	}
	var out []clusterv1.StatusVersion
	for _, v := range slices.Sorted(maps.Keys(count)) {
		out = append(out, clusterv1.StatusVersion{Version: v, Replicas: count[v]})
	}
	return out
}

// ClassUpgradePlan is the control-plane upgrade plan Cluster API's topology
// controller computes from the cluster's ClusterClass to go from version
// from to target (see classPlan). None when the class declares no versions;
// an error when it plans with a runtime extension, which this tool cannot
// call.
func (c *Client) ClassUpgradePlan(ctx context.Context, cluster *clusterv1.Cluster, from, target string) ([]string, error) {
	ref := cluster.Spec.Topology.ClassRef
	namespace := ref.Namespace
	if namespace == "" {
		namespace = cluster.Namespace
	}
	class := &clusterv1.ClusterClass{}
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, class); err != nil {
		return nil, fmt.Errorf("reading ClusterClass %s/%s: %w", namespace, ref.Name, err)
	}
	if ext := class.Spec.Upgrade.External.GenerateUpgradePlanExtension; ext != "" {
		return nil, exitcode.Usagef("ClusterClass %s plans upgrades with the runtime extension %s, which this tool cannot call: pass the versions it plans with --via", class.Name, ext)
	}
	plan, err := classPlan(class.Spec.KubernetesVersions, from, target)
	if err != nil {
		return nil, exitcode.Usagef("ClusterClass %s: no upgrade plan from %s to %s: %v", class.Name, from, target, err)
	}
	return plan, nil
}

// classPlan is Cluster API's upgrade plan through a ClusterClass's declared
// versions (desiredstate.GetUpgradePlanFromClusterClassVersions): the
// declared versions after from, up to target, keeping the latest of each
// minor. Written here rather than imported: that package brings the topology
// controller's runtime-extension client with it, 9 MB of the plugin for
// these lines; a test holds the two to the same answers.
func classPlan(declared []string, from, target string) ([]string, error) {
	if len(declared) == 0 {
		return nil, nil
	}
	fromV, err := semver.ParseTolerant(from)
	if err != nil {
		return nil, err
	}
	targetV, err := semver.ParseTolerant(target)
	if err != nil {
		return nil, err
	}
	if fromV.EQ(targetV) {
		return nil, nil
	}
	var candidates []semver.Version
	var names []string
	for _, v := range declared {
		sv, err := semver.ParseTolerant(v)
		if err != nil {
			return nil, err
		}
		if sv.LTE(fromV) {
			continue
		}
		if sv.GT(targetV) {
			break
		}
		candidates, names = append(candidates, sv), append(names, v)
		if sv.EQ(targetV) {
			break
		}
	}
	if len(candidates) == 0 {
		return []string{}, nil
	}
	var plan []string
	minor := fromV.Minor
	if minor == targetV.Minor {
		plan = append(plan, names[0])
	}
	for i, sv := range candidates {
		if sv.Minor > minor {
			plan = append(plan, names[i])
		}
		if sv.Minor == minor && len(plan) > 0 {
			plan[len(plan)-1] = names[i]
		}
		minor = sv.Minor
	}
	return plan, nil
}

// CheckTemplate refuses, as bad input, a KubeadmControlPlane whose
// InfraMachineTemplate does not exist: the name was given on the command line
// (the kind and namespace are the ones the KCP uses today, so a template of
// another provider cannot be named by mistake).
func (c *Client) CheckTemplate(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) error {
	ref := kcp.Spec.MachineTemplate.Spec.InfrastructureRef
	_, err := external.GetObjectFromContractVersionedRef(ctx, c.c, ref, kcp.Namespace)
	switch {
	case apierrors.IsNotFound(err):
		return exitcode.Usagef("--infrastructure-template: no %s %s (group %s) in namespace %s; the new template must be of the kind and in the namespace of the KubeadmControlPlane's template today",
			ref.Kind, ref.Name, ref.APIGroup, kcp.Namespace)
	case err != nil:
		return fmt.Errorf("reading %s %s/%s: %w", ref.Kind, kcp.Namespace, ref.Name, err)
	}
	return nil
}
