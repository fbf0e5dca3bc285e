package readiness

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// kubeadmCorefile is the Corefile kubeadm deploys (v1.30 and later).
const kubeadmCorefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
`

// TestJudgeCoreDNS: KCP's move of CoreDNS to the KubeadmControlPlane's dns
// imageTag, judged with the real corefile-migration library as KCP calls it.
// What KCP refuses or cannot migrate blocks; what the library reports as
// deprecated, removed or unknown warns; what KCP leaves alone is a pass
// that says why it was not judged.
func TestJudgeCoreDNS(t *testing.T) {
	const image = "registry.k8s.io/coredns/coredns:"
	kcp := func(tag string) *controlplanev1.KubeadmControlPlane {
		k := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp", Namespace: "default"}}
		k.Spec.Version = "v1.35.2"
		k.Spec.KubeadmConfigSpec.ClusterConfiguration = bootstrapv1.ClusterConfiguration{CertificatesDir: "/etc/kubernetes/pki", DNS: bootstrapv1.DNS{ImageTag: tag}}
		return k
	}
	skipped := kcp("v1.12.0")
	skipped.Annotations = map[string]string{controlplanev1.SkipCoreDNSAnnotation: ""}
	unconfigured := kcp("")
	unconfigured.Spec.KubeadmConfigSpec.ClusterConfiguration = bootstrapv1.ClusterConfiguration{}
	running := func(tag, corefile string) workload.CoreDNS {
		return workload.CoreDNS{Corefile: corefile, HasCorefile: true, Image: image + tag}
	}
	// Options CoreDNS 1.6.9 ignores and 1.7.0 removes.
	oldKubernetes := strings.Replace(kubeadmCorefile, "ttl 30", "ttl 30\n       resyncperiod 30s\n       upstream", 1)
	withUnknownPlugin := strings.Replace(kubeadmCorefile, "loadbalance", "loadbalance\n    frobnicate", 1)

	for _, tc := range []struct {
		name       string
		kcp        *controlplanev1.KubeadmControlPlane
		dns        workload.CoreDNS
		result     Result
		found, do  []string
		notInFound []string
	}{
		{name: "KCP annotated to skip CoreDNS", kcp: skipped, dns: running("v1.11.1", kubeadmCorefile),
			result: Pass, found: []string{"annotated " + controlplanev1.SkipCoreDNSAnnotation, "not judged"}},
		{name: "no clusterConfiguration", kcp: unconfigured, dns: running("v1.11.1", kubeadmCorefile),
			result: Pass, found: []string{"no clusterConfiguration", "not judged"}},
		{name: "no CoreDNS ConfigMap", kcp: kcp("v1.12.0"), dns: workload.CoreDNS{Absent: "ConfigMap kube-system/coredns"},
			result: Pass, found: []string{"no ConfigMap kube-system/coredns", "not judged"}},
		{name: "no dns imageTag: the running tag stays", kcp: kcp(""), dns: running("v1.11.1", kubeadmCorefile),
			result: Pass, found: []string{"names no dns.imageTag: KCP keeps CoreDNS at " + image + "v1.11.1", "not judged"}},
		{name: "already at the KCP's tag", kcp: kcp("v1.12.0"), dns: running("v1.12.0", kubeadmCorefile),
			result: Pass, found: []string{"already runs " + image + "v1.12.0", "not judged"}},
		{name: "kubeadm's Corefile migrates", kcp: kcp("v1.12.0"), dns: running("v1.11.1", kubeadmCorefile),
			result: Pass, found: []string{"CoreDNS 1.11.1 → 1.12.0 (" + image + "v1.12.0): the Corefile migrates"}},
		{name: "a ConfigMap without a Corefile fails KCP", kcp: kcp("v1.12.0"), dns: workload.CoreDNS{Image: image + "v1.11.1"},
			result: Warn, found: []string{"no Corefile"}, do: []string{"kubectl annotate kubeadmcontrolplane demo-cp -n default " + controlplanev1.SkipCoreDNSAnnotation}},

		// What KCP's validateCoreDNSImageTag refuses.
		{name: "a downgrade", kcp: kcp("v1.11.1"), dns: running("v1.12.0", kubeadmCorefile),
			result: Block, found: []string{"KCP refuses to move CoreDNS from " + image + "v1.12.0 to " + image + "v1.11.1: a downgrade"},
			do: []string{"kubectl patch kubeadmcontrolplane demo-cp -n default", `"dns":{"imageTag":`}},
		{name: "a running version the migration does not know", kcp: kcp("v1.12.0"), dns: running("v1.11.99", kubeadmCorefile),
			result: Block, found: []string{"the Corefile migration does not know CoreDNS 1.11.99"}},
		{name: "a tag KCP cannot parse", kcp: kcp("latest"), dns: running("v1.11.1", kubeadmCorefile),
			result: Block, found: []string{`dns.imageTag "latest"`}},

		// What the migration library itself refuses.
		{name: "a target newer than the migration library knows", kcp: kcp("v1.99.0"), dns: running("v1.11.1", kubeadmCorefile),
			result: Block, found: []string{"KCP cannot migrate the Corefile: cannot migrate up to '1.99.0' from '1.11.1'"}},
		{name: "a Corefile the migration cannot carry", kcp: kcp("1.4.0"),
			dns:    running("1.3.1", ".:53 example.org:53 {\n    forward example.org 1.2.3.4\n}\n"),
			result: Block, found: []string{"KCP cannot migrate the Corefile: unhandled migration of multi-domain/port server block"},
			do: []string{"Corefile of ConfigMap kube-system/coredns"}},

		// What the library reports.
		{name: "removed and ignored options warn, each said once", kcp: kcp("v1.7.0"), dns: running("v1.6.7", oldKubernetes),
			result: Warn, found: []string{
				`Option "resyncperiod" in plugin "kubernetes" is ignored in 1.6.9.`,
				`Option "upstream" in plugin "kubernetes" is removed in 1.7.0.`},
			do: []string{"deprecated or removed"}},
		{name: "a plugin the migration does not know warns", kcp: kcp("v1.12.0"), dns: running("v1.11.1", withUnknownPlugin),
			result: Warn, found: []string{`Plugin "frobnicate" is unsupported by this migration tool in 1.11.3.`, "unchanged"},
			do: []string{image + "v1.12.0 has it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := judgeCoreDNS(tc.kcp, tc.dns)
			checkFindingSays(t, f, tc.result, tc.found, tc.do, tc.notInFound)
			// The library repeats a notice for every version on the way.
			for _, plugin := range []string{`"frobnicate" is`, `"resyncperiod" in plugin "kubernetes" is ignored`} {
				if n := strings.Count(f.Found, plugin); n > 1 {
					t.Errorf("%s said %d times: %s", plugin, n, f.Found)
				}
			}
		})
	}
}

// TestCoreDNSCheckReads: the live check reads kubeadm's ConfigMap and
// Deployment kube-system/coredns from the workload cluster and judges what
// it read; a KCP that leaves CoreDNS alone needs no read at all.
func TestCoreDNSCheckReads(t *testing.T) {
	configMap := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns"},
		Data: map[string]string{"Corefile": strings.Replace(kubeadmCorefile, "loadbalance", "loadbalance\n    frobnicate", 1)}}
	deployment := func(container string) *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "coredns"},
			Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
				{Name: "sidecar", Image: "example.com/sidecar:v1"},
				{Name: container, Image: "registry.k8s.io/coredns/coredns:v1.11.1"},
			}}}}}
	}
	s := cpSnapshot(nil)
	s.CP.KCP.Spec.KubeadmConfigSpec.ClusterConfiguration = bootstrapv1.ClusterConfiguration{DNS: bootstrapv1.DNS{ImageTag: "v1.12.0"}}
	check := func(kube *fake.Clientset) Finding {
		return coreDNS(t.Context(), &Cluster{Snapshot: s, Workload: &workload.Client{Kube: kube, Name: "default/demo"}})
	}
	checkFindingSays(t, check(fake.NewClientset(configMap, deployment("coredns"))), Warn,
		[]string{"CoreDNS 1.11.1 → 1.12.0", `Plugin "frobnicate"`}, nil, nil)
	checkFindingSays(t, check(fake.NewClientset(configMap)), Pass, []string{"no Deployment kube-system/coredns", "not judged"}, nil, nil)
	checkFindingSays(t, check(fake.NewClientset(configMap, deployment("dns"))), Warn, []string{"no coredns container"}, nil, nil)

	// Skipped: nothing is read, so a cluster that cannot be read passes.
	s.CP.KCP.Annotations = map[string]string{controlplanev1.SkipCoreDNSAnnotation: ""}
	if f := coreDNS(t.Context(), &Cluster{Snapshot: s}); f.Result != Pass {
		t.Errorf("a KCP that skips CoreDNS: %s: %s", f.Result, f.Found)
	}
}
