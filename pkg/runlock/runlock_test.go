package runlock

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// acquired is holder's lock on a Lease it has just created.
func acquired(t *testing.T, ctx context.Context, c client.Client, holder string) *Lock {
	t.Helper()
	sent := metav1.NowMicro()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: LeaseName("demo")},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: ptr.To(int32(LeaseDuration / time.Second)),
			AcquireTime: &sent, RenewTime: &sent},
	}
	if err := c.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	return New(c, lease, holder, sent.Time)
}

// readLease reads the Lease, nil when there is none.
func readLease(ctx context.Context, c client.Client) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: LeaseName("demo")}, lease); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return lease, nil
}

// TestReleaseAfterALateRenewal: a renewal the API server writes after
// Release read the Lease makes the guarded delete conflict; Release reads the
// Lease again and deletes it, instead of failing a finished run.
func TestReleaseAfterALateRenewal(t *testing.T) {
	ctx := context.Background()
	deletes := 0
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if deletes++; deletes == 1 {
				return apierrors.NewConflict(coordinationv1.Resource("leases"), obj.GetName(), nil)
			}
			return c.Delete(ctx, obj, opts...)
		},
	}).Build()
	lock := acquired(t, ctx, c, "ops@bastion/pid-7")
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("release after a conflict: %v", err)
	}
	if lease, err := readLease(ctx, c); err != nil || lease != nil {
		t.Errorf("the Lease is still there (%v, %v)", lease, err)
	}
	if deletes != 2 {
		t.Errorf("%d deletes, want the conflicting one and one more", deletes)
	}
}

// TestRenew: a renewal is one write over the Lease as the run last wrote it;
// when someone else wrote it since, the Lease is read again and renewed only
// if it still names the run.
func TestRenew(t *testing.T) {
	ctx := context.Background()
	var requests int
	c := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			requests++
			return c.Get(ctx, key, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			requests++
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	lock := acquired(t, ctx, c, "ops@bastion/pid-7")
	lease := func() *coordinationv1.Lease {
		l, err := readLease(ctx, c)
		if err != nil || l == nil {
			t.Fatalf("reading the Lease: %v, %v", l, err)
		}
		return l
	}

	before := lease().Spec.RenewTime.Time
	requests = 0
	if err := lock.renew(ctx); err != nil {
		t.Fatalf("renew: %v", err)
	}
	if requests != 1 {
		t.Errorf("a renewal took %d requests, want 1", requests)
	}
	if !lease().Spec.RenewTime.After(before) {
		t.Error("the renewal did not move the renew time on")
	}

	// Someone labels the Lease: still ours, renewed on the fresh copy.
	l := lease()
	l.Labels = map[string]string{"team": "sre"}
	if err := c.Update(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := lock.renew(ctx); err != nil {
		t.Fatalf("renew after another write: %v", err)
	}
	if got := lease(); got.Labels["team"] != "sre" {
		t.Errorf("the renewal overwrote another's write: %v", got.Labels)
	}

	// Another run takes it over: lost.
	l = lease()
	other := "ci@runner/pid-9"
	l.Spec.HolderIdentity = &other
	if err := c.Update(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := lock.renew(ctx); !apierrors.IsConflict(err) {
		t.Errorf("renew of a Lease another run holds: %v, want a conflict", err)
	}
}

// TestSuspendedProcessStopsWriting: while a laptop sleeps, Go's monotonic
// clock stands still on Linux and the wall clock goes on. A lock renewed 3 s
// before the lid closed, woken 20 s later, has been unrenewed long enough for
// another run to take its Lease over: it must not count as held. The jump is
// made as a suspend makes it: the wall reading of the last renewal moves 20 s
// into the past, the monotonic one stays.
func TestSuspendedProcessStopsWriting(t *testing.T) {
	ctx := context.Background()
	lock := acquired(t, ctx, fake.NewClientBuilder().Build(), "ops@laptop/pid-7")
	if err := lock.Held(); err != nil {
		t.Fatalf("just acquired: %v", err)
	}
	lock.mu.Lock()
	lock.renewedWall = lock.renewedWall.Add(-(LeaseDuration + 5*time.Second))
	lock.mu.Unlock()
	err := lock.Held()
	if exitcode.Of(err) != exitcode.Locked {
		t.Fatalf("after 20 s of suspend: Held() = %v, want refused with exit 5", err)
	}
	// By the wall clock: 20 s and the moments this test took, not the
	// monotonic clock's few milliseconds.
	m := regexp.MustCompile(`last renewed (\S+) ago`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("Held() = %q, want it to say how long ago the lock was renewed", err)
	}
	if ago, perr := time.ParseDuration(m[1]); perr != nil || ago < LeaseDuration+5*time.Second || ago > LeaseDuration+10*time.Second {
		t.Errorf("Held() = %q, want about 20s ago, by the wall clock", err)
	}
	if left := time.Until(lock.deadline()); left > 0 {
		t.Errorf("a renewal after the suspend may still take %s; want none", left)
	}
}

// TestReleasedLockIsNotHeld: once Release begins, another run may take the
// Lease at once, so no write may pass the fence any more, however recent the
// last renewal was.
func TestReleasedLockIsNotHeld(t *testing.T) {
	ctx := context.Background()
	lock := acquired(t, ctx, fake.NewClientBuilder().Build(), "ops@bastion/pid-7")
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lock.Held(); exitcode.Of(err) != exitcode.Locked || !strings.Contains(err.Error(), "released") {
		t.Errorf("Held() after Release = %v, want refused with exit 5 saying it was released", err)
	}
}

// TestLeaseDurationIsBounded: a Lease's claimed duration is believed only
// within [LeaseDuration, MaxLeaseDuration]: zero or negative would hand a
// live holder's lock over at the first look, a huge one would lock the
// cluster out for good.
func TestLeaseDurationIsBounded(t *testing.T) {
	for _, tc := range []struct {
		seconds *int32
		want    time.Duration
	}{
		{nil, LeaseDuration},
		{ptr.To(int32(-5)), LeaseDuration},
		{ptr.To(int32(0)), LeaseDuration},
		{ptr.To(int32(1)), LeaseDuration},
		{ptr.To(int32(15)), LeaseDuration},
		{ptr.To(int32(40)), 40 * time.Second},
		{ptr.To(int32(2147483647)), MaxLeaseDuration},
	} {
		l := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: tc.seconds}}
		if got := DurationOf(l); got != tc.want {
			t.Errorf("leaseDurationSeconds %v: DurationOf = %s, want %s", ptr.Deref(tc.seconds, -1), got, tc.want)
		}
	}
}
