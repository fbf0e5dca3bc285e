package controlplane

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// TestReleaseAfterALateRenewal: a renewal the API server writes after
// Release read the Lease makes the guarded delete conflict; Release reads the
// Lease again and deletes it, instead of failing a finished run.
func TestReleaseAfterALateRenewal(t *testing.T) {
	ctx := context.Background()
	deletes := 0
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if deletes++; deletes == 1 {
				return apierrors.NewConflict(coordinationv1.Resource("leases"), obj.GetName(), nil)
			}
			return c.Delete(ctx, obj, opts...)
		},
	}).Build()
	cp := New(c, "default", "demo")
	lock, err := cp.Acquire(ctx, "ops@bastion/pid-7", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("release after a conflict: %v", err)
	}
	if lease, err := cp.Lease(ctx); err != nil || lease != nil {
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
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			requests++
			return c.Get(ctx, key, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			requests++
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	cp := New(c, "default", "demo")
	lock, err := cp.Acquire(ctx, "ops@bastion/pid-7", nil)
	if err != nil {
		t.Fatal(err)
	}
	lease := func() *coordinationv1.Lease {
		l, err := cp.Lease(ctx)
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

// heldLease puts a Lease held by another run in place, its renew time 20 s
// in the past by this machine's clock (the holder's clock is behind), with a
// duration of d.
func heldLease(t *testing.T, ctx context.Context, c client.Client, d time.Duration) *coordinationv1.Lease {
	t.Helper()
	stale := metav1.NewMicroTime(time.Now().Add(-20 * time.Second))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: LeaseName("demo")},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("ci@runner/pid-1-abcde"), RenewTime: &stale,
			LeaseDurationSeconds: ptr.To(int32(d / time.Second))},
	}
	if err := c.Create(ctx, lease); err != nil {
		t.Fatal(err)
	}
	return lease
}

// renewing plays the holder: it writes the Lease every second, leaving the
// renew time as its skewed clock wrote it, until stop is called.
func renewing(c client.Client) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				l := &coordinationv1.Lease{}
				if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: LeaseName("demo")}, l); err != nil {
					return err
				}
				// Any write is a renewal to an observer.
				l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
				return c.Update(ctx, l)
			})
		}
	}()
	return func() { cancel(); <-done }
}

// TestExpiryIsObservedNotRead: a Lease whose renew time looks 20 s old by
// this clock, but which its holder writes every second, is alive: Acquire
// and BreakLock both refuse (exit 5) and leave it. Once the writes stop, both
// wait out the Lease's duration from their own first look and then act.
func TestExpiryIsObservedNotRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, verb := range []string{"acquire", "break"} {
		t.Run(verb, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientBuilder().WithScheme(Scheme()).Build()
			cp := New(c, "default", "demo")
			act := func() error {
				var told bool
				waiting := func(*coordinationv1.Lease) { told = true }
				var err error
				if verb == "acquire" {
					_, err = cp.Acquire(ctx, "ops@bastion/pid-1-fghij", waiting)
				} else {
					_, err = cp.BreakLock(ctx, false, waiting)
				}
				if !told {
					t.Error("the wait for a held Lease was not told")
				}
				return err
			}

			heldLease(t, ctx, c, 3*time.Second)
			stop := renewing(c)
			if err := act(); exitcode.Of(err) != exitcode.Locked || !strings.Contains(err.Error(), "ci@runner/pid-1-abcde") {
				t.Errorf("%s while the holder renews: %v, want exit 5 naming the holder", verb, err)
			}
			stop()
			if l, _ := cp.Lease(ctx); l == nil || ptr.Deref(l.Spec.HolderIdentity, "") != "ci@runner/pid-1-abcde" {
				t.Fatalf("%s changed a live run's Lease: %v", verb, l)
			}

			began := time.Now()
			if err := act(); err != nil {
				t.Fatalf("%s once the holder stopped: %v", verb, err)
			}
			if took := time.Since(began); took < 3*time.Second {
				t.Errorf("%s acted %s after its first look, before the Lease's 3 s could pass unrenewed", verb, took.Round(time.Millisecond))
			}
			l, _ := cp.Lease(ctx)
			switch {
			case verb == "acquire" && (l == nil || ptr.Deref(l.Spec.HolderIdentity, "") != "ops@bastion/pid-1-fghij"):
				t.Errorf("after acquire the Lease is %v", l)
			case verb == "break" && l != nil:
				t.Errorf("after break the Lease is still there: %v", l)
			}
		})
	}
}

// TestKeepRidesOutOneSlowRenewal: a renewal that takes 6 s once, on a loaded
// API server, neither loses the lock nor lets Held fail.
func TestKeepRidesOutOneSlowRenewal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Second)
	defer cancel()
	var updates atomic.Int32
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if updates.Add(1) == 1 {
				select {
				case <-time.After(6 * time.Second):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	lock, err := New(c, "default", "demo").Acquire(ctx, "ops@bastion/pid-7-abcde", nil)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	go lock.Keep(ctx, func(err error) { lost <- err })
	for ctx.Err() == nil {
		if err := lock.Held(); err != nil {
			t.Fatalf("after %d renewals: %v", updates.Load(), err)
		}
		select {
		case err := <-lost:
			t.Fatalf("lost the lock: %v", err)
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
		}
	}
	// Sent at 2 s (slow, done at 8 s), then at 10 s and 12 s.
	if n := updates.Load(); n < 3 {
		t.Errorf("%d renewals in 14 s, want one every %s after the slow one", n, RetryPeriod)
	}
}

// TestHungRenewalFencesWrites: when renewals hang, the run learns it lost
// the lock at the renew deadline, and from then on no write passes the
// fence, while reads and the Lease's own requests still do.
func TestHungRenewalFencesWrites(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hang := atomic.Bool{}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if hang.Load() {
				<-ctx.Done()
				return ctx.Err()
			}
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	fence := &Fence{Namespace: "default", Lease: LeaseName("demo")}
	cp := New(c, "default", "demo")
	cp.Fence = fence
	var sent []string
	next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = append(sent, r.Method+" "+r.URL.Path)
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
	})
	fenced := fence.Wrap(next)
	do := func(method, path string) error {
		req, _ := http.NewRequestWithContext(ctx, method, "https://mgmt"+path, nil)
		_, err := fenced.RoundTrip(req)
		return err
	}
	const machine = "/apis/cluster.x-k8s.io/v1beta2/namespaces/default/machines/demo-cp-1"
	if err := do(http.MethodDelete, machine); err != nil {
		t.Fatalf("a write before any lock: %v", err)
	}

	lock, err := cp.Acquire(ctx, "ops@bastion/pid-7-abcde", nil)
	if err != nil {
		t.Fatal(err)
	}
	hang.Store(true)
	taken := time.Now()
	lost := make(chan error, 1)
	go lock.Keep(ctx, func(err error) { lost <- err })
	// Writes pass while the lock is held.
	if err := do(http.MethodPatch, machine); err != nil {
		t.Fatalf("a write under a held lock: %v", err)
	}
	select {
	case err := <-lost:
		if took := time.Since(taken); took < RenewDeadline-time.Second || took > RenewDeadline+RetryPeriod {
			t.Errorf("lost after %s, want at the renew deadline (%s)", took.Round(time.Millisecond), RenewDeadline)
		}
		if exitcode.Of(lock.Held()) != exitcode.Locked {
			t.Errorf("Held after the loss: %v (lost: %v)", lock.Held(), err)
		}
	case <-ctx.Done():
		t.Fatal("a hung renewal never lost the lock")
	}
	before := len(sent)
	for _, method := range []string{http.MethodPost, http.MethodPatch, http.MethodPut, http.MethodDelete} {
		if err := do(method, machine); exitcode.Of(err) != exitcode.Locked {
			t.Errorf("%s after the lock was lost: %v, want refused with exit 5", method, err)
		}
	}
	if len(sent) != before {
		t.Errorf("writes sent after the lock was lost: %v", sent[before:])
	}
	for _, path := range []string{machine, "/apis/coordination.k8s.io/v1/namespaces/default/leases/cp-rollout-demo", "/api/v1/namespaces/default/events"} {
		method := http.MethodGet
		if path != machine {
			method = http.MethodPost
		}
		if err := do(method, path); err != nil {
			t.Errorf("%s %s after the loss: %v, want it through", method, path, err)
		}
	}
	if err := do(http.MethodDelete, "/apis/coordination.k8s.io/v1/namespaces/default/leases/kube-controller-manager"); err == nil {
		t.Error("a write to another Lease went through after the loss")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestWhoDiffersPerProcess: two processes with the same user, host name and
// PID (containers) still name different holders (who is what each process
// computes once), and one process always names itself the same.
func TestWhoDiffersPerProcess(t *testing.T) {
	if Who() != Who() {
		t.Fatalf("Who changed within one process: %s, %s", Who(), Who())
	}
	if !regexp.MustCompile(`^.+@.*/pid-\d+-[a-z0-9]{5}$`).MatchString(Who()) {
		t.Errorf("Who() = %q, want user@host/pid-N-random", Who())
	}
	seen := map[string]bool{}
	for range 20 {
		seen[who()] = true
	}
	if len(seen) != 20 {
		t.Errorf("20 identities computed on one host with one PID: %d distinct, want 20", len(seen))
	}
}
