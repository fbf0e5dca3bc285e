package rollout

import (
	"context"
	"time"

	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"

	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// Held is what Hold did: the pause record on the KubeadmControlPlane, and
// whether an earlier `pause` had set it already.
type Held struct {
	KCP     string
	Record  record.Record
	Already bool
}

// Hold pauses the KubeadmControlPlane as a run does, under a record of
// `pause` with who and why, so that a change of its spec made next does not
// start KCP's own rollout: a verb of this tool then takes the pause over and
// rolls the change one machine at a time (or handback lets KCP roll it).
// It takes the cluster's Lease for the pause, waits until KCP reports Paused
// and releases the Lease: the pause alone holds the control plane after it.
// A KubeadmControlPlane held by `pause` already is left as it is; one paused
// by someone else, or by another operation of this tool, is refused (exit 3)
// by CheckState, as any run's takeover is.
func (e *Engine) Hold(ctx context.Context, reason string) (*Held, error) {
	check := func(ctx context.Context) (*Held, *kcpstate.ControlPlane, error) {
		cluster, kcp, err := e.Reader.ReadKCP(ctx)
		if err != nil {
			return nil, nil, err
		}
		cp := &kcpstate.ControlPlane{Cluster: cluster, KCP: kcp}
		if err := CheckState(NewSnapshot(cp), Request{Operation: PauseOperation}); err != nil {
			return nil, nil, err
		}
		rec, err := record.Of(kcp)
		if err != nil || rec == nil {
			return nil, cp, err
		}
		return &Held{KCP: kcp.Name, Record: *rec, Already: true}, cp, nil
	}
	// Refused before the lock, as a run's Prepare refuses: a refusal then
	// takes nothing, and a run in flight explains the state best (exit 5).
	held, _, err := check(ctx)
	if err != nil {
		return nil, orLockedOut(ctx, e.Lease, err)
	}
	if held != nil {
		return held, nil
	}
	err = e.holding(ctx, func(ctx context.Context, _ Lock) error {
		// Checked again under the lock: a run may have taken the cluster
		// since the read above.
		var cp *kcpstate.ControlPlane
		if held, cp, err = check(ctx); err != nil || held != nil {
			return err
		}
		rec := record.Record{Operation: string(PauseOperation), Who: record.Who(), Started: time.Now().UTC(), Reason: reason}
		if _, err := e.pause(ctx, cp.Cluster, cp.KCP, rec, nil); err != nil {
			return err
		}
		held = &Held{KCP: cp.KCP.Name, Record: rec}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return held, nil
}
