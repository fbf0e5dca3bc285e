package rollout

import (
	"context"
	"fmt"
	"strings"

	"github.com/blang/semver/v4"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// Request is what a verb asks for. Empty Version and nil Replicas leave the
// KubeadmControlPlane's own values.
type Request struct {
	Operation string
	Version   string
	// Template names the InfraMachineTemplate (of the kind and namespace the
	// KubeadmControlPlane uses today) the machines are rolled to, with the
	// version: a new machine image usually comes with each version.
	Template string
	Replicas *int32
	// MaxSurge is 0 or 1; negative means the KubeadmControlPlane's own.
	MaxSurge int32
	Replace  string
	// ReplaceUnhealthy asks the run to replace first the machines it finds
	// broken before it takes over (Broken), instead of refusing them.
	ReplaceUnhealthy bool
	// Via lists the versions an upgrade passes through before Version, in
	// order, one rollout each (see Hops).
	Via []string
	// CertificatesExpiryDays, when positive, also replaces the machines
	// whose certificates expire within that many days, as KCP's
	// spec.rollout.before.certificatesExpiryDays would, without writing it.
	CertificatesExpiryDays int32
}

// TargetString is the request's target for records and messages.
func (r Request) TargetString() string {
	var parts []string
	if r.Version != "" {
		parts = append(parts, r.Version)
		if len(r.Via) > 0 {
			parts[len(parts)-1] += " via " + strings.Join(r.Via, ",")
		}
	}
	if r.Template != "" {
		parts = append(parts, "template="+r.Template)
	}
	if r.Replicas != nil {
		parts = append(parts, fmt.Sprintf("replicas=%d", *r.Replicas))
	}
	if r.Replace != "" {
		parts = append(parts, "machine="+r.Replace)
	}
	// rollout and restart change no spec: what they replace is their target.
	switch r.Operation {
	case "rollout":
		parts = append(parts, "spec")
	case "restart":
		parts = append(parts, "every machine")
	}
	// In the record, so a resumed run finds the same criterion.
	if r.CertificatesExpiryDays > 0 {
		parts = append(parts, fmt.Sprintf("certificates-expiring-within=%dd", r.CertificatesExpiryDays))
	}
	return strings.Join(parts, ",")
}

// Matched says, for a control plane with nothing to replace, what it already
// matches.
func (r Request) Matched() string {
	switch r.Operation {
	case "rollout":
		m := "nothing to do: no machine is outdated against the KubeadmControlPlane's spec"
		if r.CertificatesExpiryDays > 0 {
			m += fmt.Sprintf(" or has certificates expiring within %d days", r.CertificatesExpiryDays)
		}
		return m
	case "restart":
		return "nothing to do: every machine was created since the restart began"
	}
	return "nothing to do: the control plane already matches " + r.TargetString()
}

// ParseVersion accepts a Kubernetes version as KCP does, but insists on the
// leading "v" users see everywhere else. what names where v came from
// (--version, --via): the error, bad input, says what was wanted there, with
// an example made from v where it can be, so that v1.36 is told it names a
// minor and not a release (semver's own words, "No Major.Minor.Patch
// elements found", would not).
func ParseVersion(what, v string) (semver.Version, error) {
	bare := strings.TrimPrefix(v, "v")
	parsed, err := semver.Parse(bare)
	if err == nil && bare != v {
		return parsed, nil
	}
	example := "v1.36.3"
	if err == nil {
		example = "v" + bare // only the "v" is missing
	} else if _, err := semver.Parse(bare + ".0"); err == nil {
		example = "v" + bare + ".0" // a minor alone
	}
	return semver.Version{}, exitcode.Usagef("%s %s is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example %s", what, v, example)
}

// Desired returns the KubeadmControlPlane as the request would set it, and
// checks it with KCP's own admission rules plus what those rules leave out:
// no downgrade, no minor skip measured from the lowest machine version, and
// surge 0 only with at least 3 replicas. Errors are bad input (exit 2).
func Desired(ctx context.Context, s *Snapshot, r Request) (*controlplanev1.KubeadmControlPlane, error) {
	old := s.CP.KCP
	want := old.DeepCopy()
	if r.Version != "" {
		to, err := ParseVersion("--version", r.Version)
		if err != nil {
			return nil, err
		}
		if cur, err := semver.ParseTolerant(old.Spec.Version); err == nil && to.LT(cur) {
			return nil, exitcode.Usagef("%s is older than the control plane's %s: downgrades are not supported", r.Version, old.Spec.Version)
		}
		if lowest := s.CP.Machines.LowestVersion(); lowest != "" {
			if from, err := semver.ParseTolerant(lowest); err == nil && (to.Major != from.Major || to.Minor > from.Minor+1) {
				return nil, exitcode.Usagef("%s skips a minor version: the oldest machine runs %s; upgrade one minor at a time (--via)", r.Version, lowest)
			}
		}
		want.Spec.Version = r.Version
	}
	if r.Template != "" {
		if s.CP.Cluster.Spec.Topology.IsDefined() {
			return nil, exitcode.Usagef("--infrastructure-template: cluster %s takes its control plane's machine template from its ClusterClass %s; change the class (or rebase the cluster onto another) instead",
				s.CP.Cluster.Name, s.CP.Cluster.Spec.Topology.ClassRef.Name)
		}
		want.Spec.MachineTemplate.Spec.InfrastructureRef.Name = r.Template
	}
	if r.Replicas != nil {
		if *r.Replicas < 1 {
			return nil, exitcode.Usagef("--replicas must be at least 1, not %d", *r.Replicas)
		}
		if etcd.Managed(old) && *r.Replicas%2 == 0 {
			return nil, exitcode.Usagef("--replicas must be odd with stacked etcd (quorum), not %d", *r.Replicas)
		}
		want.Spec.Replicas = r.Replicas
	}
	if r.MaxSurge < 0 {
		r.MaxSurge = KCPMaxSurge(old)
	}
	if r.MaxSurge == 0 && ptr.Deref(want.Spec.Replicas, 1) < 3 {
		return nil, exitcode.Usagef("--max-surge 0 needs at least 3 replicas (this control plane has %d): deleting first would leave too few machines",
			ptr.Deref(want.Spec.Replicas, 1))
	}
	if _, err := (&admission.KubeadmControlPlane{}).ValidateUpdate(ctx, old, want); err != nil {
		return nil, exitcode.Usagef("the KubeadmControlPlane would be invalid: %v", err)
	}
	return want, nil
}

// KCPMaxSurge is the surge KCP itself would use: its rollout strategy's
// maxSurge, 1 when unset.
func KCPMaxSurge(kcp *controlplanev1.KubeadmControlPlane) int32 {
	if ms := kcp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge; ms != nil {
		return int32(ms.IntValue())
	}
	return 1
}

// TargetFor turns a checked request into the loop's target. A negative
// MaxSurge means "as the KubeadmControlPlane says".
func TargetFor(kcp *controlplanev1.KubeadmControlPlane, r Request) Target {
	if r.MaxSurge < 0 {
		r.MaxSurge = KCPMaxSurge(kcp)
	}
	t := Target{Operation: r.Operation, Replicas: ptr.Deref(kcp.Spec.Replicas, 1), MaxSurge: r.MaxSurge, Replace: r.Replace, Version: kcp.Spec.Version,
		CertificatesExpiryDays: r.CertificatesExpiryDays}
	if r.Template != "" {
		t.Template = kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name
	}
	return t
}
