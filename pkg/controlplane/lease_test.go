package controlplane

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// heldLease puts a Lease held by another run in place, its renew time 20 s
// in the past by this machine's clock (the holder's clock is behind), with a
// duration of d.
func heldLease(t *testing.T, ctx context.Context, c client.Client, d time.Duration) *coordinationv1.Lease {
	t.Helper()
	stale := metav1.NewMicroTime(time.Now().Add(-20 * time.Second))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: runlock.LeaseName("demo")},
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
				if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: runlock.LeaseName("demo")}, l); err != nil {
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
			// The Lease claims 3 s; no run of the tool promises less than
			// LeaseDuration, so that is how long it is watched.
			if took := time.Since(began); took < runlock.LeaseDuration {
				t.Errorf("%s acted %s after its first look, before %s could pass unrenewed", verb, took.Round(time.Millisecond), runlock.LeaseDuration)
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
		t.Errorf("%d renewals in 14 s, want one every %s after the slow one", n, runlock.RetryPeriod)
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
	fence := &Fence{Namespace: "default", Lease: runlock.LeaseName("demo")}
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
		if took := time.Since(taken); took < runlock.RenewDeadline-time.Second || took > runlock.RenewDeadline+runlock.RetryPeriod {
			t.Errorf("lost after %s, want at the renew deadline (%s)", took.Round(time.Millisecond), runlock.RenewDeadline)
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
