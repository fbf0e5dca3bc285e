package readiness

import (
	"context"
	"fmt"
	"slices"
	"strings"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/rollout"
)

// alsoRolls names the machines KCP already finds outdated for another reason
// than the version (cluster-api#13017): a changed KubeadmConfig spec or
// infrastructure template, spec.rollout.after or expiring certificates. The
// upgrade's replacements are made from the KubeadmControlPlane's spec as it
// stands, so that change goes out with the upgrade, whether its author meant
// it to or not.
func alsoRolls(_ context.Context, c *Cluster) Finding {
	s := c.Snapshot
	outdated, results := s.CP.NotUpToDateMachines()
	// The guard's own selection: a deleting machine is already going and
	// never counts as needing a rollout.
	return judgeAlsoRolls(s.CP.KCP.Spec.Version, outdated, rollout.Deleting(s), results, clusterArgsOf(s))
}

// judgeAlsoRolls judges KCP's UpToDate results: each machine of outdated
// that is not deleting, with KCP's reasons (its UpToDate condition's
// messages) but the version's, warns. kcpVersion is the KubeadmControlPlane's
// spec.version the results were judged against.
func judgeAlsoRolls(kcpVersion string, outdated, deleting collections.Machines, results map[string]kcpstate.UpToDateResult, cluster string) Finding {
	var rolls []string
	for _, m := range outdated.Difference(deleting).SortedByCreationTimestamp() {
		result, ok := results[m.Name]
		if !ok {
			// Never from NewControlPlane, which judges every machine; said
			// rather than dropped all the same.
			rolls = append(rolls, m.Name+": outdated, no reason recorded")
			continue
		}
		if reasons := notVersionReasons(m, kcpVersion, result); len(reasons) > 0 {
			rolls = append(rolls, m.Name+": "+strings.Join(reasons, ", "))
		}
	}
	if len(rolls) == 0 {
		return Finding{Result: Pass, Found: "KCP finds no machine outdated for another reason than the version"}
	}
	return Finding{Result: Warn,
		Found: fmt.Sprintf("KCP already finds %d machines outdated for another reason than the version, and the upgrade's replacements take the KubeadmControlPlane's spec as it stands: %s",
			len(rolls), strings.Join(rolls, "; ")),
		Do: fmt.Sprintf("if that change is meant to go out, roll it out first on its own (`kubectl cp-rollout rollout %s`) or let it go with the upgrade; if not, revert it in the KubeadmControlPlane before upgrading", cluster)}
}

// notVersionReasons are KCP's condition messages of a machine's UpToDate result
// but the one for its version. KCP writes that one as "Version %s, %s
// required" (controlplane/kubeadm/pkg/filters.go, matchesMachineSpec; KCP's
// own RolloutOut condition relies on that form), only when the machine's
// version differs from the KubeadmControlPlane's.
func notVersionReasons(m *clusterv1.Machine, kcpVersion string, result kcpstate.UpToDateResult) []string {
	versionReason := fmt.Sprintf("Version %s, %s required", m.Spec.Version, kcpVersion)
	return slices.DeleteFunc(slices.Clone(result.ConditionMessages), func(msg string) bool { return msg == versionReason })
}
