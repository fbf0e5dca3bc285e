package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
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
	// can only have seen it after that.
	renewed time.Time
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
// it (see awaitExpiry).
func Live(l *coordinationv1.Lease, now time.Time) bool {
	if ptr.Deref(l.Spec.HolderIdentity, "") == "" || l.Spec.RenewTime == nil {
		return false
	}
	return now.Before(l.Spec.RenewTime.Add(durationOf(l)))
}

// durationOf is how long l's holder promises to renew within.
func durationOf(l *coordinationv1.Lease) time.Duration {
	return time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, int32(LeaseDuration/time.Second))) * time.Second
}

// LockedBy is the refusal a run meets while lease's live holder runs (exit 5).
func (c *Client) LockedBy(lease *coordinationv1.Lease) error {
	return exitcode.Lockedf("cluster %s/%s is locked by %s, which still renews it: wait for that run to end (a run that is gone no longer renews it, and a new run takes its lock over once it has watched it go %s unrenewed)",
		c.Namespace, c.Cluster, Holder(lease), LeaseDuration)
}

// awaitExpiry watches a held Lease for its duration, reading it every
// RetryPeriod as client-go's leader election does, and returns it as last
// read: expired when nobody wrote it meanwhile (or its holder let it go),
// and not expired when it changed under a holder, who is then alive. A nil
// Lease means it was deleted meanwhile.
func (c *Client) awaitExpiry(ctx context.Context, lease *coordinationv1.Lease) (_ *coordinationv1.Lease, expired bool, err error) {
	observed := time.Now()
	for {
		if ptr.Deref(lease.Spec.HolderIdentity, "") == "" {
			return lease, true, nil
		}
		if time.Since(observed) >= durationOf(lease) {
			return lease, true, nil
		}
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-time.After(RetryPeriod):
		}
		fresh, err := c.Lease(ctx)
		switch {
		case err != nil || fresh == nil:
			return nil, false, err
		case fresh.ResourceVersion != lease.ResourceVersion && ptr.Deref(fresh.Spec.HolderIdentity, "") != "":
			return fresh, false, nil
		}
		lease = fresh
	}
}

// Acquire takes the cluster's Lease for holder, or fails with exit code 5
// naming the live holder. A Lease someone holds is watched first (waiting
// is told so): it is taken over only if it goes its duration unrenewed.
func (c *Client) Acquire(ctx context.Context, holder string, waiting func(*coordinationv1.Lease)) (*Lock, error) {
	lease, err := c.Lease(ctx)
	if err != nil {
		return nil, err
	}
	if lease != nil && ptr.Deref(lease.Spec.HolderIdentity, "") != "" {
		if waiting != nil {
			waiting(lease)
		}
		expired := false
		if lease, expired, err = c.awaitExpiry(ctx, lease); err != nil {
			return nil, err
		}
		if lease != nil && !expired {
			return nil, c.LockedBy(lease)
		}
	}
	sent := metav1.NowMicro()
	want := coordinationv1.LeaseSpec{
		HolderIdentity:       &holder,
		LeaseDurationSeconds: ptr.To(int32(LeaseDuration / time.Second)),
		AcquireTime:          &sent,
		RenewTime:            &sent,
	}
	if lease == nil {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: LeaseName(c.Cluster)},
			Spec:       want,
		}
		if err := c.c.Create(ctx, lease); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return nil, exitcode.Lockedf("cluster %s/%s is locked by another run that started just now", c.Namespace, c.Cluster)
			}
			return nil, fmt.Errorf("creating Lease %s: %w", LeaseName(c.Cluster), err)
		}
	} else {
		lease.Spec = want
		// The resourceVersion observed unchanged makes the take-over fail if
		// the holder renewed after all, or another run took it first.
		if err := c.c.Update(ctx, lease); err != nil {
			if apierrors.IsConflict(err) {
				return nil, exitcode.Lockedf("cluster %s/%s was locked by another run just now", c.Namespace, c.Cluster)
			}
			return nil, fmt.Errorf("taking over Lease %s: %w", LeaseName(c.Cluster), err)
		}
	}
	lock := &Lock{c: c.c, lease: lease, holder: holder, renewed: sent.Time}
	if c.Fence != nil {
		c.Fence.arm(lock)
	}
	return lock, nil
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
	return l.renewed.Add(RenewDeadline)
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
	if since := time.Since(l.renewed); since >= RenewDeadline {
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
	l.lease, l.renewed = lease, sent.Time
	l.mu.Unlock()
	return nil
}

// Release gives the Lease up if it is still ours. Stop Keep first. Even then
// a renewal that Keep gave up waiting for may still be written by the API
// server after this read: the delete, guarded by the resourceVersion read,
// then conflicts, and the Lease is read and deleted again.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	key := client.ObjectKeyFromObject(l.lease)
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

// Lease returns the cluster's Lease, nil when there is none.
func (c *Client) Lease(ctx context.Context) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: LeaseName(c.Cluster)}, lease); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Lease %s: %w", LeaseName(c.Cluster), err)
	}
	return lease, nil
}

// Who identifies this process as a Lease holder and in operation records:
// user, host and process, so a colleague knows whom to ask, and a random
// part, as client-go's leader election adds one, so two processes that share
// a user, host name and PID (containers, cloned VMs) are still two holders.
var Who = sync.OnceValue(who)

func who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s/pid-%d-%s", name, host, os.Getpid(), rand.String(5))
}

// BreakLock deletes the cluster's Lease when its holder is gone or, with
// force, at once. A Lease someone holds is watched first (waiting is told
// so), as Acquire watches it: it is deleted only if it goes its duration
// unrenewed. It returns the holder it removed, "" when there was no Lease.
func (c *Client) BreakLock(ctx context.Context, force bool, waiting func(*coordinationv1.Lease)) (string, error) {
	lease, err := c.Lease(ctx)
	if err != nil || lease == nil {
		return "", err
	}
	if !force && ptr.Deref(lease.Spec.HolderIdentity, "") != "" {
		if waiting != nil {
			waiting(lease)
		}
		expired := false
		if lease, expired, err = c.awaitExpiry(ctx, lease); err != nil || lease == nil {
			return "", err
		}
		if !expired {
			return "", exitcode.Lockedf("cluster %s/%s is locked by %s, a run that still renews it: stop it first (or pass --force if you are sure it is gone)",
				c.Namespace, c.Cluster, Holder(lease))
		}
	}
	// The resourceVersion watched unchanged: a renewal that lands meanwhile
	// makes the delete fail instead of breaking a live run's lock.
	err = c.c.Delete(ctx, lease, client.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion})
	switch {
	case apierrors.IsConflict(err):
		return "", exitcode.Lockedf("cluster %s/%s: the lock was renewed or taken just now; not broken", c.Namespace, c.Cluster)
	case err != nil && !apierrors.IsNotFound(err):
		return "", fmt.Errorf("deleting Lease %s: %w", LeaseName(c.Cluster), err)
	}
	return Holder(lease), nil
}
