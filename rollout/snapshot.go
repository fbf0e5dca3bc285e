package rollout

import (
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// Snapshot is everything one decision looks at, read at one moment, with a
// fixed "now". It is never updated: the next decision reads a new one.
type Snapshot struct {
	Now time.Time
	// CP is KCP's own view: Cluster, KubeadmControlPlane, owned Machines with
	// their InfraMachines and KubeadmConfigs, and which are up to date.
	CP *kcpstate.ControlPlane
	// Nodes holds the live health of each machine's node, by node name.
	Nodes map[string]workload.Node
	// EtcdManaged is false for external etcd: then there are no etcd steps.
	EtcdManaged bool
	// Members is the etcd membership with health and leader.
	Members []etcd.Member
	// SeenHealthy names the machines the run has seen healthy before this
	// snapshot: such a machine that is unhealthy now went bad — it is not
	// still joining, whatever its node says.
	SeenHealthy map[string]bool
	// MembersRead is when Members were read from etcd: a cached snapshot
	// may carry those of the snapshot before it (loop.readOurs).
	MembersRead time.Time
	// cached marks a snapshot read from the watches' caches, its etcd part up
	// to etcdPoll old (loop.readOurs): waits decide on one, and no step
	// acts on one.
	cached bool
	// projected marks a snapshot a plan projects steps onto: its machines
	// count as in sync (OutOfSync).
	projected bool
}

// NewSnapshot starts a snapshot from the management cluster's view, taken now;
// Engine.Read adds the workload nodes and etcd members. A snapshot with only
// the first part can answer the management-cluster guards.
func NewSnapshot(cp *kcpstate.ControlPlane) *Snapshot {
	return &Snapshot{Now: time.Now(), CP: cp, EtcdManaged: etcd.Managed(cp.KCP)}
}

// nodeNames lists the nodes of the machines that have one, oldest first.
func (s *Snapshot) nodeNames() []string {
	var names []string
	for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
		if n := nodeName(m); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// Target is what the control plane should become.
type Target struct {
	// Operation names the verb for records and messages.
	Operation Operation
	// Replicas is the number of control-plane machines wanted.
	Replicas int32
	// MaxSurge is how many machines above Replicas a rollout may create: 1
	// (create the replacement first) or 0 (delete first; for clusters without
	// spare capacity).
	MaxSurge int32
	// Replace names one machine that must be replaced even if up to date.
	Replace string
	// Condemned names machines found broken before the run took over that
	// it was asked to replace first (--replace-unhealthy); see Condemned.
	Condemned []string
	// Broken names machines found broken before the run took over that it
	// does not replace: a replace of another broken machine goes on beside
	// them (Admit). Each is held against every step but the remediation's,
	// and never waited on as a machine still joining: it came up before the
	// run and went bad.
	Broken []string
	// Version, when set, is the Kubernetes version the KubeadmControlPlane
	// must ask for: a run never finishes on a spec someone else changed.
	Version string
	// Template, when set, is the InfraMachineTemplate the KubeadmControlPlane
	// must point at, for the same reason.
	Template string
	// RolloutAfter, when set, is a restart's cut-off: machines created before
	// it are replaced, as KCP's spec.rollout.after would have them, which the
	// tool does not write (Git owns the spec). It is the restart record's
	// start, so a resumed restart never replaces a machine it created.
	RolloutAfter time.Time
	// CertificatesExpiryDays, when positive, also replaces the machines whose
	// certificates expire within that many days, as KCP's
	// spec.rollout.before.certificatesExpiryDays would, which the tool does
	// not write either.
	CertificatesExpiryDays int32
}

// nodeName is the name of machine's node, or "" before it has one.
func nodeName(m *clusterv1.Machine) string {
	if m == nil {
		return ""
	}
	return m.Status.NodeRef.Name
}

func machineName(m *clusterv1.Machine) string {
	if m == nil {
		return ""
	}
	return m.Name
}
