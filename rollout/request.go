package rollout

import (
	"context"
	"fmt"
	"strings"

	"github.com/blang/semver/v4"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// Operation names what a request does: the verb that asked for it, in the
// operation record, in messages and in a run's events.
type Operation string

// The operations: one per verb that changes a control plane.
const (
	UpgradeOperation Operation = "upgrade"
	ScaleOperation   Operation = "scale"
	ReplaceOperation Operation = "replace"
	// RolloutOperation rolls out the KubeadmControlPlane's spec as it stands.
	RolloutOperation Operation = "rollout"
	// RestartOperation replaces every machine, changing no spec.
	RestartOperation Operation = "restart"
	// PauseOperation is `pause`'s, whose record only holds KCP back
	// (record.PauseOperation): any verb's run takes it over.
	PauseOperation Operation = record.PauseOperation
)

// Request is what a verb asks for. Empty Version and nil Replicas leave the
// KubeadmControlPlane's own values.
type Request struct {
	Operation Operation
	Version   string
	// Template names the InfraMachineTemplate (of the kind and namespace the
	// KubeadmControlPlane uses today) the machines are rolled to, with the
	// version: a new machine image usually comes with each version.
	Template string
	Replicas *int32
	// MaxSurge is 0 or 1; -1 means the KubeadmControlPlane's own.
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
	case RolloutOperation:
		parts = append(parts, "spec")
	case RestartOperation:
		parts = append(parts, "every machine")
	}
	// In the record, so a resumed run finds the same criterion.
	if r.CertificatesExpiryDays > 0 {
		parts = append(parts, fmt.Sprintf("certificates-expiring-within=%dd", r.CertificatesExpiryDays))
	}
	return strings.Join(parts, ",")
}

// String is the request as its record reads: "upgrade to v1.36.3".
func (r Request) String() string {
	return string(r.Operation) + " to " + r.TargetString()
}

// Matched says, for a control plane with nothing to replace, what it already
// matches.
func (r Request) Matched() string {
	switch r.Operation {
	case RolloutOperation:
		m := "nothing to do: no machine is outdated against the KubeadmControlPlane's spec"
		if r.CertificatesExpiryDays > 0 {
			m += fmt.Sprintf(" or has certificates expiring within %d days", r.CertificatesExpiryDays)
		}
		return m
	case RestartOperation:
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

// Validate checks the request's own rules, those that need no cluster: the
// versions parse and each passed through is newer than the one before
// (Hops), --via and --infrastructure-template go with --version, the replica
// count is at least 1 and the surge 0 or 1 (-1: the KubeadmControlPlane's
// own), and deleting first has the machines it needs. Errors are bad input
// (exit 2). The CLI calls it before it connects, and Prepare again, so that
// every request the engine runs has passed it; what needs the cluster is
// Desired's and Hops'.
func (r Request) Validate() error {
	if r.Version != "" {
		// Hops without machines to measure from checks the chain alone.
		if _, err := Hops("", r.Via, r.Version); err != nil {
			return err
		}
	}
	if len(r.Via) > 0 && r.Version == "" {
		return exitcode.Usagef("--via needs --version: it names the versions an upgrade passes through")
	}
	if r.Replicas != nil && *r.Replicas < 1 {
		return exitcode.Usagef("--replicas must be at least 1, not %d", *r.Replicas)
	}
	if err := r.validateTemplate(); err != nil {
		return err
	}
	if ms := r.MaxSurge; ms < -1 || ms > 1 {
		return exitcode.Usagef("--max-surge must be 0 or 1, not %d", ms)
	}
	// An even count may first meet stacked etcd's odd-replica rule, which
	// needs the cluster (Desired) and speaks first there: only an odd one
	// is judged here.
	if r.Replicas != nil && *r.Replicas%2 == 1 {
		return deleteFirstFits(r.MaxSurge, *r.Replicas, "--replicas is")
	}
	return nil
}

// validateTemplate checks --infrastructure-template against the rest of the
// request: a machine image is built for one Kubernetes version, so it goes
// with --version, and with one hop only.
func (r Request) validateTemplate() error {
	switch {
	case r.Template == "":
		return nil
	case r.Version == "":
		return exitcode.Usagef("--infrastructure-template needs --version: a machine image goes with the Kubernetes version it was built for")
	case len(r.Via) > 0:
		return exitcode.Usagef("--infrastructure-template cannot go with --via: one machine template cannot serve every hop; upgrade one minor at a time, each with its own template")
	}
	if errs := validation.IsDNS1123Subdomain(r.Template); len(errs) > 0 {
		return exitcode.Usagef("--infrastructure-template %q is not an object name: %s", r.Template, strings.Join(errs, "; "))
	}
	return nil
}

// deleteFirstFits is the rule of --max-surge 0: deleting first takes a
// machine away before its replacement joins, which 1 or 2 machines cannot
// spare. whose says where replicas comes from, for the message.
func deleteFirstFits(surge, replicas int32, whose string) error {
	if surge == 0 && replicas < 3 {
		return exitcode.Usagef("--max-surge 0 needs at least 3 replicas (%s %d): deleting first would leave too few machines", whose, replicas)
	}
	return nil
}

// Desired returns the KubeadmControlPlane as the request, valid
// (Validate), would set it, and checks it with KCP's own admission rules
// plus the request's rules that need the cluster and those admission rules
// leave out: no downgrade, no template on a topology cluster, an odd count
// with stacked etcd, and deleting first only with the machines it needs.
// A skipped minor is Hops', measured from the oldest machine. Errors are bad
// input (exit 2).
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
		if etcd.Managed(old) && *r.Replicas%2 == 0 {
			return nil, exitcode.Usagef("--replicas must be odd with stacked etcd (quorum), not %d", *r.Replicas)
		}
		want.Spec.Replicas = r.Replicas
	}
	if err := deleteFirstFits(r.surge(old), ptr.Deref(want.Spec.Replicas, 1), "this control plane has"); err != nil {
		return nil, err
	}
	if _, err := (&admission.KubeadmControlPlane{}).ValidateUpdate(ctx, old, want); err != nil {
		return nil, exitcode.Usagef("the KubeadmControlPlane would be invalid: %v", err)
	}
	return want, nil
}

// surge is the request's MaxSurge, with -1 resolved to the
// KubeadmControlPlane's own.
func (r Request) surge(kcp *controlplanev1.KubeadmControlPlane) int32 {
	if r.MaxSurge < 0 {
		return KCPMaxSurge(kcp)
	}
	return r.MaxSurge
}

// KCPMaxSurge is the surge KCP itself would use: its rollout strategy's
// maxSurge, 1 when unset.
func KCPMaxSurge(kcp *controlplanev1.KubeadmControlPlane) int32 {
	if ms := kcp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge; ms != nil {
		return int32(ms.IntValue())
	}
	return 1
}

// TargetFor turns a checked request into the loop's target on kcp, the
// KubeadmControlPlane as the request sets it.
func TargetFor(kcp *controlplanev1.KubeadmControlPlane, r Request) Target {
	t := Target{Operation: r.Operation, Replicas: ptr.Deref(kcp.Spec.Replicas, 1), MaxSurge: r.surge(kcp), Replace: r.Replace, Version: kcp.Spec.Version,
		CertificatesExpiryDays: r.CertificatesExpiryDays}
	if r.Template != "" {
		t.Template = kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name
	}
	return t
}
