package rollout

import (
	"context"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
)

// awaitPausedAgain is, for a run that resumes under its record, the wait a
// fresh pause makes: the run that set the pause may have stopped before KCP
// reported Paused, and until it does, a reconcile that began before the pause
// may still create or delete machines. Only KCP writes that condition. A KCP
// whose pause annotation is gone is left to the check that the control plane
// is still ours, which names it; waiting would only time out.
func (e *Engine) awaitPausedAgain(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) (_ *controlplanev1.KubeadmControlPlane, err error) {
	if !annotations.HasPaused(kcp) || conditions.IsTrue(kcp, clusterv1.PausedCondition) {
		return kcp, nil
	}
	st := e.begin(Pause, "", "waiting for KubeadmControlPlane "+kcp.Name+" to report the pause this run resumes under")
	defer st.end(&err)
	if kcp, err = e.HandOver.AwaitPaused(ctx, kcp, e.Timeouts.pause()); err != nil {
		return nil, err
	}
	st.done("KCP reports Paused")
	return kcp, nil
}
