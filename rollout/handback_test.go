package rollout

import (
	"context"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// handbackRace is a control plane whose lock, free when handback looks, is
// taken by a run that starts right after.
type handbackRace struct {
	*scripted
	resumed bool
}

func (h *handbackRace) BreakLock(context.Context, bool, func(*coordinationv1.Lease)) (string, error) {
	return "", nil
}

func (h *handbackRace) Acquire(context.Context, string, func(*coordinationv1.Lease)) (*controlplane.Lock, error) {
	return nil, exitcode.Lockedf("cluster default/demo is locked by bob@host/pid-2-abcde, which still renews it")
}

func (h *handbackRace) Resume(context.Context, *controlplanev1.KubeadmControlPlane) error {
	h.resumed = true
	return nil
}

// TestHandbackUnpausesOnlyUnderTheLock: a run that takes the lock between
// handback's look and its unpause is not unpaused under its feet: handback
// exits 5 naming it and leaves the KCP paused.
func TestHandbackUnpausesOnlyUnderTheLock(t *testing.T) {
	w := pausedByUs(world(machineSpec{}))
	h := &handbackRace{scripted: newScripted(w)}
	e, _ := engineFor(h.scripted, fast)
	e.ControlPlane = h
	_, err := e.Handback(context.Background(), false)
	if exitcode.Of(err) != exitcode.Locked || !strings.Contains(err.Error(), "bob@host") {
		t.Errorf("handback while another run took the lock: %v, want exit 5 naming it", err)
	}
	if h.resumed {
		t.Error("handback unpaused the KCP under another run")
	}
}
