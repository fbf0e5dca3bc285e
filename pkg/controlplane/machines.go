package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg/desiredstate"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// kcpManager is KCP's server-side-apply field manager. Replacements are applied
// under it so that, after hand-back, KCP's own applies own exactly the fields
// it would own had it created the machine itself.
const kcpManager = "capi-kubeadmcontrolplane"

// CreateReplacement creates one new control-plane machine exactly as KCP's
// cloneConfigsAndGenerateMachine does: the InfraMachine and the (join)
// KubeadmConfig from KCP's desired state under the Machine's name, then the
// Machine referencing both. If a later piece fails, the earlier ones are
// deleted so no orphan is left behind. The InfraMachine is cloned from the
// InfraMachineTemplate that cp's snapshot read, when cp is this Client's last.
func (c *Client) CreateReplacement(ctx context.Context, cp *pkg.ControlPlane, failureDomain string) (*clusterv1.Machine, error) {
	return c.createMachine(ctx, c.readsOf(cp), cp.KCP, cp.Cluster, failureDomain, true)
}

// CreateMachine is CreateReplacement for a control plane that may not exist
// yet: isJoin false gives the init KubeadmConfig of a cluster's first machine.
// The simulator builds its initial machines with it, so that what a test
// starts from is made by the same code as what the tool adds.
func (c *Client) CreateMachine(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, cluster *clusterv1.Cluster, failureDomain string, isJoin bool) (*clusterv1.Machine, error) {
	return c.createMachine(ctx, c.c, kcp, cluster, failureDomain, isJoin)
}

// createMachine is CreateMachine with the template read through templates.
func (c *Client) createMachine(ctx context.Context, templates client.Client, kcp *controlplanev1.KubeadmControlPlane, cluster *clusterv1.Cluster, failureDomain string, isJoin bool) (*clusterv1.Machine, error) {
	machine, err := desiredstate.ComputeDesiredMachine(kcp, cluster, failureDomain, nil)
	if err != nil {
		return nil, fmt.Errorf("computing the new machine: %w", err)
	}
	infra, err := desiredstate.ComputeDesiredInfraMachine(ctx, templates, kcp, cluster, machine.Name, nil)
	if err != nil {
		return nil, fmt.Errorf("computing the InfraMachine for %s: %w", machine.Name, err)
	}
	config, err := desiredstate.ComputeDesiredKubeadmConfig(kcp, cluster, isJoin, machine.Name, nil)
	if err != nil {
		return nil, fmt.Errorf("computing the KubeadmConfig for %s: %w", machine.Name, err)
	}

	var created []client.Object
	cleanup := func(cause error) error {
		// The pieces go even when the run was stopped (the cause may be
		// that), but not for longer than a stopping run may take.
		cleanupCtx, cancel := runlock.CleanupContext(ctx)
		defer cancel()
		errs := []error{cause}
		for _, obj := range created {
			if err := c.c.Delete(cleanupCtx, obj); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("cleaning up %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err))
			}
		}
		return errors.Join(errs...)
	}

	if err := c.applyAsKCP(ctx, infra); err != nil {
		return nil, fmt.Errorf("creating InfraMachine %s: %w", machine.Name, err)
	}
	created = append(created, infra)
	machine.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infra.GroupVersionKind().Group, Kind: infra.GetKind(), Name: infra.GetName(),
	}
	// Each piece gives up its claim right after its apply, as KCP's
	// createInfraMachine and createKubeadmConfig do.
	if err := c.dropLabelAndAnnotationOwnership(ctx, infra); err != nil {
		return nil, cleanup(err)
	}
	if err := c.applyAsKCP(ctx, config); err != nil {
		return nil, cleanup(fmt.Errorf("creating KubeadmConfig %s: %w", machine.Name, err))
	}
	created = append(created, config)
	machine.Spec.Bootstrap.ConfigRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: config.GroupVersionKind().Group, Kind: "KubeadmConfig", Name: config.Name,
	}
	if err := c.dropLabelAndAnnotationOwnership(ctx, config); err != nil {
		return nil, cleanup(err)
	}
	if err := c.applyAsKCP(ctx, machine); err != nil {
		left := fmt.Sprintf("its %s and KubeadmConfig %s were left", infra.GetKind(), config.Name)
		switch {
		case exitcode.Of(err) == exitcode.Locked:
			// Stopped before it left (or before a retry of client-go's
			// left): with the lock gone, no cleanup may be sent either.
			return nil, fmt.Errorf("creating Machine %s: %w (%s: the next run goes on with the Machine, or deletes them if there is none)", machine.Name, err, left)
		case !refusedUnapplied(err):
			// The apply may have gone through before its answer was lost (a
			// cancelled or timed-out call, a 5xx), or a slow server may still
			// apply it after any look: the pieces may belong to a Machine and
			// must stay. If there is none, they are orphans, which the next
			// run finds and deletes (Orphans).
			return nil, fmt.Errorf("creating Machine %s: %w (whether it was created cannot be told: %s; the next run goes on with the Machine, or deletes them if there is none)", machine.Name, err, left)
		}
		return nil, cleanup(fmt.Errorf("creating Machine %s: %w", machine.Name, err))
	}
	return machine, nil
}

// refusedUnapplied reports whether err is an API server's answer that it did
// not apply the request: refused as it stood (invalid, forbidden,
// conflicting, ...). Anything else — a timeout, a 5xx, a broken connection,
// a cancellation — leaves open whether it was applied, and so does a 429:
// client-go retries a 429 or a 5xx that carries Retry-After, so a 429 may be
// the answer to a retry of a request whose first attempt was applied.
func refusedUnapplied(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	switch code := status.Status().Code; {
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests:
		return false
	case code >= 400 && code < 500:
		return true
	}
	return false
}

// applyAsKCP server-side applies obj with KCP's field manager and reads the
// result back into obj. CAPI's own helper for this lives in an internal
// package, so this is the small part of it we need.
func (c *Client) applyAsKCP(ctx context.Context, obj client.Object) error {
	return c.applyAs(ctx, obj, kcpManager)
}

// applyAs is applyAsKCP with the field manager named.
func (c *Client) applyAs(ctx context.Context, obj client.Object, manager string) error {
	gvk, err := apiutil.GVKForObject(obj, c.c.Scheme())
	if err != nil {
		return err
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: content}
	u.SetGroupVersionKind(gvk)
	// What the server owns or sets is not part of our intent.
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "metadata", "managedFields")
	if err := c.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership); err != nil {
		return err
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return err
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	return nil
}

// dropLabelAndAnnotationOwnership removes KCP's apply-ownership of labels and
// annotations on a freshly created InfraMachine or KubeadmConfig, as KCP does,
// so that KCP's metadata sync (a different field manager) can later take them
// over without conflicts.
func (c *Client) dropLabelAndAnnotationOwnership(ctx context.Context, obj client.Object) error {
	// The first try patches obj as the apply returned it, managed fields and
	// resourceVersion included, as KCP's ssa.RemoveManagedFieldsForLabelsAndAnnotations
	// does. A provider or bootstrap controller may update the new object
	// meanwhile: then the patch conflicts, and each later try reads it again.
	reread := false
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if reread {
			if err := c.c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return fmt.Errorf("reading back %s: %w", obj.GetName(), err)
			}
		}
		reread = true
		return c.dropOwnershipOnce(ctx, obj)
	})
}

func (c *Client) dropOwnershipOnce(ctx context.Context, obj client.Object) error {
	base := obj.DeepCopyObject().(client.Object)
	fields := obj.GetManagedFields()
	changed := false
	for i, f := range fields {
		if f.Manager != kcpManager || f.Operation != metav1.ManagedFieldsOperationApply || f.Subresource != "" || f.FieldsV1 == nil {
			continue
		}
		raw := f.FieldsV1.Raw
		if !bytes.Contains(raw, []byte("f:metadata")) {
			continue
		}
		owned := map[string]any{}
		if err := json.Unmarshal(raw, &owned); err != nil {
			return fmt.Errorf("reading managed fields of %s: %w", obj.GetName(), err)
		}
		meta, _ := owned["f:metadata"].(map[string]any)
		if meta == nil || (meta["f:labels"] == nil && meta["f:annotations"] == nil) {
			continue
		}
		delete(meta, "f:labels")
		delete(meta, "f:annotations")
		if len(meta) == 0 {
			delete(owned, "f:metadata")
		}
		if raw, err := json.Marshal(owned); err == nil {
			fields[i].FieldsV1 = &metav1.FieldsV1{Raw: raw}
			changed = true
		}
	}
	if !changed {
		return nil
	}
	obj.SetManagedFields(fields)
	// Returned unwrapped so that RetryOnConflict sees a conflict.
	return c.c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}

// Delete deletes machine, and only that incarnation of it: the UID precondition
// makes a stale decision fail instead of deleting a newer machine of the same name.
func (c *Client) Delete(ctx context.Context, machine *clusterv1.Machine) error {
	err := c.c.Delete(ctx, machine, client.Preconditions{UID: &machine.UID})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// EnsureCleanupHook makes sure machine carries KCP's kcp-cleanup pre-terminate
// hook, so its deletion stops before the infrastructure goes and its etcd
// member can be removed first.
func (c *Client) EnsureCleanupHook(ctx context.Context, machine *clusterv1.Machine) error {
	if _, ok := machine.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]; ok {
		return nil
	}
	return c.patchAnnotations(ctx, machine, map[string]any{controlplanev1.PreTerminateHookCleanupAnnotation: ""})
}

// RemoveCleanupHook lets the Machine controller finish deleting machine. A merge
// patch, not server-side apply: the annotation is owned by another manager.
func (c *Client) RemoveCleanupHook(ctx context.Context, machine *clusterv1.Machine) error {
	if _, ok := machine.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]; !ok {
		return nil
	}
	return c.patchAnnotations(ctx, machine, map[string]any{controlplanev1.PreTerminateHookCleanupAnnotation: nil})
}

// patchAnnotations sets (or, with nil values, removes) annotations with a merge
// patch guarded by the object's UID.
func patchAnnotationsBody(uid types.UID, annotations map[string]any) ([]byte, error) {
	return json.Marshal(map[string]any{"metadata": map[string]any{"uid": uid, "annotations": annotations}})
}

func (c *Client) patchAnnotations(ctx context.Context, obj client.Object, annotations map[string]any) error {
	body, err := patchAnnotationsBody(obj.GetUID(), annotations)
	if err != nil {
		return err
	}
	if err := c.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("annotating %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
	return nil
}

// DrainRules names the MachineDrainRules in the cluster's namespace, where
// Cluster API's drain looks for them. A cluster with none gets the tool's
// head-start drain (workload.Drain); one with any is drained by Cluster API
// alone, which orders and skips pods by them. A Cluster API without the kind
// has none.
func (c *Client) DrainRules(ctx context.Context) ([]string, error) {
	var rules clusterv1.MachineDrainRuleList
	if err := c.c.List(ctx, &rules, client.InNamespace(c.Namespace)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing MachineDrainRules in %s: %w", c.Namespace, err)
	}
	names := make([]string, 0, len(rules.Items))
	for _, r := range rules.Items {
		names = append(names, r.Name)
	}
	return names, nil
}
