package rollout

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// takenLock is the ClusterLock role of a cluster whose lock, free when
// handback looks, is taken by a run that starts right after.
type takenLock struct{ ClusterLock }

func (takenLock) BreakLock(context.Context, bool, func(*coordinationv1.Lease)) (string, error) {
	return "", nil
}

func (takenLock) Acquire(context.Context, string, func(*coordinationv1.Lease)) (*runlock.Lock, error) {
	return nil, exitcode.Lockedf("cluster default/demo is locked by bob@host/pid-2-abcde, which still renews it")
}

// handingBack is the HandOver role of a control plane handed back: it
// records the unpause on f, and a failure recorded under the lock of lease.
type handingBack struct {
	HandOver
	f     *scripted
	lease *fakeLease
	// resumed: the KubeadmControlPlane was unpaused.
	resumed  bool
	recorded []record.Failure
	// lockedWhileRecording: the record was written under the run's lock.
	lockedWhileRecording bool
}

func (h *handingBack) Resume(context.Context, *controlplanev1.KubeadmControlPlane) error {
	h.resumed = true
	h.f.record("resume")
	return nil
}

func (h *handingBack) RecordFailure(ctx context.Context, _ *controlplanev1.KubeadmControlPlane, failure record.Failure) error {
	lease, _ := h.lease.Lease(ctx)
	h.lockedWhileRecording = lease != nil && runlock.Holder(lease) != ""
	h.recorded = append(h.recorded, failure)
	return nil
}

// handingBackOn is an engine on f whose lock is lock and whose HandOver
// role is handingBack's, which it returns.
func handingBackOn(f *scripted, lock ClusterLock) (*Engine, *handingBack) {
	h := &handingBack{f: f}
	if l, ok := lock.(*fakeLease); ok {
		h.lease = l
	}
	e, _ := engineFor(f, fast)
	e.Lease, e.HandOver = lock, h
	return e, h
}

// TestHandbackUnpausesOnlyUnderTheLock: a run that takes the lock between
// handback's look and its unpause is not unpaused under its feet: handback
// exits 5 naming it and leaves the KCP paused.
func TestHandbackUnpausesOnlyUnderTheLock(t *testing.T) {
	e, h := handingBackOn(newScripted(pausedByUs(world(machineSpec{}))), takenLock{})
	_, err := e.Handback(context.Background(), false)
	if exitcode.Of(err) != exitcode.Locked || !strings.Contains(err.Error(), "bob@host") {
		t.Errorf("handback while another run took the lock: %v, want exit 5 naming it", err)
	}
	if h.resumed {
		t.Error("handback unpaused the KCP under another run")
	}
}

// fakeLease is the ClusterLock role of a fake management cluster whose
// Lease is free until a run takes it: Acquire hands out a real runlock.Lock
// over it.
type fakeLease struct {
	ClusterLock
	c client.Client
}

func newFakeLease() *fakeLease { return &fakeLease{c: fake.NewClientBuilder().Build()} }

var leaseKey = client.ObjectKey{Namespace: "default", Name: runlock.LeaseName("demo")}

func (l *fakeLease) Acquire(ctx context.Context, holder string, _ func(*coordinationv1.Lease)) (*runlock.Lock, error) {
	sent := metav1.NowMicro()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: leaseKey.Namespace, Name: leaseKey.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, AcquireTime: &sent, RenewTime: &sent,
			LeaseDurationSeconds: ptr.To(int32(runlock.LeaseDuration / time.Second))},
	}
	if err := l.c.Create(ctx, lease); err != nil {
		return nil, err
	}
	return runlock.New(l.c, lease, holder, sent.Time), nil
}

// Lease returns the Lease, nil when there is none.
func (l *fakeLease) Lease(ctx context.Context) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	if err := l.c.Get(ctx, leaseKey, lease); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return lease, nil
}

// BreakLock finds no stale lock to break.
func (l *fakeLease) BreakLock(context.Context, bool, func(*coordinationv1.Lease)) (string, error) {
	return "", nil
}

// TestHandbackGivesBackLeftCordons: a node an earlier run cordoned and never
// gave back (killed between its drain and the deletion) is uncordoned by
// handback, under the lock and before KCP is unpaused (KCP could otherwise
// start draining it itself); the node of a machine being deleted stays
// cordoned for Cluster API's drain.
func TestHandbackGivesBackLeftCordons(t *testing.T) {
	w := pausedByUs(world(machineSpec{outdated: true, deleting: true}, machineSpec{}, machineSpec{}))
	f := newScripted(w)
	f.cordoned = []string{"n0", "n1"}
	e, h := handingBackOn(f, newFakeLease())
	done, err := e.Handback(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(done.Uncordoned, []string{"n1"}) {
		t.Errorf("uncordoned %v, want n1", done.Uncordoned)
	}
	if !h.resumed {
		t.Error("the KCP was not unpaused")
	}
	if got := strings.Join(f.calls, ", "); got != "uncordon n1, resume" {
		t.Errorf("calls %q, want n1 alone uncordoned (n0's machine is being deleted), before KCP is unpaused", got)
	}
	if !strings.Contains(strings.Join(done.Lines(), "\n"), "uncordoned node(s) n1") {
		t.Errorf("handback says %q, want the uncordon named", done.Lines())
	}
	if lease, _ := h.lease.Lease(context.Background()); lease != nil {
		t.Errorf("the lock handback took was not released: %s", runlock.Holder(lease))
	}
}

// TestResumedRunWaitsForKCPToReportPaused: a run that resumes under its
// record acts only once KCP reports Paused, as after a fresh pause: the run
// that paused may have stopped before KCP said so.
func TestResumedRunWaitsForKCPToReportPaused(t *testing.T) {
	stop := errors.New("stop after the target")
	for _, tc := range []struct {
		name        string
		reported    bool
		neverPaused error
		calls       string
	}{
		{"KCP has not reported Paused yet", false, nil, "await-paused, set-target"},
		{"KCP reports Paused already", true, nil, "set-target"},
		{"KCP never reports Paused", false, exitcode.Timeoutf("did not report Paused"), "await-paused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := pausedByUs(world(machineSpec{outdated: true}))
			if tc.reported {
				conditions.Set(w.CP.KCP, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionTrue, Reason: clusterv1.PausedReason})
			}
			f := newScripted(w)
			e := engineWithHandover(f, &handover{setTargetErr: stop, awaitPausedErr: tc.neverPaused})
			_, err := e.takeOver(context.Background(), nil, Request{Operation: "upgrade", Version: "v1.36.3"}, "v1.36.3")
			want := stop
			if tc.neverPaused != nil {
				want = tc.neverPaused
			}
			if !errors.Is(err, want) {
				t.Fatalf("got %v, want %v", err, want)
			}
			if got := strings.Join(f.calls, ", "); got != tc.calls {
				t.Fatalf("calls %s, want %s", got, tc.calls)
			}
		})
	}
}

// TestHandedBackLines: what Handback did, in the sentences the handback verb
// prints.
func TestHandedBackLines(t *testing.T) {
	rec := &record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "alice@ops/pid-1", Started: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)}
	h := &HandedBack{KCP: "demo-cp", LockBrokenFrom: "bob@ops/pid-2", Uncordoned: []string{"n1", "n2"}, UncordonFailed: errors.New("connection refused"),
		Record: rec, KCPWillDo: []string{"scale from 2 to 3 machines", "finish deleting m0"}}
	want := []string{
		"released the lock held by bob@ops/pid-2",
		"uncordoned node(s) n1, n2, cordoned by a run that stopped before deleting their machines",
		"nodes an earlier run may have left cordoned were not all given back (connection refused): run handback again once the workload cluster answers, or kubectl uncordon the nodes annotated " + workload.CordonedAnnotation,
		"unpaused KubeadmControlPlane demo-cp and removed the record of upgrade to v1.36.3 by alice@ops/pid-1, started 2026-12-01T08:00:00Z",
		"KCP will now scale from 2 to 3 machines, and finish deleting m0",
	}
	if got := h.Lines(); !slices.Equal(got, want) {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	h.KCPWillDo = nil
	if got := h.Lines(); got[len(got)-1] != "KCP has nothing to do: every machine is up to date" {
		t.Errorf("nothing left for KCP: %q", got)
	}
	if got := (&HandedBack{KCP: "demo-cp"}).Lines(); !slices.Equal(got, []string{"KubeadmControlPlane demo-cp carries no operation of this tool: nothing to hand back"}) {
		t.Errorf("no record: %q", got)
	}
}
