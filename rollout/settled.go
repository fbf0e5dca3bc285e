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

// awaitSettled waits, after the hand-back, first until KCP has reconciled
// and agrees the rollout is done (Unsettled): that is what makes the run a
// success. It expires after limit, and KCP creating or deleting a machine
// meanwhile (it found a rollout of its own to do) ends it at once: either is
// exit 4, the hand-back itself standing. Then, in the same step, it waits for
// what KCP does in the reconcile that settles: retag kube-proxy, and move
// CoreDNS to the image its spec names (a new tag comes with an upgrade) until
// the new pods replace the old. KCP itself waits for neither, and a cluster
// whose Deployment controller lags or is missing never finishes CoreDNS's
// rollout, so that wait has a bound of its own (Timeouts.Addons) and its
// expiry ends the run done, with a warning that names the add-on, what it
// still waits for and what to look at.
func (e *Engine) awaitSettled(ctx context.Context, handedBack []string, limit time.Duration) (err error) {
	st := e.begin(AwaitKCP, "", fmt.Sprintf("waiting up to %s for KCP to take over and agree the rollout is done", limit))
	defer st.end(&err)
	kcp, err := e.awaitKCPAgrees(ctx, st, handedBack, limit)
	if err != nil {
		return err
	}
	settled := fmt.Sprintf("KCP reports every machine at %s and up to date", kcp.Spec.Version)
	warning, err := e.awaitAddons(ctx, st, kcp, settled, e.Timeouts.addons())
	switch {
	case err != nil:
		return err
	case warning != "":
		st.done(settled + "; the rollout is done, but " + warning)
	default:
		st.done(settled + ", and kube-proxy and CoreDNS follow")
	}
	return nil
}

// awaitKCPAgrees is awaitSettled's first wait, the gate of a successful run:
// until KCP has reconciled and agrees the rollout is done (Unsettled), up to
// limit. It returns the KCP as last read live.
func (e *Engine) awaitKCPAgrees(ctx context.Context, st *step, handedBack []string, limit time.Duration) (*controlplanev1.KubeadmControlPlane, error) {
	var last *controlplanev1.KubeadmControlPlane
	err := e.pollUntil(ctx, st, limit, func(live bool) ([]string, error) {
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
		unsettled := Unsettled(cp)
		if len(unsettled) == 0 {
			return nil, nil
		}
		// A move of CoreDNS KCP refuses fails every reconcile of KCP's
		// before it writes its observedGeneration: once that is all KCP
		// lacks, the rollout is done, and the add-on's trouble is said
		// as a warning (awaitAddons).
		var refused *workload.CoreDNSRefusedError
		if onlyGenerationUnobserved(cp) {
			if _, err := e.Workload.CoreDNSBehind(ctx, cp.KCP); errors.As(err, &refused) {
				return nil, nil
			}
		}
		return unsettled, nil
	}, func(unsettled []string) error {
		// What the tool saw (a generation not observed) is KCP failing its
		// reconcile; why is in KCP's own conditions.
		if says := KCPSays(last); len(says) > 0 {
			return exitcode.Timeoutf("KCP did not settle within --handback-timeout %s after the hand-back: %s; KCP says: %s",
				limit, strings.Join(unsettled, "; "), strings.Join(says, "; "))
		}
		return exitcode.Timeoutf("KCP did not settle within --handback-timeout %s after the hand-back: %s", limit, strings.Join(unsettled, "; "))
	})
	return last, err
}

// addon is one add-on that has not followed KCP yet.
type addon struct {
	// name names the add-on, what says what it still waits for, and check
	// where a person looks next.
	name, what, check string
}

// addonsBehind reads what kube-proxy and CoreDNS still lack of what kcp
// makes of them (Workload.KubeProxyBehind, CoreDNSBehind), live; a read that
// fails is something to wait for too. refused is a move of CoreDNS KCP
// refuses: nothing to wait for, and a warning.
func (e *Engine) addonsBehind(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) (behind []addon, refused *workload.CoreDNSRefusedError) {
	kubeProxy := addon{name: "kube-proxy", check: fmt.Sprintf("`kubectl -n kube-system get daemonset kube-proxy -o wide` on the workload cluster and KCP's Events (`kubectl -n %s describe kubeadmcontrolplane %s`)",
		e.Reader.Key().Namespace, kcp.Name)}
	switch what, err := e.Workload.KubeProxyBehind(ctx, kcp); {
	case err != nil:
		kubeProxy.what = "cannot read kube-proxy: " + err.Error()
		behind = append(behind, kubeProxy)
	case what != "":
		kubeProxy.what = what
		behind = append(behind, kubeProxy)
	}
	coreDNS := addon{name: "CoreDNS", check: "`kubectl -n kube-system rollout status deployment/coredns` on the workload cluster"}
	switch what, err := e.Workload.CoreDNSBehind(ctx, kcp); {
	case errors.As(err, &refused):
	case err != nil:
		coreDNS.what = "cannot read CoreDNS: " + err.Error()
		behind = append(behind, coreDNS)
	case what != "":
		coreDNS.what = what
		behind = append(behind, coreDNS)
	}
	return behind, refused
}

// errAddonsLate ends awaitAddons' wait at its limit; it never leaves it.
var errAddonsLate = errors.New("the add-ons did not follow in time")

// awaitAddons is awaitSettled's second wait: until kube-proxy and CoreDNS
// follow what kcp, settled, makes of them (addonsBehind), up to limit. It
// returns what the run's end warns of, "" when both follow: the add-ons still
// behind at limit, each with what it waits for and what to check, and a move
// of CoreDNS KCP refuses. Only ctx's end is an error: KCP has agreed the
// rollout is done, and KCP waits for neither add-on itself.
func (e *Engine) awaitAddons(ctx context.Context, st *step, kcp *controlplanev1.KubeadmControlPlane, settled string, limit time.Duration) (string, error) {
	var behind []addon
	var refused *workload.CoreDNSRefusedError
	told := false
	err := e.pollUntil(ctx, st, limit, func(bool) ([]string, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		behind, refused = e.addonsBehind(ctx, kcp)
		if len(behind) > 0 && !told {
			told = true
			st.waiting(fmt.Sprintf("%s; waiting up to %s for kube-proxy and CoreDNS to follow", settled, limit))
		}
		var left []string
		for _, a := range behind {
			left = append(left, a.what)
		}
		return left, nil
	}, func([]string) error { return errAddonsLate })
	var warnings []string
	switch {
	case errors.Is(err, errAddonsLate):
		warnings = append(warnings, addonsLate(behind, limit))
	case err != nil:
		return "", err
	}
	if refused != nil {
		warnings = append(warnings, refused.Error())
	}
	return strings.Join(warnings, "; and "), nil
}

// addonsLate is the warning for the add-ons still behind after limit.
func addonsLate(behind []addon, limit time.Duration) string {
	var names, what, check []string
	for _, a := range behind {
		names, what, check = append(names, a.name), append(what, a.what), append(check, a.check)
	}
	have := "has"
	if len(names) > 1 {
		have = "have"
	}
	return fmt.Sprintf("%s %s not followed within %s: %s; check %s", strings.Join(names, " and "), have, limit,
		strings.Join(what, "; "), strings.Join(check, ", and "))
}

// pollUntil reads with check, again at each change (or every etcdPoll),
// until check finds nothing left to wait for, reporting on st each time
// what it waits for first changes. After limit, expired turns what is still
// left into the error that ends the wait; an error from check ends it at
// once. check reads the watches' caches, or live when asked: live at least
// every pollLiveEvery, so that a watch gone silent delays the wait by no more
// than that, and every answer that ends the wait, done or failed, is checked
// live first.
func (e *Engine) pollUntil(ctx context.Context, st *step, limit time.Duration, check func(live bool) ([]string, error), expired func(left []string) error) error {
	var awaited string
	began, lastLive := time.Now(), time.Now()
	for {
		// Past the limit the read is live too: a cache fallen behind must
		// not be what fails the wait.
		overdue := time.Since(began) > limit
		live := e.Cache == nil || time.Since(lastLive) > pollLiveEvery || overdue
		if live {
			lastLive = time.Now()
		}
		left, err := check(live)
		if !live && (err != nil || len(left) == 0) {
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
		if overdue {
			return expired(left)
		}
		e.waitForChange(ctx, etcdPoll)
	}
}

// readControlPlane is the management cluster's part of a snapshot, live or
// from the watches' caches.
func (e *Engine) readControlPlane(ctx context.Context, live bool) (*kcpstate.ControlPlane, error) {
	if live || e.Cache == nil {
		return e.Reader.Read(ctx)
	}
	return e.Cache.ControlPlane.Read(ctx)
}
