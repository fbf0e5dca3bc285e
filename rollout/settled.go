package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// Unsettled says what keeps KCP from having settled after the hand-back, each
// naming what it saw; none means KCP has reconciled since it was unpaused and
// agrees that the rollout is done: its status describes the current spec at
// one version, every machine is up to date by KCP's own condition, and there
// are as many as it wants. Until KCP has reconciled, its status still
// describes the control plane as it was before the pause.
func Unsettled(cp *kcpstate.ControlPlane) []string {
	kcp := cp.KCP
	if conditions.IsTrue(kcp, clusterv1.PausedCondition) {
		return []string{"KCP has not reconciled since the hand-back: it still reports Paused"}
	}
	var out []string
	if kcp.Status.ObservedGeneration != kcp.Generation {
		out = append(out, fmt.Sprintf("KCP has not observed generation %d of its spec (observed %d)", kcp.Generation, kcp.Status.ObservedGeneration))
	}
	switch v := kcp.Status.Versions; {
	case len(v) == 0 && kcp.Status.Version != "":
		// KCP v1.13 reports only the lowest version of its machines
		// (status.version); status.versions came with v1.14.
		if kcp.Status.Version != kcp.Spec.Version {
			out = append(out, fmt.Sprintf("KCP reports its oldest machine at %s, want all at %s", kcp.Status.Version, kcp.Spec.Version))
		}
	case len(v) != 1 || v[0].Version != kcp.Spec.Version:
		var seen []string
		for _, sv := range v {
			seen = append(seen, fmt.Sprintf("%d at %s", sv.Replicas, sv.Version))
		}
		out = append(out, fmt.Sprintf("KCP reports machines at [%s], want all at %s", strings.Join(seen, ", "), kcp.Spec.Version))
	}
	machines := cp.Machines.Filter(collections.Not(collections.HasDeletionTimestamp))
	if want := kcp.Spec.Replicas; want != nil && int32(machines.Len()) != *want {
		out = append(out, fmt.Sprintf("%d control-plane machines, KCP wants %d", machines.Len(), *want))
	}
	for _, m := range machines.SortedByCreationTimestamp() {
		if c := conditions.Get(m, clusterv1.MachineUpToDateCondition); c == nil || c.Status != metav1.ConditionTrue {
			why := "no UpToDate condition"
			if c != nil {
				why = fmt.Sprintf("UpToDate=%s (%s)", c.Status, c.Reason)
			}
			out = append(out, fmt.Sprintf("KCP does not count machine %s as up to date: %s", m.Name, why))
		}
	}
	return out
}

// onlyGenerationUnobserved reports whether all that keeps KCP unsettled
// (Unsettled) is that it has not observed its generation: it reconciled
// since the hand-back (its status is no longer Paused) and agrees the
// rollout is done, but a reconcile fails after the machines.
func onlyGenerationUnobserved(cp *kcpstate.ControlPlane) bool {
	observed := *cp
	observed.KCP = cp.KCP.DeepCopy()
	observed.KCP.Status.ObservedGeneration = observed.KCP.Generation
	return cp.KCP.Status.ObservedGeneration != cp.KCP.Generation && len(Unsettled(&observed)) == 0
}

// KCPSays is what kcp reports about itself in its own words: each of its
// conditions that is not in its healthy state, with KCP's reason and
// message. A KCP whose reconcile fails after the hand-back keeps its
// observedGeneration behind, and these say what it is stuck on (etcd or a
// component unhealthy, certificates missing, a scale it cannot make); none
// for a nil kcp.
func KCPSays(kcp *controlplanev1.KubeadmControlPlane) []string {
	if kcp == nil {
		return nil
	}
	var out []string
	for _, c := range kcp.Status.Conditions {
		healthy, known := kcpHealthy[c.Type]
		if !known || c.Status == healthy {
			continue
		}
		say := fmt.Sprintf("%s=%s (%s)", c.Type, c.Status, c.Reason)
		if msg := strings.Join(strings.Fields(c.Message), " "); msg != "" {
			say += ": " + msg
		}
		out = append(out, say)
	}
	return out
}

// kcpHealthy is the status each KCP condition has when nothing is wrong or
// in progress; Paused is Unsettled's own first word, so it is left out here.
var kcpHealthy = map[string]metav1.ConditionStatus{
	controlplanev1.KubeadmControlPlaneAvailableCondition:                     metav1.ConditionTrue,
	controlplanev1.KubeadmControlPlaneInitializedCondition:                   metav1.ConditionTrue,
	controlplanev1.KubeadmControlPlaneCertificatesAvailableCondition:         metav1.ConditionTrue,
	controlplanev1.KubeadmControlPlaneEtcdClusterHealthyCondition:            metav1.ConditionTrue,
	controlplanev1.KubeadmControlPlaneControlPlaneComponentsHealthyCondition: metav1.ConditionTrue,
	controlplanev1.KubeadmControlPlaneMachinesReadyCondition:                 metav1.ConditionTrue,
	controlplanev1.KubeadmControlPlaneMachinesUpToDateCondition:              metav1.ConditionTrue,
	controlplanev1.KubeadmControlPlaneRollingOutCondition:                    metav1.ConditionFalse,
	controlplanev1.KubeadmControlPlaneScalingUpCondition:                     metav1.ConditionFalse,
	controlplanev1.KubeadmControlPlaneScalingDownCondition:                   metav1.ConditionFalse,
	controlplanev1.KubeadmControlPlaneRemediatingCondition:                   metav1.ConditionFalse,
	controlplanev1.KubeadmControlPlaneDeletingCondition:                      metav1.ConditionFalse,
}

// awaitSettled waits, after the hand-back, until KCP has reconciled and
// agrees the rollout is done (Unsettled) and has done what it does in that
// reconcile: retag kube-proxy, and move CoreDNS to the image its spec names
// (a new tag comes with an upgrade) until the new pods replace the old. It
// reports what it still waits for.
// KCP creating or deleting a machine meanwhile means it found a rollout of
// its own to do: that ends the wait at once. Either failure is exit 4; the
// hand-back itself stands.
func (e *Engine) awaitSettled(ctx context.Context, handedBack []string, limit time.Duration) (err error) {
	st := e.begin(AwaitKCP, "", fmt.Sprintf("waiting up to %s for KCP to take over and agree the rollout is done", limit))
	defer st.end(&err)
	var version string
	var last *controlplanev1.KubeadmControlPlane
	var refused *workload.CoreDNSRefusedError
	err = e.pollUntil(ctx, st, limit, func(live bool) ([]string, error) {
		cp, err := e.readControlPlane(ctx, live)
		if err == nil {
			last = cp.KCP
		}
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			// The hand-back is done; a management cluster that cannot be read
			// for a moment only delays the answer, up to the same limit.
			return []string{"cannot read the control plane: " + err.Error()}, nil
		}
		names := cp.Machines.Names()
		for _, n := range names {
			if !slices.Contains(handedBack, n) {
				return nil, exitcode.Timeoutf("KCP created machine %s after the hand-back: it found a rollout of its own to do", n)
			}
		}
		for _, n := range handedBack {
			if !slices.Contains(names, n) {
				return nil, exitcode.Timeoutf("KCP deleted machine %s after the hand-back: it found a rollout of its own to do", n)
			}
		}
		if unsettled := Unsettled(cp); len(unsettled) > 0 {
			// A move of CoreDNS KCP refuses fails every reconcile of KCP's
			// before it writes its observedGeneration: once that is all KCP
			// lacks, the rollout is done, and the add-on's trouble is said
			// as a warning.
			if onlyGenerationUnobserved(cp) {
				if _, err := e.Workload.CoreDNSBehind(ctx, cp.KCP); errors.As(err, &refused) {
					return nil, nil
				}
			}
			return unsettled, nil
		}
		version = cp.KCP.Spec.Version
		switch behind, err := e.Workload.KubeProxyBehind(ctx, cp.KCP); {
		case err != nil:
			return []string{"cannot read kube-proxy: " + err.Error()}, nil
		case behind != "":
			return []string{behind}, nil
		}
		switch behind, err := e.Workload.CoreDNSBehind(ctx, cp.KCP); {
		case errors.As(err, &refused):
			return nil, nil
		case err != nil:
			return []string{"cannot read CoreDNS: " + err.Error()}, nil
		case behind != "":
			return []string{behind}, nil
		}
		return nil, nil
	}, func(unsettled []string) error {
		// What the tool saw (a generation not observed) is KCP failing its
		// reconcile; why is in KCP's own conditions.
		if says := KCPSays(last); len(says) > 0 {
			return exitcode.Timeoutf("KCP did not settle within --handback-timeout %s after the hand-back: %s; KCP says: %s",
				limit, strings.Join(unsettled, "; "), strings.Join(says, "; "))
		}
		return exitcode.Timeoutf("KCP did not settle within --handback-timeout %s after the hand-back: %s", limit, strings.Join(unsettled, "; "))
	})
	if err != nil {
		return err
	}
	if refused != nil {
		st.done("the rollout is done, but " + refused.Error())
		return nil
	}
	st.done(fmt.Sprintf("KCP reports every machine at %s and up to date, and kube-proxy and CoreDNS follow", version))
	return nil
}

// pollUntil reads with check, again at each change (or every etcdPoll),
// until check finds nothing left to wait for, reporting on st each time
// what it waits for first changes. After limit, expired turns what is still
// left into the error that ends the wait; an error from check ends it at
// once. check reads the watches' caches, or live when asked: every answer
// that ends the wait, done or failed, is checked live first.
func (e *Engine) pollUntil(ctx context.Context, st *step, limit time.Duration, check func(live bool) ([]string, error), expired func(left []string) error) error {
	var awaited string
	began := time.Now()
	for {
		left, err := check(e.Cache == nil)
		if e.Cache != nil && (err != nil || len(left) == 0) {
			left, err = check(true)
		}
		if err != nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
		if left[0] != awaited {
			awaited = left[0]
			st.waiting(awaited)
		}
		if time.Since(began) > limit {
			return expired(left)
		}
		e.waitForChange(ctx, etcdPoll)
	}
}

// readControlPlane is the management cluster's part of a snapshot, live or
// from the watches' caches.
func (e *Engine) readControlPlane(ctx context.Context, live bool) (*kcpstate.ControlPlane, error) {
	if live || e.Cache == nil {
		return e.ControlPlane.Read(ctx)
	}
	return e.Cache.ControlPlane.Read(ctx)
}
