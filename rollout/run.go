package rollout

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"time"

	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// PauseTimeout bounds the wait for the KCP controller to report Paused.
var PauseTimeout = 2 * time.Minute

// ErrNothingToDo is returned by Prepare when the control plane already
// matches the request.
var ErrNothingToDo = errors.New("nothing to do")

// Prepared is a checked request, ready to run: the snapshot it was checked on
// and the target the loop drives towards.
type Prepared struct {
	Request  Request
	Snapshot *Snapshot
	Target   Target
	// Steps counts the machine steps expected, for progress.
	Steps int
}

// Prepare reads the control plane and checks the request against it without
// changing anything: bad input is exit 2, an unsafe state exit 3, and a
// control plane that already matches (and carries no record of ours) is
// ErrNothingToDo.
func (e *Engine) Prepare(ctx context.Context, r Request) (*Prepared, error) {
	s, err := e.Read(ctx)
	if err != nil {
		return nil, err
	}
	if err := CheckState(s, r); err != nil {
		return nil, err
	}
	want, err := Desired(ctx, s, r)
	if err != nil {
		return nil, err
	}
	rec, err := controlplane.RecordOf(s.CP.KCP)
	if err != nil {
		return nil, err
	}
	// A replace that was interrupted after its machine went resumes on the
	// record alone; one that finished (and was killed before it could say
	// so) is found in the last operation's record.
	if _, ok := s.CP.Machines[r.Replace]; r.Replace != "" && rec == nil && !ok {
		if last := controlplane.LastOf(s.CP.KCP); last != nil && last.Finished != nil && last.Operation == r.Operation && last.Target == r.TargetString() {
			return nil, fmt.Errorf("%w: machine %s was replaced by %s, finished %s", ErrNothingToDo,
				r.Replace, last.Who, last.Finished.Format(time.RFC3339))
		}
		return nil, exitcode.Usagef("machine %s is not a control-plane machine of cluster %s", r.Replace, s.CP.Cluster.Name)
	}
	projected, err := e.ControlPlane.WithKCP(ctx, s.CP, want)
	if err != nil {
		return nil, err
	}
	future := *s
	future.CP = projected
	t := TargetFor(want, r)
	p := &Prepared{Request: r, Snapshot: &future, Target: t}
	outdated := NeedingRollout(&future, t).Len()
	delta := int(t.Replicas) - s.CP.Machines.Filter(collections.Not(collections.HasDeletionTimestamp)).Len()
	p.Steps = outdated + max(delta, -delta)
	if rec == nil && outdated == 0 && delta == 0 && Deleting(s).Len() == 0 {
		return p, ErrNothingToDo
	}
	// Refuse an unsafe control plane now, before the lock and the pause: a
	// refusal then changes nothing.
	if step := Next(ctx, &future, t); step.Action == Refuse {
		return nil, step.Err
	}
	return p, nil
}

// Run performs a prepared request with the KCP hand-over around the loop:
// take the cluster's Lease, pause the KubeadmControlPlane (and wait until KCP
// says it is paused), record the operation, set the target, converge, then
// hand back — remove the pause and record — and release the Lease. If the run
// stops early the KCP stays paused with the record, so a re-run resumes and
// status explains; the Lease is always released.
func (e *Engine) Run(ctx context.Context, p *Prepared) (err error) {
	lock, err := e.ControlPlane.Acquire(ctx, Who())
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	keepCtx, stopKeeping := context.WithCancel(runCtx)
	kept := make(chan struct{})
	go func() {
		defer close(kept)
		lock.Keep(keepCtx, func(lost error) { cancel(exitcode.New(exitcode.Locked, lost)) })
	}()
	defer func() {
		stopKeeping()
		<-kept // no renewal may race the release
		if rerr := lock.Release(context.WithoutCancel(ctx)); rerr != nil && err == nil {
			err = fmt.Errorf("releasing the lock: %w", rerr)
		}
		if cause := context.Cause(runCtx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause // the lost lock explains the stop better than its echo
		}
	}()
	e.Lock = lock

	live, err := e.ControlPlane.Read(runCtx)
	if err != nil {
		return err
	}
	rec, err := controlplane.RecordOf(live.KCP)
	if err != nil {
		return err
	}
	began := time.Now()
	if rec == nil {
		e.report("pause", "", progress.Started, "pausing KubeadmControlPlane "+live.KCP.Name, began)
		rec := controlplane.Record{Operation: p.Request.Operation, Target: p.Request.TargetString(), Who: Who(), Started: time.Now().UTC()}
		kcp, err := e.ControlPlane.Pause(runCtx, rec, PauseTimeout)
		if err != nil {
			if kcp != nil {
				// Paused, then found it must not go on: hand back at once.
				_ = e.ControlPlane.Resume(context.WithoutCancel(ctx), kcp)
			}
			return err
		}
		e.finish("pause", "", "KCP reports Paused", began)
	} else {
		e.report("resume", "", progress.Done, "continuing "+rec.String(), began)
	}

	// The target is set on the live object, read after the pause.
	if live, err = e.ControlPlane.Read(runCtx); err != nil {
		return err
	}
	if err := e.ControlPlane.SetTarget(runCtx, live.KCP, p.Request.Version, p.Request.Replicas); err != nil {
		return err
	}
	if live, err = e.ControlPlane.Read(runCtx); err != nil {
		return err
	}
	// A resumed run skipped the pause: make sure KCP is still paused before
	// touching what only a paused KCP leaves alone.
	if err := e.stillOurs(&Snapshot{CP: live}); err != nil {
		return err
	}
	e.removeOrphans(runCtx, live)
	if outdated, _ := live.MachinesNeedingRollout(); outdated.Len() > 0 {
		if err := e.Workload.PrepareRollout(runCtx, live.KCP, etcd.Managed(live.KCP)); err != nil {
			return err
		}
	}

	e.Total = p.Steps
	if err := e.Converge(runCtx, p.Target); err != nil {
		return err
	}

	s, err := e.Read(runCtx)
	if err != nil {
		return err
	}
	began = time.Now()
	if err := e.ControlPlane.Complete(runCtx, s.CP.KCP); err != nil {
		return err
	}
	e.report("handback", "", progress.Done, "KubeadmControlPlane "+s.CP.KCP.Name+" unpaused; KCP is in charge again", began)
	return nil
}

// removeOrphans deletes what a killed run left between creating a
// replacement's InfraMachine and KubeadmConfig and creating its Machine. A
// leftover costs resources, not safety: when it cannot be looked for or
// deleted (RBAC may not allow listing the infrastructure kind), the run says
// so and goes on.
func (e *Engine) removeOrphans(ctx context.Context, cp *pkg.ControlPlane) {
	began := time.Now()
	orphans, err := e.ControlPlane.Orphans(ctx, cp)
	if err != nil {
		e.report("remove-orphan", "", progress.Failed, "could not look for pieces an interrupted run left behind: "+err.Error()+"; going on", began)
		return
	}
	for _, obj := range orphans {
		began := time.Now()
		what := obj.GetObjectKind().GroupVersionKind().Kind + " " + obj.GetName()
		e.report("remove-orphan", obj.GetName(), progress.Started, what+" has no Machine: an interrupted run created it; deleting it", began)
		if err := e.ControlPlane.DeleteOrphan(ctx, obj); err != nil {
			e.report("remove-orphan", obj.GetName(), progress.Failed, err.Error()+"; going on", began)
			continue
		}
		e.report("remove-orphan", obj.GetName(), progress.Done, what+" deleted", began)
	}
}

// Who identifies this run in the Lease and the operation record.
func Who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s/pid-%d", name, host, os.Getpid())
}
