package rollout

import (
	"fmt"
	"strings"

	"github.com/blang/semver/v4"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// kubeadm, and KCP's admission webhook, allow one minor version per rollout.
// A control plane two minors behind passes through each minor in between:
// `upgrade --version v1.36.3 --via v1.35.2` is one complete rollout per hop,
// in order, each handed back and agreed by KCP (and on a topology cluster
// followed by the workers, which the topology controller requires before the
// next version) before the next starts. The run's record names the whole
// chain, so a run stopped in any hop resumes where the cluster is.

// Hops is the chain of versions an upgrade from lowest (the oldest machine's
// version) passes through: each of via, then target. Each must be newer than
// the one before it, and each that the machines have not all reached yet at
// most one minor above the last one reached: a hop at or below lowest is one
// a stopped run already completed, and a re-run passes it by. A chain that
// skips a minor names the versions to pass through; errors are bad input
// (exit 2). What the chain alone decides (each hop one minor above the one
// before it) is checked with lowest empty too, before any cluster is read:
// only the first hop's distance from the machines needs the cluster.
func Hops(lowest string, via []string, target string) ([]string, error) {
	chain := append(append([]string{}, via...), target)
	versions := make([]semver.Version, len(chain))
	flags := make([]string, len(chain))
	for i, hop := range chain {
		flags[i] = "--via"
		if i == len(via) {
			flags[i] = "--version"
		}
		v, err := ParseVersion(flags[i], hop)
		if err != nil {
			return nil, err
		}
		versions[i] = v
		if i == 0 {
			continue
		}
		switch prev := versions[i-1]; {
		case !v.GT(prev):
			return nil, exitcode.Usagef("%s %s is not newer than %s: each version passed through must be newer than the one before", flags[i], hop, chain[i-1])
		case v.Major == prev.Major && v.Minor == prev.Minor:
			// Each hop is a rollout of every machine, and kubeadm
			// needs none between two patches of one minor.
			return nil, exitcode.Usagef("%s %s and %s %s are both v%d.%d.x: --via names one version of each minor below --version's, each a rollout of every machine; leave out --via %s",
				flags[i-1], chain[i-1], flags[i], hop, v.Major, v.Minor, chain[i-1])
		case skipsMinor(prev, v):
			return nil, skipError(flags[i], hop, chain[i-1], prev, v)
		}
	}
	prev, err := semver.ParseTolerant(lowest)
	if lowest == "" || err != nil {
		return chain, nil // no machine to measure from: KCP's own checks apply
	}
	from := lowest
	for i, v := range versions {
		if !v.GT(prev) {
			continue // reached already, or the target against the machines: Desired says what is wrong (a downgrade)
		}
		if skipsMinor(prev, v) {
			return nil, skipError(flags[i], chain[i], from, prev, v)
		}
		prev, from = v, chain[i]
	}
	return chain, nil
}

// skipError refuses hop, given with flag, for skipping a minor from the
// version before it.
func skipError(flag, hop, from string, prev, v semver.Version) error {
	what := hop + " skips a minor version"
	if flag == "--via" {
		what = "--via " + what
	}
	return exitcode.Usagef("%s: from %s, pass through %s first (--via, one version of each minor, in order)", what, from, between(prev, v))
}

// skipsMinor is the one-minor rule of kubeadm and of KCP's admission
// webhook: to is more than one minor above from, or of another major.
func skipsMinor(from, to semver.Version) bool {
	return to.Major != from.Major || to.Minor > from.Minor+1
}

// between names the minors strictly between from and to, for a message.
func between(from, to semver.Version) string {
	if to.Major != from.Major {
		return fmt.Sprintf("every minor up to v%d.%d", to.Major, to.Minor)
	}
	var minors []string
	for m := from.Minor + 1; m < to.Minor; m++ {
		minors = append(minors, fmt.Sprintf("a v%d.%d.x", from.Major, m))
	}
	return strings.Join(minors, ", then ")
}

// firstRemainingHop is the index of the first hop the control plane has not
// completed: a hop is complete once the KubeadmControlPlane asks for it or a
// later one and every machine runs it or a later one. A machine still
// deleting counts: its hop ends when it is gone (and the next hop's version
// may be more than a minor above it). len(hops) when all are complete.
func firstRemainingHop(s *Snapshot, hops []string) int {
	for i, hop := range hops {
		if hop == "" || !atLeast(s.CP.KCP.Spec.Version, hop) {
			return i
		}
		for _, m := range s.CP.Machines {
			if !atLeast(m.Spec.Version, hop) {
				return i
			}
		}
	}
	return len(hops)
}

// atLeast reports whether version v is hop or newer.
func atLeast(v, hop string) bool {
	a, errA := semver.ParseTolerant(v)
	b, errB := semver.ParseTolerant(hop)
	return errA == nil && errB == nil && a.GE(b)
}
