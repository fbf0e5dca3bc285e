package controlplane

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/labels/format"
)

// Orphans lists the pieces of a control-plane machine that never came to be:
// InfraMachines and KubeadmConfigs that KCP's desired state made for this
// KubeadmControlPlane (its labels and its owner reference, by UID) that no
// Machine owns, names, or shares a name with. CreateReplacement removes its
// own pieces when a later one fails, but a run killed between creating them
// and creating the Machine cannot; neither KCP nor the Machine controller
// collects them, and they would hold the provider's resources for ever.
//
// Call it only while holding the lock with KCP paused: then nobody else is
// between those two creations.
func (c *Client) Orphans(ctx context.Context, cp *kcpstate.ControlPlane) ([]client.Object, error) {
	selector := client.MatchingLabels{
		clusterv1.ClusterNameLabel:             cp.Cluster.Name,
		clusterv1.MachineControlPlaneNameLabel: format.MustFormatValue(cp.KCP.Name),
	}
	var candidates []client.Object
	// The InfraMachine kind is the template's without its suffix, as CAPI's
	// external.GenerateTemplate names it; without the suffix there is no
	// kind to look for.
	tmpl := cp.KCP.Spec.MachineTemplate.Spec.InfrastructureRef
	if kind, ok := strings.CutSuffix(tmpl.Kind, clusterv1.TemplateSuffix); ok {
		gk := schema.GroupKind{Group: tmpl.APIGroup, Kind: kind}
		mapping, err := c.c.RESTMapper().RESTMapping(gk)
		if err != nil {
			return nil, fmt.Errorf("looking up %s: %w", gk, err)
		}
		infras := &unstructured.UnstructuredList{}
		infras.SetGroupVersionKind(mapping.GroupVersionKind.GroupVersion().WithKind(kind + "List"))
		if err := c.c.List(ctx, infras, client.InNamespace(c.Namespace), selector); err != nil {
			return nil, fmt.Errorf("listing %s of %s/%s: %w", kind, c.Namespace, c.Cluster, err)
		}
		for i := range infras.Items {
			candidates = append(candidates, &infras.Items[i])
		}
	}
	configs := &bootstrapv1.KubeadmConfigList{}
	if err := c.c.List(ctx, configs, client.InNamespace(c.Namespace), selector); err != nil {
		return nil, fmt.Errorf("listing KubeadmConfigs of %s/%s: %w", c.Namespace, c.Cluster, err)
	}
	for i := range configs.Items {
		configs.Items[i].SetGroupVersionKind(bootstrapv1.GroupVersion.WithKind("KubeadmConfig"))
		candidates = append(candidates, &configs.Items[i])
	}

	// Every Machine of the cluster, control plane or not, deleting or not:
	// what one names or shares a name with is not an orphan, whoever made it.
	machines := &clusterv1.MachineList{}
	if err := c.c.List(ctx, machines, client.InNamespace(c.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cp.Cluster.Name}); err != nil {
		return nil, fmt.Errorf("listing Machines of %s/%s: %w", c.Namespace, c.Cluster, err)
	}
	return orphansAmong(candidates, machines.Items, cp.KCP), nil
}

// orphansAmong is Orphans' rule: of candidates, those not deleting, made for
// kcp by KCP's desired state, and that no Machine owns, names, or shares a
// name with.
func orphansAmong(candidates []client.Object, machines []clusterv1.Machine, kcp *controlplanev1.KubeadmControlPlane) []client.Object {
	taken := map[string]bool{}
	for _, m := range machines {
		taken[m.Name] = true
		taken[m.Spec.InfrastructureRef.Name] = true
		taken[m.Spec.Bootstrap.ConfigRef.Name] = true
	}
	var orphans []client.Object
	for _, obj := range candidates {
		if obj.GetDeletionTimestamp() == nil && !taken[obj.GetName()] && madeFor(obj, kcp) {
			orphans = append(orphans, obj)
		}
	}
	return orphans
}

// DeleteOrphan deletes one piece Orphans found, that incarnation only.
func (c *Client) DeleteOrphan(ctx context.Context, obj client.Object) error {
	uid := obj.GetUID()
	err := c.c.Delete(ctx, obj, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s left by an interrupted run: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
	return nil
}

// madeFor reports whether obj carries the owner reference KCP's desired
// state gives a new machine's pieces, and no Machine has taken it over.
func madeFor(obj client.Object, kcp *controlplanev1.KubeadmControlPlane) bool {
	byKCP := false
	for _, ref := range obj.GetOwnerReferences() {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			continue
		}
		switch {
		case gv.Group == clusterv1.GroupVersion.Group && ref.Kind == "Machine":
			return false
		case gv.Group == controlplanev1.GroupVersion.Group && ref.Kind == "KubeadmControlPlane" && ref.UID == kcp.UID:
			byKCP = true
		}
	}
	return byKCP
}
