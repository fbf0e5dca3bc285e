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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// LeaseDuration is how long a lock stays valid without renewal; a run renews
// it every third of that. A crashed run's lock is free again after it.
const LeaseDuration = 15 * time.Second

// LeaseName is the Lease that serialises runs against one cluster.
func LeaseName(cluster string) string { return "cp-rollout-" + cluster }

// Lock is a held Lease. client-go's leaderelection is not used because a
// second run must fail at once naming the holder, not queue for the lock.
type Lock struct {
	c      client.Client
	lease  *coordinationv1.Lease
	holder string

	mu      sync.Mutex
	lost    error
	renewed time.Time
}

// Holder describes a Lease's holder for messages.
func Holder(l *coordinationv1.Lease) string {
	renewed := "never renewed"
	if l.Spec.RenewTime != nil {
		renewed = "renewed " + time.Since(l.Spec.RenewTime.Time).Round(time.Second).String() + " ago"
	}
	return fmt.Sprintf("%s (%s)", ptr.Deref(l.Spec.HolderIdentity, "unknown"), renewed)
}

// Live reports whether l is held and was renewed within its duration.
func Live(l *coordinationv1.Lease, now time.Time) bool {
	if ptr.Deref(l.Spec.HolderIdentity, "") == "" || l.Spec.RenewTime == nil {
		return false
	}
	d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, int32(LeaseDuration/time.Second))) * time.Second
	return now.Before(l.Spec.RenewTime.Add(d))
}

// LockedBy is the refusal a run meets while lease's live holder runs (exit 5).
func (c *Client) LockedBy(lease *coordinationv1.Lease) error {
	return exitcode.Lockedf("cluster %s/%s is locked by %s: wait for that run, or if it is gone, for the lock to expire (%s)",
		c.Namespace, c.Cluster, Holder(lease), LeaseDuration)
}

// Acquire takes the cluster's Lease for holder, or fails with exit code 5
// naming the live holder. An expired Lease is taken over.
func (c *Client) Acquire(ctx context.Context, holder string) (*Lock, error) {
	now := metav1.NowMicro()
	want := coordinationv1.LeaseSpec{
		HolderIdentity:       &holder,
		LeaseDurationSeconds: ptr.To(int32(LeaseDuration / time.Second)),
		AcquireTime:          &now,
		RenewTime:            &now,
	}
	lease, err := c.Lease(ctx)
	switch {
	case err != nil:
		return nil, err
	case lease == nil:
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
	case Live(lease, now.Time) && ptr.Deref(lease.Spec.HolderIdentity, "") != holder:
		return nil, c.LockedBy(lease)
	default:
		lease.Spec = want
		// The resourceVersion in the update makes two runs taking over one
		// expired Lease at once fail for all but one.
		if err := c.c.Update(ctx, lease); err != nil {
			if apierrors.IsConflict(err) {
				return nil, exitcode.Lockedf("cluster %s/%s was locked by another run just now", c.Namespace, c.Cluster)
			}
			return nil, fmt.Errorf("taking over Lease %s: %w", LeaseName(c.Cluster), err)
		}
	}
	return &Lock{c: c.c, lease: lease, holder: holder, renewed: now.Time}, nil
}

// Keep renews the Lease until ctx ends. If someone else took it, it was
// deleted, or it could not be renewed before it would expire, it records the
// loss and calls onLost so the run stops before another could start.
func (l *Lock) Keep(ctx context.Context, onLost func(error)) {
	ticker := time.NewTicker(LeaseDuration / 3)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		callCtx, cancel := context.WithTimeout(ctx, LeaseDuration/3)
		err := l.renew(callCtx)
		cancel()
		if err == nil || ctx.Err() != nil {
			continue
		}
		// Taken or deleted: lost at once. Unreachable: lost once it may expire.
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

// Held reports, without I/O, whether the lock is still safely held: not lost,
// and renewed recently enough that it cannot have expired for others. Every
// acting step checks it first.
func (l *Lock) Held() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != nil {
		return exitcode.New(exitcode.Locked, l.lost)
	}
	// A margin of a third of the duration covers clock skew and the time the
	// step itself takes.
	if since := time.Since(l.renewed); since > LeaseDuration*2/3 {
		return exitcode.Lockedf("the lock on %s was last renewed %s ago; stopping before it can expire", l.lease.Name, since.Round(time.Second))
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
	now := metav1.NowMicro()
	lease.Spec.RenewTime = &now
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
		lease.Spec.RenewTime = &now
		err = l.c.Update(ctx, lease)
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.lease, l.renewed = lease, now.Time
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
// user, host and process, so a colleague knows whom to ask.
func Who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s/pid-%d", name, host, os.Getpid())
}

// BreakLock deletes the cluster's Lease when its holder is gone (the Lease
// expired) or, with force, even while a holder renews it. It returns the
// holder it removed, "" when there was no Lease.
func (c *Client) BreakLock(ctx context.Context, force bool) (string, error) {
	lease, err := c.Lease(ctx)
	if err != nil || lease == nil {
		return "", err
	}
	if Live(lease, time.Now()) && !force {
		return "", exitcode.Lockedf("cluster %s/%s is locked by %s, a run that is still alive: stop it first (or pass --force if you are sure it is gone)",
			c.Namespace, c.Cluster, Holder(lease))
	}
	err = c.c.Delete(ctx, lease, client.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("deleting Lease %s: %w", LeaseName(c.Cluster), err)
	}
	return Holder(lease), nil
}
