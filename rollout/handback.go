package rollout

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/utils/ptr"

	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// Handback ends this tool's ownership of the control plane: it removes a stale
// lock (a live one only with force), then, holding the lock itself, the pause
// and the operation record, and returns what KCP will do now that it is in
// charge. A pause without our record is someone else's and is refused, never
// removed.
func (e *Engine) Handback(ctx context.Context, force bool) ([]string, error) {
	cp, err := e.ControlPlane.Read(ctx)
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
	var done []string
	w := e.lockWait("broken")
	holder, err := e.ControlPlane.BreakLock(ctx, force, w.watching)
	w.end(&err)
	if err != nil {
		return nil, err
	}
	if holder != "" {
		done = append(done, "released the lock held by "+holder)
	}
	// The unpause is made under the lock, on a fresh read: a run that took
	// the cluster since the read above (the lock was free, or just broken)
	// is refused here instead of being unpaused under its feet, and a run
	// that starts now waits for this one. Under the lock too, the nodes an
	// earlier run cordoned and never gave back are uncordoned.
	var handedBack bool
	err = e.holding(ctx, func(ctx context.Context) error {
		if cp, err = e.ControlPlane.Read(ctx); err != nil {
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
		nodes, err := e.giveBackCordoned(ctx, cp)
		if len(nodes) > 0 {
			done = append(done, "uncordoned node(s) "+strings.Join(nodes, ", ")+", cordoned by a run that stopped before deleting their machines")
		}
		if err != nil {
			done = append(done, fmt.Sprintf("nodes an earlier run may have left cordoned were not all given back (%v): run handback again once the workload cluster answers, or kubectl uncordon the nodes annotated %s", err, workload.CordonedAnnotation))
		}
		if rec == nil {
			return nil
		}
		if err := e.ControlPlane.Resume(ctx, cp.KCP); err != nil {
			return err
		}
		handedBack = true
		done = append(done, fmt.Sprintf("unpaused KubeadmControlPlane %s and removed the record of %s", cp.KCP.Name, rec))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !handedBack {
		return append(done, "KubeadmControlPlane "+cp.KCP.Name+" carries no operation of this tool: nothing to hand back"), nil
	}

	// What KCP faces now, in its own terms.
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
	if len(todo) == 0 {
		done = append(done, "KCP has nothing to do: every machine is up to date")
	} else {
		done = append(done, "KCP will now "+strings.Join(todo, ", and "))
	}
	return done, nil
}
