// Package runlock is a run's hold on a cluster: the Lease that serialises
// runs against one cluster, its timing, who holds it, and how long a
// stopping run still has on its way out.
package runlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// The lock's timing is client-go's leader election's (tools/leaderelection
// defaults), and so is how expiry is judged: a Lease is taken over only once
// this process has watched it go LeaseDuration without a change, never from
// the RenewTime another machine's clock wrote. The holder renews every
// RetryPeriod and stops acting RenewDeadline after its last successful
// renewal was sent, so it has stopped at least LeaseDuration-RenewDeadline
// before anyone who saw that renewal may take over.
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// LeaseName is the Lease that serialises runs against one cluster.
func LeaseName(cluster string) string { return "cp-rollout-" + cluster }

// Lock is a held Lease. client-go's leaderelection is not used because a
// second run must fail naming the holder, not queue for the lock; its timing
// and its way of judging expiry are followed.
type Lock struct {
	c      client.Client
	lease  *coordinationv1.Lease
	holder string

	mu   sync.Mutex
	lost error
	// renewed is when the last successful write of the Lease was sent: others
	// can only have seen it after that. It carries both of Go's readings:
	// the monotonic one, which no clock step moves, and the wall one (kept
	// stripped in renewedWall), which goes on while the machine sleeps.
	renewed, renewedWall time.Time
}

// New is the lock of holder, who has just written lease; renewed is when
// that write was sent.
func New(c client.Client, lease *coordinationv1.Lease, holder string, renewed time.Time) *Lock {
	return &Lock{c: c, lease: lease, holder: holder, renewed: renewed, renewedWall: renewed.Round(0)}
}

// Holder describes a Lease's holder for messages. The renew time is the
// holder's clock, shown as a hint only.
func Holder(l *coordinationv1.Lease) string {
	renewed := "never renewed"
	if l.Spec.RenewTime != nil {
		renewed = "renewed " + time.Since(l.Spec.RenewTime.Time).Round(time.Second).String() + " ago by its clock"
	}
	return fmt.Sprintf("%s (%s)", ptr.Deref(l.Spec.HolderIdentity, "unknown"), renewed)
}

// Live reports whether l looks held by its holder's clock: for status, which
// reads once and cannot watch. Decisions to take or break a Lease never use
// it: they watch the Lease for its duration instead.
func Live(l *coordinationv1.Lease, now time.Time) bool {
	if ptr.Deref(l.Spec.HolderIdentity, "") == "" || l.Spec.RenewTime == nil {
		return false
	}
	return now.Before(l.Spec.RenewTime.Add(DurationOf(l)))
}

// MaxLeaseDuration bounds how long a Lease is watched unrenewed before it is
// taken over, whatever duration it claims.
const MaxLeaseDuration = 4 * LeaseDuration

// DurationOf is how long l's holder promises to renew within, as far as this
// tool believes it. Every run writes LeaseDuration; a Lease claiming less
// (zero or negative would let a live holder's lock go at the first look) is
// held to LeaseDuration, and one claiming more than MaxLeaseDuration (a
// Lease written by hand with a huge duration would lock the cluster out for
// good) to MaxLeaseDuration.
func DurationOf(l *coordinationv1.Lease) time.Duration {
	d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, int32(LeaseDuration/time.Second))) * time.Second
	return min(max(d, LeaseDuration), MaxLeaseDuration)
}

// Keep renews the Lease every RetryPeriod until ctx ends. A renewal that
// fails is tried again every RetryPeriod until RenewDeadline after the last
// success, so one slow request on a loaded API server costs nothing. If
// someone else took the Lease, it was deleted, or the deadline passed, Keep
// records the loss and calls onLost so the run stops before another could
// start.
func (l *Lock) Keep(ctx context.Context, onLost func(error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(RetryPeriod):
		}
		// A renewal may take until the deadline: one that lands later is
		// worthless, as the run has stopped acting by then.
		callCtx, cancel := context.WithDeadline(ctx, l.deadline())
		err := l.renew(callCtx)
		cancel()
		if err == nil || ctx.Err() != nil {
			continue
		}
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || l.Held() != nil {
			lost := fmt.Errorf("lost the lock on %s: %w", key(l), err)
			l.mu.Lock()
			l.lost = lost
			l.mu.Unlock()
			onLost(lost)
			return
		}
	}
}

// deadline is when the run must stop acting unless a renewal succeeds first.
func (l *Lock) deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Add(RenewDeadline - l.sinceRenewed())
}

// sinceRenewed is how long ago the last renewal was sent, by whichever of
// the two clocks says longer; l.mu held. The monotonic clock alone would not
// do: on Linux it stops while the machine is suspended, so a laptop whose
// lid closed mid-run would wake to "3 s since renewal" while another run
// took its Lease over. The wall clock goes on, but can be stepped back; the
// larger reading errs on the side of stopping.
func (l *Lock) sinceRenewed() time.Duration {
	now := time.Now()
	return max(now.Sub(l.renewed), now.Round(0).Sub(l.renewedWall))
}

// Held reports, without I/O, whether the lock is still safely held: not lost,
// and its last renewal sent less than RenewDeadline ago. Every acting step
// and every write (Fence) checks it first.
func (l *Lock) Held() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return exitcode.New(exitcode.Locked, l.lost)
	}
	if since := l.sinceRenewed(); since >= RenewDeadline {
		return exitcode.Lockedf("the lock on %s was last renewed %s ago; stopping before another run may take it", l.lease.Name, since.Round(100*time.Millisecond))
	}
	return nil
}

func key(l *Lock) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lease.Name
}

// renew writes a new renew time over the Lease as this run last wrote it, one
// request: the write's resourceVersion makes it fail if anyone wrote the
// Lease since. Then the Lease is read, and renewed on the fresh copy only if
// it still names this run.
func (l *Lock) renew(ctx context.Context) error {
	l.mu.Lock()
	lease := l.lease.DeepCopy()
	l.mu.Unlock()
	key := client.ObjectKeyFromObject(lease)
	sent := metav1.NowMicro()
	lease.Spec.RenewTime = &sent
	err := l.c.Update(ctx, lease)
	if apierrors.IsConflict(err) {
		lease = &coordinationv1.Lease{}
		if err := l.c.Get(ctx, key, lease); err != nil {
			return err
		}
		if ptr.Deref(lease.Spec.HolderIdentity, "") != l.holder {
			return apierrors.NewConflict(coordinationv1.Resource("leases"), lease.Name,
				fmt.Errorf("now held by %s", Holder(lease)))
		}
		lease.Spec.RenewTime = &sent
		err = l.c.Update(ctx, lease)
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.lease, l.renewed, l.renewedWall = lease, sent.Time, sent.Time.Round(0)
	l.mu.Unlock()
	return nil
}

// Release gives the Lease up if it is still ours. Stop Keep first. Even then
// a renewal that Keep gave up waiting for may still be written by the API
// server after this read: the delete, guarded by the resourceVersion read,
// then conflicts, and the Lease is read and deleted again.
// From its first moment the lock counts as not held: another run may take
// the Lease as soon as it is gone, so no write may follow (Held, Fence),
// however recent the last renewal.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	key := client.ObjectKeyFromObject(l.lease)
	if l.lost == nil {
		l.lost = fmt.Errorf("released the lock on %s", key.Name)
	}
	l.mu.Unlock()
	for attempt := 1; ; attempt++ {
		fresh := &coordinationv1.Lease{}
		if err := l.c.Get(ctx, key, fresh); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		}
		if ptr.Deref(fresh.Spec.HolderIdentity, "") != l.holder {
			return nil
		}
		err := l.c.Delete(ctx, fresh, client.Preconditions{UID: &fresh.UID, ResourceVersion: &fresh.ResourceVersion})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err) && attempt < 3:
			continue
		}
		return err
	}
}

// CleanupTimeout bounds what a stopping run still does on its way out:
// release the Lease, undo a pause it cannot keep, delete the pieces of a
// machine it did not finish creating. A Ctrl-C against an unreachable API
// server must not hang until a second signal.
const CleanupTimeout = 10 * time.Second

// CleanupContext is ctx without its cancellation, bounded by CleanupTimeout.
func CleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
}
