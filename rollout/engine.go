// Package rollout is the engine: guards (pure checks over one snapshot of a
// control plane), the one-step decision (snapshot + target → the next step),
// the plan (that decision projected to the end), and a blocking loop that
// reads a live snapshot, asks for the next step, performs it or waits for its
// effect, until the control plane matches the target.
//
// Every verb (upgrade, scale, replace, plan, status) decides through the guards
// and Next here, so there is one definition of "safe". The engine reaches the
// clusters only through the interfaces below, so the loop can be driven by a
// scripted world in tests.
package rollout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// ControlPlane is what the engine reads and writes on the management cluster:
// every role at once, as *controlplane.Client plays them. The Engine takes
// it role by role (Plays); whatever needs one role takes that role (viaOf a
// Topology, withSpec a Reader, orLockedOut a ClusterLock), and a test sets
// on the Engine only the roles it is about.
type ControlPlane interface {
	Reader
	Machines
	ClusterLock
	HandOver
	Topology
}

// Source is where a snapshot's management-cluster half comes from: KCP's own
// view of the control plane, read live or from the watches' caches.
type Source interface {
	Read(ctx context.Context) (*kcpstate.ControlPlane, error)
}

// Reader reads the control plane live.
type Reader interface {
	Source
	// Key names the Cluster.
	Key() types.NamespacedName
	// ReadKCP reads the Cluster and its KubeadmControlPlane alone.
	ReadKCP(ctx context.Context) (*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane, error)
	// WithKCP is cp as KCP would see it with want as its spec.
	WithKCP(ctx context.Context, cp *kcpstate.ControlPlane, want *controlplanev1.KubeadmControlPlane) (*kcpstate.ControlPlane, error)
	// KubeadmConfigsUnread reports whether the reads go without the
	// machines' KubeadmConfigs, which the identity may not read.
	KubeadmConfigsUnread() bool
	// Unjudged names the machines of cp whose up-to-dateness is unknown
	// without their KubeadmConfigs.
	Unjudged(cp *kcpstate.ControlPlane) collections.Machines
}

// Machines is what a run does to the machines, as KCP would.
type Machines interface {
	// CreateReplacement creates one machine as KCP would, in failureDomain.
	CreateReplacement(ctx context.Context, cp *kcpstate.ControlPlane, failureDomain string) (*clusterv1.Machine, error)
	// EnsureCleanupHook puts the kcp-cleanup pre-terminate hook on a victim.
	EnsureCleanupHook(ctx context.Context, m *clusterv1.Machine) error
	Delete(ctx context.Context, m *clusterv1.Machine) error
	// RemoveCleanupHook releases a deleting machine to the Machine controller.
	RemoveCleanupHook(ctx context.Context, m *clusterv1.Machine) error
	// SyncMachine pushes the KubeadmControlPlane's in-place-mutable fields
	// to m as KCP's syncMachines would.
	SyncMachine(ctx context.Context, cp *kcpstate.ControlPlane, m *clusterv1.Machine) error
	// DrainRules names the MachineDrainRules Cluster API's drain follows
	// for the cluster's machines.
	DrainRules(ctx context.Context) ([]string, error)
	Orphans(ctx context.Context, cp *kcpstate.ControlPlane) ([]client.Object, error)
	DeleteOrphan(ctx context.Context, obj client.Object) error
}

// ClusterLock is the cluster's Lease, which serialises runs.
type ClusterLock interface {
	// Acquire takes the Lease, watching a held one for expiry first (and
	// telling waiting so).
	Acquire(ctx context.Context, holder string, waiting func(*coordinationv1.Lease)) (*runlock.Lock, error)
	Lease(ctx context.Context) (*coordinationv1.Lease, error)
	// LockedBy is the refusal a run meets while lease's live holder runs.
	LockedBy(lease *coordinationv1.Lease) error
	BreakLock(ctx context.Context, force bool, waiting func(*coordinationv1.Lease)) (string, error)
}

// HandOver is taking the KubeadmControlPlane over from KCP and handing it
// back: pause with a record, target, hand back.
type HandOver interface {
	// Pause pauses kcp, as just read with its cluster, with rec; it asks
	// mayTakeOver again on what it reads before each attempt.
	Pause(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, rec record.Record, timeout time.Duration, mayTakeOver func(*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane) error) (*controlplanev1.KubeadmControlPlane, error)
	// AwaitPaused waits until KCP reports Paused on kcp, paused already.
	AwaitPaused(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, timeout time.Duration) (*controlplanev1.KubeadmControlPlane, error)
	// SetTarget sets the target where its owner reads it: the KCP, or a
	// topology Cluster (then it returns once the topology controller has
	// written it into the KCP, or topologyTimeout has passed).
	SetTarget(ctx context.Context, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, version, template string, replicas *int32, topologyTimeout time.Duration) error
	// CheckTemplate refuses a KubeadmControlPlane whose InfraMachineTemplate
	// cannot be read: no machine could be made from it.
	CheckTemplate(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) error
	Resume(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) error
	Restore(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, rec record.Record) error
	Complete(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) error
	// SetRemediation sets KCP's remediation-in-progress annotation on kcp
	// to value, or removes it when value is "": the bookkeeping KCP keeps
	// when it remediates, kept by the run in its stead.
	SetRemediation(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, value string) error
	// RecordFailure adds a failed run's reason to the record on kcp, as
	// just read, while its pause stands.
	RecordFailure(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, f record.Failure) error
}

// Topology is what a ClusterClass cluster's upgrade reads besides the
// control plane.
type Topology interface {
	// MachineDeployments are the cluster's workers, which --wait-workers
	// follows on a topology cluster.
	MachineDeployments(ctx context.Context) ([]clusterv1.MachineDeployment, error)
	// ClassUpgradePlan is the topology controller's plan, from the
	// cluster's ClusterClass, to go from one version to another.
	ClassUpgradePlan(ctx context.Context, cluster *clusterv1.Cluster, from, target string) ([]string, error)
}

// Workload is what the engine reads and writes on the workload cluster;
// *workload.Client provides it.
type Workload interface {
	// Nodes reads the health of the named nodes and their static pods.
	Nodes(ctx context.Context, names []string, components []string) (map[string]workload.Node, error)
	// NodeByProviderID names the one node with that provider ID, or "".
	NodeByProviderID(ctx context.Context, providerID string) (string, error)
	// PrepareRollout updates what kubeadm reads on the workload cluster before
	// machines of a new version join, as KCP does.
	PrepareRollout(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, etcdManaged bool) error
	// Drain cordons a node and evicts its pods, as Cluster API's drain
	// would, for at most limit; Uncordon gives the node back.
	Drain(ctx context.Context, node string, limit time.Duration) (workload.Drained, error)
	Uncordon(ctx context.Context, node string) error
	// Cordoned names the control-plane nodes Drain cordoned and nobody gave back.
	Cordoned(ctx context.Context) ([]string, error)
	// KubeProxyBehind says how kube-proxy differs from what KCP makes of it
	// once the machines are done, or "" when it does not.
	KubeProxyBehind(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) (string, error)
	// CoreDNSBehind says how CoreDNS differs from what KCP makes of it once
	// the machines are done, its rollout included, or "" when it does not.
	CoreDNSBehind(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) (string, error)
	// DaemonSetsUnready lists the DaemonSets Ready on one of peers and not
	// on node: the first of the gates between machines (gates.go).
	DaemonSetsUnready(ctx context.Context, node string, peers []string) ([]workload.UnreadyDaemonSet, error)
}

// Etcd is what the engine needs of etcd; *etcd.Client provides it.
type Etcd interface {
	Members(ctx context.Context, nodes []etcd.Node) ([]etcd.Member, error)
	ForwardLeadership(ctx context.Context, nodes []etcd.Node, from, to uint64) error
	// RemoveMember reports how long etcd held the removal back (its
	// five-second rule after a member joins).
	RemoveMember(ctx context.Context, nodes []etcd.Node, id uint64) (held time.Duration, err error)
}

// Changes tells the loop when to read again; *changes.Watches provides it.
type Changes interface {
	// Wait returns at the next change (true), at ctx's end, or after at most
	// max (false): the bound covers what no watch reports (etcd).
	Wait(ctx context.Context, max time.Duration) bool
}

// Cache is the control plane as the watches see it: what waits read, so that
// waiting costs no round trips to the API servers (etcd is still read, at
// most every etcdPoll). A cache may lag behind a change by a moment, so no
// step that changes something, and no conclusion, is decided on it: the loop
// reads live first (see Converge and await).
type Cache struct {
	// ControlPlane is a controlplane.Client over the watches' caches.
	ControlPlane Source
	// Workload is the nodes and static pods the watches hold.
	Workload nodeReader
}

// readFunc is a function as a Source.
type readFunc func(ctx context.Context) (*kcpstate.ControlPlane, error)

func (f readFunc) Read(ctx context.Context) (*kcpstate.ControlPlane, error) { return f(ctx) }

// nodeReader is the read of Workload's nodes, live or cached.
type nodeReader interface {
	Nodes(ctx context.Context, names []string, components []string) (map[string]workload.Node, error)
}

// Audit is where a failed run says, on the Cluster and the
// KubeadmControlPlane themselves, what its pause blocks; *audit.Trail
// provides it.
type Audit interface {
	Warn(action, reason, note string, regarding ...client.Object)
}

// Lock is the run's hold on the cluster; *runlock.Lock provides it. It is
// passed to what runs under it (holding, Converge), never kept.
type Lock interface {
	// Held fails once the lock is lost or about to be.
	Held() error
}

// Engine runs the blocking loop against one control plane.
type Engine struct {
	// The management cluster, role by role: Plays sets them all from one
	// control plane; a test sets the ones it is about, and a role it leaves
	// nil panics when used.
	Reader   Reader
	Machines Machines
	// Lease is the cluster's lock; the lock a run takes is passed, not kept.
	Lease    ClusterLock
	HandOver HandOver
	Topology Topology

	Workload Workload
	// Etcd is nil when etcd is external.
	Etcd Etcd
	// Changes may be nil: the loop then reads again every etcdPoll.
	Changes Changes
	// Cache may be nil: waits then read live.
	Cache    *Cache
	Reporter progress.Reporter
	// Audit may be nil: a failed run then writes no Events of its own.
	Audit    Audit
	Timeouts Timeouts
	// Requests, when set, counts the run's round trips for its summary.
	Requests func() progress.Requests
	// GateOutput is where the operator's --gate writes; nil is the
	// process's standard error (Timeouts.Gates says what runs).
	GateOutput io.Writer
	// BetweenMachines, when set, is asked between two machine steps, when
	// one has ended and nothing is in flight, before the next begins (the
	// operator's --interactive): an error stops the run there, as any stop,
	// leaving the pause and record for a re-run. nil goes on (interactive.go).
	BetweenMachines func(ctx context.Context, b Boundary) error

	// What follows is the engine's memory across snapshots, its own account
	// of what it did and saw: no snapshot is kept here; each decision is
	// taken on the snapshot passed to it. What one loop remembers between
	// its turns is the loop's (see loop).
	steps stepLog
	// machineFrom is where in steps.times the machine step in progress
	// began, for what BetweenMachines is told of it.
	machineFrom int
	// seenHealthy names the machines this engine has read healthy.
	seenHealthy map[string]bool
}

// Plays has cp play every management-cluster role of e, and returns e: the
// one place an engine is given its control plane, so none is forgotten.
func (e *Engine) Plays(cp ControlPlane) *Engine {
	e.Reader, e.Machines, e.Lease, e.HandOver, e.Topology = cp, cp, cp, cp, cp
	return e
}

// Read takes one live snapshot: management cluster first, then the workload
// nodes of its machines, then etcd through those nodes. It checks nothing
// and retries nothing: a run's loop reads through readOurs.
func (e *Engine) Read(ctx context.Context) (*Snapshot, error) {
	return e.snapshot(ctx, e.Reader, e.Workload, false, nil)
}

// SnapshotOf completes cp, the control plane as connecting read it a moment
// ago, into a snapshot for a verb's first look (Prepare, status) rather than
// read it again: the workload cluster and etcd are read now. With cp nil it
// is Read. Nothing that changes the cluster is decided on it: every step
// reads live again.
func (e *Engine) SnapshotOf(ctx context.Context, cp *kcpstate.ControlPlane) (*Snapshot, error) {
	if cp == nil {
		return e.Read(ctx)
	}
	return e.snapshot(ctx, readFunc(func(context.Context) (*kcpstate.ControlPlane, error) { return cp, nil }), e.Workload, false, nil)
}

// snapshot is every read's one way to a snapshot: the management cluster
// through src, the nodes through nodes, then etcd; from the caches (cached)
// or live. A cached one may take the etcd members of prev, the snapshot
// before it.
func (e *Engine) snapshot(ctx context.Context, src Source, nodes nodeReader, cached bool, prev *Snapshot) (*Snapshot, error) {
	cp, err := src.Read(ctx)
	if err != nil {
		return nil, err
	}
	if err := e.findUnreferencedNodes(ctx, cp); err != nil {
		return nil, err
	}
	s := NewSnapshot(cp)
	s.cached = cached
	if s.EtcdManaged && e.Etcd == nil {
		return nil, fmt.Errorf("KubeadmControlPlane %s manages etcd but no etcd client is configured", cp.KCP.Name)
	}
	names := s.nodeNames()
	if s.Nodes, err = nodes.Nodes(ctx, names, components(s)); err != nil {
		return nil, err
	}
	if s.EtcdManaged && len(names) > 0 {
		if s.Members, s.MembersRead, err = e.etcdMembers(ctx, s, prev); err != nil {
			err = fmt.Errorf("workload cluster %s: etcd: %w", e.Reader.Key(), err)
			// Members whose certificates the cluster's etcd CA did not sign
			// cannot be trusted, and no retry mends that: refuse at once.
			var untrusted *etcd.UntrustedError
			if errors.As(err, &untrusted) {
				return nil, exitcode.New(exitcode.Unsafe, err)
			}
			return nil, err
		}
	}
	e.rememberHealthy(s)
	return s, nil
}

// etcdMembers reads the membership through s's nodes; a cached snapshot
// takes prev's while prev read them less than etcdPoll ago, so that a burst
// of changes on the watches does not poll etcd more than once a second.
func (e *Engine) etcdMembers(ctx context.Context, s, prev *Snapshot) ([]etcd.Member, time.Time, error) {
	if s.cached {
		if prev != nil && time.Since(prev.MembersRead) < etcdPoll {
			return prev.Members, prev.MembersRead, nil
		}
		// A wait's read does not sit out etcd's retries: a member that does
		// not answer soon fails it, and the live read that follows (see
		// readOurs) finds the cause, or waits for etcd with its full limits.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cachedEtcdLimit)
		defer cancel()
	}
	at := time.Now()
	members, err := e.Etcd.Members(ctx, EtcdNodes(s))
	if err != nil {
		return nil, time.Time{}, err
	}
	return members, at, nil
}

// cachedEtcdLimit bounds the etcd read of a wait's cached snapshot.
const cachedEtcdLimit = 5 * time.Second

// etcdDue is how long until a cached read after s reads etcd again:
// etcdPoll when s did not read it.
func etcdDue(s *Snapshot) time.Duration {
	if s == nil || s.MembersRead.IsZero() {
		return etcdPoll
	}
	return max(etcdPoll-time.Since(s.MembersRead), 10*time.Millisecond)
}

// findUnreferencedNodes gives a deleting machine whose nodeRef was never set,
// and one a MachineHealthCheck condemned (its nodeStartupTimeout passed), the
// node its provider ID names, as KCP does when it remediates one and when it
// serves the pre-terminate hook (tryGetEtcdMemberName): without it, the
// machine would be deleted and released while its etcd member stays.
func (e *Engine) findUnreferencedNodes(ctx context.Context, cp *kcpstate.ControlPlane) error {
	for _, m := range cp.Machines.Filter(collections.Or(collections.HasDeletionTimestamp, MHCCondemned), collections.Not(collections.HasNode())) {
		id := providerID(cp, m)
		if id == "" {
			continue
		}
		node, err := e.Workload.NodeByProviderID(ctx, id)
		if err != nil {
			return err
		}
		if node != "" {
			found := m.DeepCopy()
			found.Status.NodeRef.Name = node
			cp.Machines.Insert(found)
		}
	}
	return nil
}

// rememberHealthy hands s what earlier reads saw healthy, then adds what is
// healthy in s for the reads to come.
func (e *Engine) rememberHealthy(s *Snapshot) {
	if e.seenHealthy == nil {
		e.seenHealthy = map[string]bool{}
	}
	s.SeenHealthy = maps.Clone(e.seenHealthy)
	for _, m := range s.CP.Machines {
		if Problem(s, m) == nil {
			e.seenHealthy[m.Name] = true
		}
	}
}

// EtcdNodes lists the nodes etcd members can be reached on, in the order to
// try them: newest machines first and deleting ones last, because the oldest
// machine is usually the one leaving and its member the first to go.
func EtcdNodes(s *Snapshot) []etcd.Node {
	var nodes, leaving []etcd.Node
	sorted := s.CP.Machines.SortedByCreationTimestamp()
	for i := len(sorted) - 1; i >= 0; i-- {
		m := sorted[i]
		n, ok := s.Nodes[nodeName(m)]
		if !ok || !n.Found {
			continue
		}
		if m.DeletionTimestamp.IsZero() {
			nodes = append(nodes, etcd.Node{Name: n.Name, IP: n.InternalIP})
		} else {
			leaving = append(leaving, etcd.Node{Name: n.Name, IP: n.InternalIP})
		}
	}
	return append(nodes, leaving...)
}
