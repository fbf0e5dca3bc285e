package rollout

import (
	"context"
	"errors"
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
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
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

func (h *handbackRace) Acquire(context.Context, string, func(*coordinationv1.Lease)) (*runlock.Lock, error) {
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

// handbackLocked is a control plane whose lock handback takes: a real Lock
// over a fake management cluster.
type handbackLocked struct {
	*scripted
	lease   *fakeLease
	resumed bool
}

// fakeLease is the cluster's Lease on a fake management cluster, free until
// a run takes it: Acquire hands out a real runlock.Lock over it.
type fakeLease struct{ c client.Client }

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

func (h *handbackLocked) BreakLock(context.Context, bool, func(*coordinationv1.Lease)) (string, error) {
	return "", nil
}

func (h *handbackLocked) Acquire(ctx context.Context, holder string, waiting func(*coordinationv1.Lease)) (*runlock.Lock, error) {
	return h.lease.Acquire(ctx, holder, waiting)
}

func (h *handbackLocked) Resume(context.Context, *controlplanev1.KubeadmControlPlane) error {
	h.resumed = true
	h.record("resume")
	return nil
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
	h := &handbackLocked{scripted: f, lease: newFakeLease()}
	e, _ := engineFor(f, fast)
	e.ControlPlane = h
	done, err := e.Handback(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	if !h.resumed {
		t.Error("the KCP was not unpaused")
	}
	if got := strings.Join(f.calls, ", "); got != "uncordon n1, resume" {
		t.Errorf("calls %q, want n1 alone uncordoned (n0's machine is being deleted), before KCP is unpaused", got)
	}
	if !strings.Contains(strings.Join(done, "\n"), "uncordoned node(s) n1") {
		t.Errorf("handback says %q, want the uncordon named", done)
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
			h := &handover{scripted: newScripted(w), setTargetErr: stop, awaitPausedErr: tc.neverPaused}
			e := &Engine{ControlPlane: h, Workload: h, Etcd: h, Changes: h, Timeouts: fast}
			_, err := e.takeOver(context.Background(), Request{Operation: "upgrade", Version: "v1.36.3"}, "v1.36.3")
			want := stop
			if tc.neverPaused != nil {
				want = tc.neverPaused
			}
			if !errors.Is(err, want) {
				t.Fatalf("got %v, want %v", err, want)
			}
			if got := strings.Join(h.calls, ", "); got != tc.calls {
				t.Fatalf("calls %s, want %s", got, tc.calls)
			}
		})
	}
}
