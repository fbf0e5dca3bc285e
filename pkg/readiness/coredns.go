package readiness

import (
	"context"
	"fmt"
	"strings"

	"github.com/coredns/corefile-migration/migration"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	"sigs.k8s.io/cluster-api/util/container"
	"sigs.k8s.io/cluster-api/util/version"

	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// coreDNS judges what KCP does to CoreDNS once the rollout is handed back:
// in the reconcile that finds every machine up to date, KCP's UpdateCoreDNS
// (CAPI v1.14.2, controlplane/kubeadm/pkg/workload_cluster_coredns.go) moves
// the CoreDNS Deployment to the image its spec.kubeadmConfigSpec.
// clusterConfiguration.dns names — the running tag when it names none, so
// CoreDNS moves only when dns.imageTag (or a repository) says so, never with
// spec.version — and migrates the Corefile with the corefile-migration
// library on the way. A move KCP refuses, or a Corefile it cannot migrate,
// fails every later reconcile of KCP's: CoreDNS stays behind, and KCP writes
// no status.
func coreDNS(ctx context.Context, c *Cluster) Finding {
	kcp := c.Snapshot.CP.KCP
	if why := coreDNSLeftAlone(kcp); why != "" {
		return Finding{Result: Pass, Found: why}
	}
	dns, err := c.Workload.ReadCoreDNS(ctx)
	if err != nil {
		return notChecked("CoreDNS", err)
	}
	return judgeCoreDNS(kcp, dns)
}

// coreDNSLeftAlone says why KCP does not touch CoreDNS whatever the workload
// cluster holds, "" when it may: UpdateCoreDNS returns first for these.
func coreDNSLeftAlone(kcp *controlplanev1.KubeadmControlPlane) string {
	if _, skip := kcp.Annotations[controlplanev1.SkipCoreDNSAnnotation]; skip {
		return fmt.Sprintf("KubeadmControlPlane %s is annotated %s: KCP leaves CoreDNS alone, not judged", kcp.Name, controlplanev1.SkipCoreDNSAnnotation)
	}
	if !kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.IsDefined() {
		return fmt.Sprintf("KubeadmControlPlane %s has no clusterConfiguration: KCP leaves CoreDNS alone, not judged", kcp.Name)
	}
	return ""
}

// judgeCoreDNS judges KCP's move of the workload cluster's CoreDNS dns, as
// UpdateCoreDNS would make it: a move KCP refuses or a Corefile the
// migration cannot carry blocks; what the migration library reports as
// deprecated, removed or ignored, or does not know, warns.
func judgeCoreDNS(kcp *controlplanev1.KubeadmControlPlane, dns workload.CoreDNS) Finding {
	if why := coreDNSLeftAlone(kcp); why != "" {
		return Finding{Result: Pass, Found: why}
	}
	skip := fmt.Sprintf("annotate the KubeadmControlPlane to leave CoreDNS alone and move it yourself: `kubectl annotate kubeadmcontrolplane %s -n %s %s=\"\"`",
		kcp.Name, kcp.Namespace, controlplanev1.SkipCoreDNSAnnotation)
	patchTag := fmt.Sprintf("set a tag KCP can move CoreDNS to: `kubectl patch kubeadmcontrolplane %s -n %s --type merge -p '{\"spec\":{\"kubeadmConfigSpec\":{\"clusterConfiguration\":{\"dns\":{\"imageTag\":\"vX.Y.Z\"}}}}}'`; or %s",
		kcp.Name, kcp.Namespace, skip)
	switch {
	case dns.Absent != "":
		return Finding{Result: Pass, Found: fmt.Sprintf("no %s on the workload cluster: KCP leaves CoreDNS alone, not judged", dns.Absent)}
	case !dns.HasCorefile:
		return Finding{Result: Warn, Found: "ConfigMap kube-system/coredns has no Corefile: KCP's reconcile fails on it, whatever the tag",
			Do: "restore the Corefile key of ConfigMap kube-system/coredns on the workload cluster, or " + skip}
	case dns.Image == "":
		return Finding{Result: Warn, Found: "Deployment kube-system/coredns has no coredns container: KCP's reconcile fails on it, whatever the tag",
			Do: "restore the coredns container of Deployment kube-system/coredns on the workload cluster, or " + skip}
	}
	to, ok := workload.CoreDNSTarget(dns.Image, kcp)
	if !ok {
		return Finding{Result: Block, Found: fmt.Sprintf("KCP cannot read a CoreDNS version from the running image %s or the KubeadmControlPlane's dns.imageTag %q: its reconcile fails on it",
			dns.Image, kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.DNS.ImageTag), Do: patchTag}
	}
	if to == dns.Image {
		if kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.DNS.ImageTag == "" {
			return Finding{Result: Pass, Found: fmt.Sprintf("the KubeadmControlPlane names no dns.imageTag: KCP keeps CoreDNS at %s, not judged", dns.Image)}
		}
		return Finding{Result: Pass, Found: fmt.Sprintf("CoreDNS already runs %s, the KubeadmControlPlane's dns: KCP does not move it, not judged", dns.Image)}
	}
	if why := workload.CoreDNSRefusal(dns.Image, to); why != "" {
		return Finding{Result: Block, Found: fmt.Sprintf("KCP refuses to move CoreDNS from %s to %s: %s", dns.Image, to, why), Do: patchTag}
	}
	// KCP migrates between the major.minor.patch of the two tags, a "v"
	// and any suffix dropped (getCoreDNSInfo's MajorMinorPatch); both
	// parse, or CoreDNSTarget would not be ok.
	from, target := coreDNSVersion(dns.Image), coreDNSVersion(to)
	move := fmt.Sprintf("CoreDNS %s → %s (%s)", from, target, to)
	// As KCP calls it: deprecated plugins and options are kept while they
	// still work, removed and ignored ones migrated away.
	if _, err := migration.Migrate(from, target, dns.Corefile, false); err != nil {
		return Finding{Result: Block, Found: fmt.Sprintf("%s: KCP cannot migrate the Corefile: %v", move, err),
			Do: "make the Corefile of ConfigMap kube-system/coredns one the migration carries, or " + patchTag}
	}
	notices, err := migration.Deprecated(from, target, dns.Corefile)
	if err != nil {
		return notChecked("the Corefile's deprecations", err)
	}
	unknown, err := migration.Unsupported(from, target, dns.Corefile)
	if err != nil {
		return notChecked("the Corefile's plugins", err)
	}
	var changed, added []string
	for _, n := range coreDNSFirstNotices(notices) {
		if n.Severity == migration.SevNewDefault {
			added = append(added, n.ToString())
		} else {
			changed = append(changed, n.ToString())
		}
	}
	var warnings, do []string
	if len(changed) > 0 {
		warnings = append(warnings, strings.Join(changed, " "))
		do = append(do, "update the Corefile of ConfigMap kube-system/coredns on the workload cluster for what is deprecated or removed (KCP keeps deprecated plugins and options as they are, and rewrites or drops removed and ignored ones)")
	}
	if unknown = coreDNSFirstNotices(unknown); len(unknown) > 0 {
		var names []string
		for _, n := range unknown {
			names = append(names, n.ToString())
		}
		warnings = append(warnings, strings.Join(names, " ")+" KCP passes what the migration does not know to the new CoreDNS unchanged.")
		do = append(do, fmt.Sprintf("make sure %s has it (a custom build), or take it out of the Corefile", to))
	}
	if len(warnings) > 0 {
		return Finding{Result: Warn, Found: move + ": " + strings.Join(warnings, " "), Do: strings.Join(do, "; ")}
	}
	found := move + ": the Corefile migrates"
	if len(added) > 0 {
		found += "; " + strings.Join(added, " ")
	}
	return Finding{Result: Pass, Found: found}
}

// coreDNSVersion is the major.minor.patch of image's tag, as KCP hands it to
// the migration; "" when it has none.
func coreDNSVersion(image string) string {
	ref, err := container.ImageFromString(image)
	if err != nil {
		return ""
	}
	v, err := version.ParseTolerantImageTag(ref.Tag)
	if err != nil {
		return ""
	}
	return version.MajorMinorPatch(v).String()
}

// coreDNSFirstNotices keeps the first of the library's notices for each
// plugin, option and severity: it repeats one for every version on the way.
func coreDNSFirstNotices(notices []migration.Notice) []migration.Notice {
	type key struct{ plugin, option, severity string }
	seen := map[key]bool{}
	var first []migration.Notice
	for _, n := range notices {
		k := key{n.Plugin, n.Option, n.Severity}
		if !seen[k] {
			seen[k] = true
			first = append(first, n)
		}
	}
	return first
}
