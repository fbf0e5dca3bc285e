package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// maxFailureReason bounds the reason kept in the record: it is an
// annotation, read on every reconcile of the KubeadmControlPlane.
const maxFailureReason = 1024

// Pause sets the pause annotation and our operation record in one patch, then
// waits until the KCP controller reports Paused: an annotation does not stop a
// reconcile already running, the condition does. cluster and kcp are as the
// caller has just read them. mayTakeOver refuses a control plane this tool
// must not pause; Pause asks it again on every attempt, on what it has just
// read.
//
// The patch carries the resourceVersion the takeover was checked on, so a
// KubeadmControlPlane that changed in between (paused by someone else, a
// remediation started) is read and checked again rather than taken over
// blindly.
//
// Only a Paused condition that KCP set after this pause counts: right after a
// previous hand-back, KCP may not yet have recomputed the True it reported
// while paused, and a reconcile with an unpaused view may still be running.
// So a True seen before the pause must first turn False.
func (c *Client) Pause(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, rec record.Record, timeout time.Duration, mayTakeOver func(*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane) error) (*controlplanev1.KubeadmControlPlane, error) {
	raw, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	if cluster, kcp, err = c.awaitUnpausedView(ctx, cluster, kcp, timeout); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			if cluster, kcp, err = c.ReadKCP(ctx); err != nil {
				return nil, err
			}
		}
		if err := mayTakeOver(cluster, kcp); err != nil {
			return nil, err
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid": kcp.UID, "resourceVersion": kcp.ResourceVersion,
			"annotations": map[string]any{clusterv1.PausedAnnotation: "true", record.Annotation: string(raw)},
		}})
		if err != nil {
			return nil, err
		}
		err = c.c.Patch(ctx, kcp, client.RawPatch(types.MergePatchType, body))
		if err == nil {
			break
		}
		if !apierrors.IsConflict(err) || attempt == 5 {
			return nil, fmt.Errorf("pausing KubeadmControlPlane %s: %w", kcp.Name, err)
		}
	}
	if kcp, err = c.AwaitPaused(ctx, kcp, timeout); err != nil {
		return nil, err
	}
	// A remediation KCP started just before it saw the pause is KCP's to finish.
	if _, ok := kcp.Annotations[controlplanev1.RemediationInProgressAnnotation]; ok {
		return kcp, exitcode.Unsafef("KubeadmControlPlane %s started a remediation (%s) before it paused: let KCP finish it first",
			kcp.Name, controlplanev1.RemediationInProgressAnnotation)
	}
	return kcp, nil
}

// AwaitPaused waits until the KCP controller reports Paused on kcp, which
// carries the pause annotation, and returns it as last read. The caller
// knows the True it waits for answers this pause: right after setting the
// annotation (Pause, which first waits out a True left from before), or on
// a resumed run, whose pause was never lifted. Until KCP says so, a
// reconcile that began before the pause may still be creating or deleting
// machines.
func (c *Client) AwaitPaused(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, timeout time.Duration) (*controlplanev1.KubeadmControlPlane, error) {
	kcp = kcp.DeepCopy()
	var last *metav1.Condition
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(kcp), kcp); err != nil {
			return false, nil // transient; the timeout bounds it
		}
		last = conditions.Get(kcp, clusterv1.PausedCondition)
		return conditions.IsTrue(kcp, clusterv1.PausedCondition), nil
	})
	if err != nil && ctx.Err() == nil {
		seen := "no Paused condition"
		if last != nil {
			seen = fmt.Sprintf("Paused=%s (%s)", last.Status, last.Reason)
		}
		return nil, exitcode.Timeoutf("KubeadmControlPlane %s: the KCP controller did not report Paused within %s; last seen %s (is the controller running?)",
			kcp.Name, timeout, seen)
	}
	if err != nil {
		return nil, err
	}
	return kcp, nil
}

// awaitUnpausedView waits until the KCP controller no longer reports a
// Paused=True left from before: a KubeadmControlPlane without the pause
// annotation that still says Paused has not been reconciled since it was
// unpaused. It starts from cluster and kcp, and returns them as last read.
func (c *Client) awaitUnpausedView(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, timeout time.Duration) (*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane, error) {
	first := true
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if !first {
			var err error
			if cluster, kcp, err = c.ReadKCP(ctx); err != nil {
				return false, err
			}
		}
		first = false
		_, annotated := kcp.Annotations[clusterv1.PausedAnnotation]
		return annotated || !conditions.IsTrue(kcp, clusterv1.PausedCondition), nil
	})
	if err != nil && ctx.Err() == nil && wait.Interrupted(err) {
		return nil, nil, exitcode.Timeoutf("KubeadmControlPlane %s: the KCP controller still reports Paused from before, %s after it was unpaused (is the controller running?)", kcp.Name, timeout)
	}
	return cluster, kcp, err
}

// Resume hands the control plane back to KCP: it removes the pause and the
// record together, and only when the record is ours.
func (c *Client) Resume(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) error {
	if _, ours := kcp.Annotations[record.Annotation]; !ours {
		return nil
	}
	return c.patchAnnotations(ctx, kcp, map[string]any{clusterv1.PausedAnnotation: nil, record.Annotation: nil})
}

// Restore puts rec back as the record of a KubeadmControlPlane that stays
// paused: a run that took over a `pause` and then could not go on leaves the
// pause as it found it, not handed back behind its author's back.
func (c *Client) Restore(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, rec record.Record) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return c.patchAnnotations(ctx, kcp, map[string]any{record.Annotation: string(raw)})
}

// Complete hands the control plane back after its operation finished: as
// Resume, and in the same patch the record moves to record.LastAnnotation.
func (c *Client) Complete(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) error {
	rec, err := record.Of(kcp)
	if err != nil || rec == nil {
		return err
	}
	now := time.Now().UTC()
	rec.Finished = &now
	rec.LastFailure = nil // the operation finished: an earlier failure no longer explains anything
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return c.patchAnnotations(ctx, kcp, map[string]any{clusterv1.PausedAnnotation: nil, record.Annotation: nil, record.LastAnnotation: string(raw)})
}

// SetRemediation sets (or, with value "", removes) KCP's
// remediation-in-progress annotation on kcp, as KCP does when it deletes a
// machine to remediate it and when it creates the next machine.
func (c *Client) SetRemediation(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, value string) error {
	var v any = value
	if value == "" {
		v = nil
	}
	return c.patchAnnotations(ctx, kcp, map[string]any{controlplanev1.RemediationInProgressAnnotation: v})
}

// RecordFailure adds f to the operation record on kcp as just read. It writes
// only a KubeadmControlPlane still paused under a record of ours, and only
// the version it read: a hand-back in between must not get a record back
// without its pause, so a conflict is read and checked again.
func (c *Client) RecordFailure(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, f record.Failure) error {
	f.Reason = strings.Join(strings.Fields(f.Reason), " ") // one line, for status
	if len(f.Reason) > maxFailureReason {
		f.Reason = f.Reason[:maxFailureReason-3] + "..."
	}
	f.Time = f.Time.UTC()
	for attempt := 1; ; attempt++ {
		rec, err := record.Of(kcp)
		if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; err != nil || rec == nil || !paused {
			return err
		}
		rec.LastFailure = &f
		raw, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid": kcp.UID, "resourceVersion": kcp.ResourceVersion,
			"annotations": map[string]any{record.Annotation: string(raw)},
		}})
		if err != nil {
			return err
		}
		err = c.c.Patch(ctx, kcp.DeepCopy(), client.RawPatch(types.MergePatchType, body))
		if err == nil || !apierrors.IsConflict(err) || attempt == 5 {
			if err != nil {
				return fmt.Errorf("recording the failure on KubeadmControlPlane %s: %w", kcp.Name, err)
			}
			return nil
		}
		fresh := &controlplanev1.KubeadmControlPlane{}
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(kcp), fresh); err != nil {
			return err
		}
		kcp = fresh
	}
}

// The KubeadmControlPlane controller's Deployment as clusterctl installs it.
// The roles of deploy/rbac grant a get of this one object.
const (
	KCPControllerNamespace  = "capi-kubeadm-control-plane-system"
	KCPControllerDeployment = "capi-kubeadm-control-plane-controller-manager"
)

// KCPControllerVersion finds the KubeadmControlPlane controller's Deployment
// and returns its image tag: by name where clusterctl installs it, a read the
// roles grant, or else by its provider label in every namespace, for an
// identity that may list Deployments (a custom install).
func (c *Client) KCPControllerVersion(ctx context.Context) (string, error) {
	d := &appsv1.Deployment{}
	err := c.c.Get(ctx, client.ObjectKey{Namespace: KCPControllerNamespace, Name: KCPControllerDeployment}, d)
	switch {
	case err == nil:
		if version, ok := kcpImageTag(*d); ok {
			return version, nil
		}
	case !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err):
		return "", fmt.Errorf("finding the KCP controller: %w", err)
	}
	deployments := &appsv1.DeploymentList{}
	if err := c.c.List(ctx, deployments, client.MatchingLabels{clusterv1.ProviderNameLabel: "control-plane-kubeadm"}); err != nil {
		if apierrors.IsForbidden(err) {
			return "", exitcode.Unsafef("no KCP controller Deployment %s/%s, and Deployments elsewhere may not be listed (%w): pass --kcp-version",
				KCPControllerNamespace, KCPControllerDeployment, err)
		}
		return "", fmt.Errorf("finding the KCP controller: %w", err)
	}
	for _, d := range deployments.Items {
		if version, ok := kcpImageTag(d); ok {
			return version, nil
		}
	}
	return "", exitcode.Unsafef("no KubeadmControlPlane controller Deployment (label %s=control-plane-kubeadm) found: pass --kcp-version for a custom install",
		clusterv1.ProviderNameLabel)
}

// kcpImageTag is the tag of the KCP controller's image in d, if d runs it.
func kcpImageTag(d appsv1.Deployment) (string, bool) {
	for _, ctr := range d.Spec.Template.Spec.Containers {
		if i := strings.LastIndex(ctr.Image, ":"); i > 0 && strings.Contains(ctr.Image[:i], "kubeadm-control-plane-controller") {
			return ctr.Image[i+1:], true
		}
	}
	return "", false
}
