package controlplane

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// LockedBy is the refusal a run meets while lease's live holder runs (exit 5).
func (c *Client) LockedBy(lease *coordinationv1.Lease) error {
	return exitcode.Lockedf("cluster %s/%s is locked by %s, which still renews it: wait for that run to end (a run that is gone no longer renews it, and a new run takes its lock over once it has watched it go %s unrenewed)",
		c.Namespace, c.Cluster, runlock.Holder(lease), runlock.DurationOf(lease))
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
		if time.Since(observed) >= runlock.DurationOf(lease) {
			return lease, true, nil
		}
		select {
		case <-ctx.Done():
			return nil, false, ctx.Err()
		case <-time.After(runlock.RetryPeriod):
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
func (c *Client) Acquire(ctx context.Context, holder string, waiting func(*coordinationv1.Lease)) (*runlock.Lock, error) {
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
		LeaseDurationSeconds: ptr.To(int32(runlock.LeaseDuration / time.Second)),
		AcquireTime:          &sent,
		RenewTime:            &sent,
	}
	if lease == nil {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: runlock.LeaseName(c.Cluster)},
			Spec:       want,
		}
		if err := c.c.Create(ctx, lease); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return nil, exitcode.Lockedf("cluster %s/%s is locked by another run that started just now", c.Namespace, c.Cluster)
			}
			return nil, fmt.Errorf("creating Lease %s: %w", runlock.LeaseName(c.Cluster), err)
		}
	} else {
		lease.Spec = want
		// The resourceVersion observed unchanged makes the take-over fail if
		// the holder renewed after all, or another run took it first.
		if err := c.c.Update(ctx, lease); err != nil {
			if apierrors.IsConflict(err) {
				return nil, exitcode.Lockedf("cluster %s/%s was locked by another run just now", c.Namespace, c.Cluster)
			}
			return nil, fmt.Errorf("taking over Lease %s: %w", runlock.LeaseName(c.Cluster), err)
		}
	}
	lock := runlock.New(c.c, lease, holder, sent.Time)
	if c.Fence != nil {
		c.Fence.arm(lock)
	}
	return lock, nil
}

// Lease returns the cluster's Lease, nil when there is none.
func (c *Client) Lease(ctx context.Context) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: runlock.LeaseName(c.Cluster)}, lease); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading Lease %s: %w", runlock.LeaseName(c.Cluster), err)
	}
	return lease, nil
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
				c.Namespace, c.Cluster, runlock.Holder(lease))
		}
	}
	// The resourceVersion watched unchanged: a renewal that lands meanwhile
	// makes the delete fail instead of breaking a live run's lock.
	err = c.c.Delete(ctx, lease, client.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion})
	switch {
	case apierrors.IsConflict(err):
		return "", exitcode.Lockedf("cluster %s/%s: the lock was renewed or taken just now; not broken", c.Namespace, c.Cluster)
	case err != nil && !apierrors.IsNotFound(err):
		return "", fmt.Errorf("deleting Lease %s: %w", runlock.LeaseName(c.Cluster), err)
	}
	return runlock.Holder(lease), nil
}
