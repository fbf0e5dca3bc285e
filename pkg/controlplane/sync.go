package controlplane

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg/desiredstate"

	"github.com/cp-rollout/cp-rollout/pkg/inplace"
)

// The run makes KCP's syncMachines' writes here (package inplace says
// which fields, and why the run pushes them while KCP is paused).
//
// syncMachines is an unexported method; what it writes is computed by the
// exported desiredstate package (ComputeDesiredMachine,
// ControlPlaneMachineLabels, ControlPlaneMachineAnnotations) and the Machine
// webhook's exported defaulting, which are used here. Only the two shapes of
// write are re-implemented:
//   - a deleting machine gets the deletion timeouts and taints, nothing else,
//     with a merge patch (KCP: patch.Helper on the Machine, ~884–906);
//   - any other machine gets KCP's whole desired Machine, server-side applied
//     as capi-kubeadmcontrolplane (updateMachine), and its InfraMachine and
//     KubeadmConfig the labels and annotations, applied as
//     capi-kubeadmcontrolplane-metadata (updateLabelsAndAnnotations).
//
// Not re-implemented: ssa.MitigateManagedFieldsIssue and MigrateManagedFields,
// one-time repairs of objects written by CAPI v1.11 and older; KCP makes them
// after the hand-back.

// kcpMetadataManager is the field manager KCP's syncMachines applies the
// labels and annotations of InfraMachines and KubeadmConfigs with.
const kcpMetadataManager = "capi-kubeadmcontrolplane-metadata"

// SyncMachine writes m's in-place-mutable fields as KCP's syncMachines would
// from cp's KubeadmControlPlane (see inplace.Drift). A machine that is gone
// meanwhile needs nothing.
func (c *Client) SyncMachine(ctx context.Context, cp *kcpstate.ControlPlane, m *clusterv1.Machine) error {
	if !m.DeletionTimestamp.IsZero() {
		err := c.patchDeleting(ctx, m, inplace.SyncedDeleting(cp.KCP, m))
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	desired, err := desiredstate.ComputeDesiredMachine(cp.KCP, cp.Cluster, m.Spec.FailureDomain, m)
	if err != nil {
		return fmt.Errorf("computing machine %s as KCP wants it: %w", m.Name, err)
	}
	if err := c.applyAs(ctx, desired, kcpManager); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("syncing machine %s: %w", m.Name, err)
	}
	labels := desiredstate.ControlPlaneMachineLabels(cp.KCP, cp.Cluster.Name)
	annotations := desiredstate.ControlPlaneMachineAnnotations(cp.KCP)
	if infra, ok := cp.InfraResources[m.Name]; ok {
		if err := c.applyMetadata(ctx, infra, infra.GroupVersionKind().Kind, infra.GetAPIVersion(), labels, annotations); err != nil {
			return err
		}
	}
	if config, ok := cp.KubeadmConfigs[m.Name]; ok {
		if err := c.applyMetadata(ctx, config, "KubeadmConfig", bootstrapv1.GroupVersion.String(), labels, annotations); err != nil {
			return err
		}
	}
	return nil
}

// patchDeleting merge-patches exactly the fields the deleting branch of
// syncMachines sets, unset ones as null, guarded by the machine's UID. A
// merge patch, not an apply: KCP patches a deleting machine this way, and an
// apply of the whole machine would put back the kcp-cleanup hook a served
// machine no longer has.
func (c *Client) patchDeleting(ctx context.Context, m, synced *clusterv1.Machine) error {
	deletion := synced.Spec.Deletion
	var taints any
	if len(synced.Spec.Taints) > 0 {
		taints = synced.Spec.Taints
	}
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": m.UID},
		"spec": map[string]any{
			"deletion": map[string]any{
				"nodeDrainTimeoutSeconds":        deletion.NodeDrainTimeoutSeconds,
				"nodeVolumeDetachTimeoutSeconds": deletion.NodeVolumeDetachTimeoutSeconds,
				"nodeDeletionTimeoutSeconds":     deletion.NodeDeletionTimeoutSeconds,
			},
			"taints": taints,
		},
	})
	if err != nil {
		return err
	}
	if err := c.c.Patch(ctx, m.DeepCopy(), client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("syncing deleting machine %s: %w", m.Name, err)
	}
	return nil
}

// applyMetadata applies labels and annotations alone to obj, an InfraMachine
// or a KubeadmConfig, as KCP's updateLabelsAndAnnotations does: under its
// metadata manager, which owns them since creation dropped the main
// manager's claim (dropLabelAndAnnotationOwnership), with the UID so that the
// apply never creates an object that went away.
func (c *Client) applyMetadata(ctx context.Context, obj client.Object, kind, apiVersion string, labels, annotations map[string]string) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(obj.GetNamespace())
	u.SetName(obj.GetName())
	u.SetUID(obj.GetUID())
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	if err := c.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(kcpMetadataManager), client.ForceOwnership); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("syncing the labels and annotations of %s %s: %w", kind, obj.GetName(), err)
	}
	return nil
}
