package rollout

import (
	"context"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// Timeouts bound each kind of wait.
type Timeouts struct {
	// Provision bounds a new machine's wait for its node; 0 is no limit.
	Provision time.Duration
	// Health bounds a new machine's wait, once it has a node, for its node,
	// static pods and etcd member to be healthy, and its DaemonSets' wait;
	// and how long the tool keeps retrying when it cannot read the clusters.
	// 0 is no limit on the machine's waits, but not on the retries (limit).
	Health time.Duration
	// Delete bounds a deleting machine's wait, for its pre-terminate stage and
	// then until it is gone; 0 is no limit.
	Delete time.Duration
	// Settle is the soak (--soak; --settle before it, an alias now): a wait
	// after each new machine passed its gates, before the next step.
	Settle time.Duration
	// Gates are what each new machine passes once healthy, before the soak
	// and the next step: its DaemonSets (bounded by Health) and the
	// operator's gate (gates.go).
	Gates Gates
	// Recovery is how long the loop waits for a machine that was healthy and
	// went bad to recover before it refuses to go on; 0 means UnhealthyGrace.
	Recovery time.Duration
	// Handback bounds the wait after the hand-back until KCP has reconciled
	// and agrees the rollout is done (Unsettled); 0 does not wait.
	Handback time.Duration
	// Addons bounds the wait after that until kube-proxy and CoreDNS follow
	// (addonsBehind); its expiry is a warning, never a failure. It has no
	// flag, and 0 means addonsLimit.
	Addons time.Duration
	// Workers, on a topology cluster, bounds the wait after that until the
	// topology controller has upgraded every worker (WorkersBehind); 0 does
	// not wait.
	Workers time.Duration
	// Pause bounds the wait for KCP to report Paused, after this run's pause
	// and when a run resumes under its record.
	Pause time.Duration
	// Topology, on a topology cluster, bounds the wait for the topology
	// controller to copy the target from the Cluster into the KCP; runtime
	// hooks such as BeforeClusterUpgrade can hold that copy for as long as
	// they answer "retry".
	Topology time.Duration
}

// DefaultTimeouts are the flags' defaults.
var DefaultTimeouts = Timeouts{Provision: 20 * time.Minute, Health: 10 * time.Minute, Delete: 20 * time.Minute, Recovery: UnhealthyGrace, Handback: 2 * time.Minute,
	Pause: 2 * time.Minute, Topology: 2 * time.Minute, Gates: Gates{Count: 1, Timeout: DefaultGateTimeout}}

// addonsLimit is Addons when unset. After KCP has settled, kube-proxy
// follows at once (KCP retags its DaemonSet in the reconcile that settles),
// and CoreDNS as fast as its Deployment rolls: two replicas, one at a time,
// each an image pull and a readiness probe, well under a minute on a healthy
// cluster. Two minutes leave room for a slow registry; a CoreDNS slower than
// that is worth a warning to look at, not a run held longer, since the
// rollout itself is done either way. No flag: a wait that cannot fail the
// run gives nobody a reason to tune it, and --no-wait skips it.
const addonsLimit = 2 * time.Minute

// UnhealthyGrace is the default Recovery: long enough for a failed probe, a
// restarting static pod or a member that lost its peers while a node rebooted
// (kubelet's restart back-off alone reaches five minutes, but a pod that
// crash-loops that long is a fault to name, not to wait out), short enough
// that a runbook hears of a real fault in minutes. A machine broken before
// the run starts is refused at once (Broken), not waited on.
const UnhealthyGrace = 3 * time.Minute

func (t Timeouts) recovery() time.Duration {
	if t.Recovery > 0 {
		return t.Recovery
	}
	return UnhealthyGrace
}

// pause and topology are Pause and Topology, their defaults when unset: no
// run may go on without KCP's word that it paused, nor on a KCP the topology
// controller has not written the target into.
func (t Timeouts) pause() time.Duration {
	if t.Pause > 0 {
		return t.Pause
	}
	return DefaultTimeouts.Pause
}

func (t Timeouts) addons() time.Duration {
	if t.Addons > 0 {
		return t.Addons
	}
	return addonsLimit
}

func (t Timeouts) topology() time.Duration {
	if t.Topology > 0 {
		return t.Topology
	}
	return DefaultTimeouts.Topology
}

// etcdPoll is how often etcd is read while waiting: nothing reports etcd
// membership or member health.
const etcdPoll = time.Second

// liveEvery bounds how long a wait goes on the caches alone. The caches
// follow the API servers within moments, but a wait that ends only on a
// difference it sees should not depend on that: a cache that stopped would
// otherwise keep it waiting until its limit.
const liveEvery = 30 * time.Second

// pollLiveEvery is liveEvery for the waits after the hand-back (pollUntil),
// which read the caches as well: they last seconds, not the minutes a machine
// may take, so a live read every few seconds costs a few requests, and a
// cache that stopped (a watch that went silent) delays the run's end by no
// more than that, where it used to fail it with exit 4 at --handback-timeout.
const pollLiveEvery = 5 * time.Second

// waitKind is what a wait is for; it decides the wait's limit and what its
// expiry says.
type waitKind int

const (
	// waitRead: the clusters could not be read (unreachable API server or etcd).
	waitRead waitKind = iota
	// waitProvision: a new machine has no node yet.
	waitProvision
	// waitHealth: a new machine has a node and is not healthy yet.
	waitHealth
	// waitDeletion: a machine is deleting.
	waitDeletion
	// waitRecovery: a machine that was healthy went bad.
	waitRecovery
	// waitDaemonSets: a new machine is healthy and its node's DaemonSets
	// are not yet all Ready (awaitDaemonSets).
	waitDaemonSets
)

// limit is how long a wait of this kind may last; 0 is no limit, as the
// flags' 0 is, as --timeout's is: a site whose machines take as long as they
// take bounds the run with --timeout, if at all.
func (k waitKind) limit(t Timeouts) time.Duration {
	switch k {
	case waitProvision:
		return t.Provision
	case waitDeletion:
		return t.Delete
	case waitRecovery:
		return t.recovery()
	case waitRead:
		// --health-timeout 0 lifts the limit on a machine's health, not on
		// a management or workload cluster that stopped answering: a run
		// that cannot read holds the control plane paused and sees
		// nothing, so it gives up after the default and says why.
		if t.Health == 0 {
			return DefaultTimeouts.Health
		}
	}
	return t.Health
}

// expired is the error that ends a wait of this kind after limit, with last
// the step it was still waiting on. A machine that does not recover is a
// refusal (exit 3), every other wait a timeout (exit 4).
func (k waitKind) expired(limit time.Duration, last Step, lastErr error) error {
	m := machineName(last.Machine)
	switch k {
	case waitRead:
		return exitcode.Timeoutf("could not read the control plane for %s: %v", limit, lastErr)
	case waitRecovery:
		return last.Err
	case waitProvision:
		return exitcode.Timeoutf("timed out after %s waiting for machine %s to get a node; last seen: %s", limit, m, last.Reason)
	case waitDeletion:
		return exitcode.Timeoutf("timed out after %s waiting for machine %s to be deleted; last seen: %s", limit, m, last.Reason)
	case waitDaemonSets:
		return exitcode.Timeoutf("timed out after %s (--health-timeout) waiting for the DaemonSets on node %s of machine %s to be Ready as on the other control-plane nodes; last seen: %s; %s",
			limit, nodeName(last.Machine), m, last.Reason, gatedAgain)
	}
	return exitcode.Timeoutf("timed out after %s waiting for machine %s to be healthy; last seen: %s", limit, m, last.Reason)
}

// joinWait tells the two stages of a join apart: a new machine first waits
// for its node (provisioning), then for its health.
func joinWait(next Step) waitKind {
	if nodeName(next.Machine) == "" {
		return waitProvision
	}
	return waitHealth
}

// wait tracks one wait: its limit runs from when its kind first appeared and
// restarts when the kind changes; a new reason within it is news to report.
type wait struct {
	kind   waitKind
	reason string
	since  time.Time
}

// observe records what is awaited now and reports whether it is news.
func (w *wait) observe(kind waitKind, reason string) bool {
	if w.since.IsZero() || w.kind != kind {
		*w = wait{kind: kind, reason: reason, since: time.Now()}
		return true
	}
	if w.reason != reason {
		w.reason = reason
		return true
	}
	return false
}

// expired returns the wait's expiry error once its limit, if it has one,
// has passed.
func (w *wait) expired(t Timeouts, last Step, lastErr error) error {
	if limit := w.kind.limit(t); limit > 0 && time.Since(w.since) > limit {
		return w.kind.expired(limit, last, lastErr)
	}
	return nil
}

// await holds step open while Next keeps answering the step it started on
// (same action, same machine): it reports each new reason, reads again at
// every change the watches report and whenever etcd is due (etcdPoll), and
// ends when Next answers something else, returning the live snapshot it
// ended on, on which the caller's loop decides again — or when the wait's
// limit is spent. s is the snapshot the wait started on.
//
// A wait reads the watches' caches (readOurs), and live every liveEvery.
// It never ends on a cached read: when one shows something else to do, a
// live read confirms it first, so that the step after the wait acts on a
// state all read just now.
func (e *loop) await(ctx context.Context, t Target, st *step, s *Snapshot, first Step, kind func(Step) waitKind) (*Snapshot, error) {
	var w wait
	next := first
	lastLive := time.Now()
	for {
		if w.observe(kind(next), next.Reason) {
			st.waiting(next.Reason)
		}
		if err := w.expired(e.Timeouts, next, next.Err); err != nil {
			return nil, err
		}
		e.waitForChange(ctx, etcdDue(s))
		cached := true
		if time.Since(lastLive) > liveEvery {
			cached, lastLive = false, time.Now()
		}
		var err error
		if s, err = e.readOurs(ctx, cached, s); err != nil {
			return nil, err
		}
		if next = Next(ctx, s, t); !sameStep(next, first) && s.cached {
			if s, err = e.readOursLive(ctx); err != nil {
				return nil, err
			}
			next = Next(ctx, s, t)
		}
		if !sameStep(next, first) {
			return s, nil
		}
	}
}

// sameStep is true when next is still the step a wait started on.
func sameStep(next, first Step) bool {
	return next.Action == first.Action && machineName(next.Machine) == machineName(first.Machine) &&
		next.Transient == first.Transient
}

// waitForChange returns at the next change the watches report (true), or
// after at most limit (false). Without watches it sleeps limit, and every
// return counts as a change.
func (e *Engine) waitForChange(ctx context.Context, limit time.Duration) bool {
	if e.Changes == nil {
		_ = sleep(ctx, limit)
		return true
	}
	return e.Changes.Wait(ctx, limit)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
