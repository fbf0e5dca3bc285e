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
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/labels/format"
)

// Orphans lists the pieces of a control-plane machine that never came to be:
// InfraMachines and KubeadmConfigs carrying this control plane's labels whose
// Machine does not exist and never owned them. CreateReplacement removes its
// own pieces when a later one fails, but a run killed between creating them
// and creating the Machine cannot; neither KCP nor the Machine controller
// collects them, and they would hold the provider's resources for ever.
//
// Call it only while holding the lock with KCP paused: then nobody else is
// between those two creations.
func (c *Client) Orphans(ctx context.Context, cp *pkg.ControlPlane) ([]client.Object, error) {
	selector := client.MatchingLabels{
		clusterv1.ClusterNameLabel:             cp.Cluster.Name,
		clusterv1.MachineControlPlaneNameLabel: format.MustFormatValue(cp.KCP.Name),
	}
	// The InfraMachine kind is the template's without its suffix, as CAPI's
	// external.GenerateTemplate names it.
	tmpl := cp.KCP.Spec.MachineTemplate.Spec.InfrastructureRef
	infraKind := schema.GroupKind{Group: tmpl.APIGroup, Kind: strings.TrimSuffix(tmpl.Kind, clusterv1.TemplateSuffix)}
	mapping, err := c.c.RESTMapper().RESTMapping(infraKind)
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", infraKind, err)
	}
	infras := &unstructured.UnstructuredList{}
	infras.SetGroupVersionKind(mapping.GroupVersionKind.GroupVersion().WithKind(infraKind.Kind + "List"))
	if err := c.c.List(ctx, infras, client.InNamespace(c.Namespace), selector); err != nil {
		return nil, fmt.Errorf("listing %s of %s/%s: %w", infraKind.Kind, c.Namespace, c.Cluster, err)
	}
	configs := &bootstrapv1.KubeadmConfigList{}
	if err := c.c.List(ctx, configs, client.InNamespace(c.Namespace), selector); err != nil {
		return nil, fmt.Errorf("listing KubeadmConfigs of %s/%s: %w", c.Namespace, c.Cluster, err)
	}

	var candidates []client.Object
	for i := range infras.Items {
		candidates = append(candidates, &infras.Items[i])
	}
	for i := range configs.Items {
		configs.Items[i].SetGroupVersionKind(bootstrapv1.GroupVersion.WithKind("KubeadmConfig"))
		candidates = append(candidates, &configs.Items[i])
	}
	var orphans []client.Object
	for _, obj := range candidates {
		if obj.GetDeletionTimestamp() != nil || ownedByMachine(obj) {
			continue
		}
		// Not yet owned may just mean the Machine controller has not got to
		// it: only a missing Machine makes an orphan.
		err := c.c.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: obj.GetName()}, &clusterv1.Machine{})
		switch {
		case apierrors.IsNotFound(err):
			orphans = append(orphans, obj)
		case err != nil:
			return nil, fmt.Errorf("reading Machine %s: %w", obj.GetName(), err)
		}
	}
	return orphans, nil
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

func ownedByMachine(obj client.Object) bool {
	for _, ref := range obj.GetOwnerReferences() {
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err == nil && gv.Group == clusterv1.GroupVersion.Group && ref.Kind == "Machine" {
			return true
		}
	}
	return false
}
