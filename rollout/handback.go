package rollout

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/utils/ptr"

	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// HandedBack is what Handback did, and what KCP faces now.
type HandedBack struct {
	// KCP names the KubeadmControlPlane.
	KCP string
	// LockBrokenFrom names the holder of the stale lock Handback broke, ""
	// when there was none.
	LockBrokenFrom string
	// Uncordoned are the nodes an earlier run left cordoned, given back;
	// UncordonFailed, when set, is why not all of them could be.
	Uncordoned     []string
	UncordonFailed error
	// Record is the operation record removed with the pause; nil when the
	// KubeadmControlPlane carried none of this tool's: nothing was handed
	// back.
	Record *record.Record
	// KCPWillDo is what KCP will now do by itself, in its own terms; empty
	// when every machine is up to date.
	KCPWillDo []string
}

// Lines says what h holds in sentences, in order, as the handback verb
// prints them.
func (h *HandedBack) Lines() []string {
	var lines []string
	if h.LockBrokenFrom != "" {
		lines = append(lines, "released the lock held by "+h.LockBrokenFrom)
	}
	if len(h.Uncordoned) > 0 {
		lines = append(lines, "uncordoned node(s) "+strings.Join(h.Uncordoned, ", ")+", cordoned by a run that stopped before deleting their machines")
	}
	if h.UncordonFailed != nil {
		lines = append(lines, fmt.Sprintf("nodes an earlier run may have left cordoned were not all given back (%v): run handback again once the workload cluster answers, or kubectl uncordon the nodes annotated %s", h.UncordonFailed, workload.CordonedAnnotation))
	}
	switch {
	case h.Record == nil:
		return append(lines, "KubeadmControlPlane "+h.KCP+" carries no operation of this tool: nothing to hand back")
	case len(h.KCPWillDo) == 0:
		return append(lines, fmt.Sprintf("unpaused KubeadmControlPlane %s and removed the record of %s", h.KCP, h.Record),
			"KCP has nothing to do: every machine is up to date")
	}
	return append(lines, fmt.Sprintf("unpaused KubeadmControlPlane %s and removed the record of %s", h.KCP, h.Record),
		"KCP will now "+strings.Join(h.KCPWillDo, ", and "))
}

// Handback ends this tool's ownership of the control plane: it removes a stale
// lock (a live one only with force), then, holding the lock itself, the pause
// and the operation record, and says what it did and what KCP will do now
// that it is in charge. A pause without our record is someone else's and is
// refused, never removed.
func (e *Engine) Handback(ctx context.Context, force bool) (*HandedBack, error) {
	cp, err := e.Reader.Read(ctx)
	if err != nil {
		return nil, err
	}
	rec, err := record.Of(cp.KCP)
	if err != nil {
		return nil, err
	}
	if err := PausedBySomeoneElse(NewSnapshot(cp)); err != nil {
		return nil, err
	}
	h := &HandedBack{}
	w := e.lockWait("broken")
	h.LockBrokenFrom, err = e.Lease.BreakLock(ctx, force, w.watching)
	w.end(&err)
	if err != nil {
		return nil, err
	}
	// The unpause is made under the lock, on a fresh read: a run that took
	// the cluster since the read above (the lock was free, or just broken)
	// is refused here instead of being unpaused under its feet, and a run
	// that starts now waits for this one. Under the lock too, the nodes an
	// earlier run cordoned and never gave back are uncordoned.
	err = e.holding(ctx, func(ctx context.Context, _ Lock) error {
		if cp, err = e.Reader.Read(ctx); err != nil {
			return err
		}
		if rec, err = record.Of(cp.KCP); err != nil {
			return err
		}
		if rec != nil {
			if err := PausedBySomeoneElse(NewSnapshot(cp)); err != nil {
				return err
			}
		}
		// Nodes first, while KCP is still paused: once it is in charge it may
		// start draining one of them itself. Not a failure of the hand-back: a
		// workload cluster that does not answer is said, with the way on.
		h.Uncordoned, h.UncordonFailed = e.giveBackCordoned(ctx, cp)
		if rec == nil {
			return nil
		}
		if err := e.HandOver.Resume(ctx, cp.KCP); err != nil {
			return err
		}
		h.Record = rec
		return nil
	})
	if err != nil {
		return nil, err
	}
	h.KCP = cp.KCP.Name
	if h.Record != nil {
		h.KCPWillDo = kcpWillDo(cp)
	}
	return h, nil
}

// kcpWillDo is what KCP finds to do on cp, now in its charge, in its own
// terms: roll out, scale, finish deleting.
func kcpWillDo(cp *kcpstate.ControlPlane) []string {
	outdated, _ := cp.MachinesNeedingRollout()
	want, have := int(ptr.Deref(cp.KCP.Spec.Replicas, 1)), cp.Machines.Filter(collections.Not(collections.HasDeletionTimestamp)).Len()
	var todo []string
	if outdated.Len() > 0 {
		todo = append(todo, fmt.Sprintf("roll out %d outdated machine(s) (%s) to %s", outdated.Len(), strings.Join(machineNames(outdated.SortedByCreationTimestamp()), ", "), cp.KCP.Spec.Version))
	}
	if want != have {
		todo = append(todo, fmt.Sprintf("scale from %d to %d machines", have, want))
	}
	if d := Deleting(NewSnapshot(cp)); d.Len() > 0 {
		todo = append(todo, "finish deleting "+strings.Join(machineNames(d.SortedByCreationTimestamp()), ", "))
	}
	return todo
}
