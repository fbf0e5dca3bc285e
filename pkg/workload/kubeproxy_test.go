package workload

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
)

// TestKubeProxyBehind: kube-proxy is behind until its image is what KCP makes
// of it (KCP's version as the tag, KCP's image repository when it names one),
// and never when KCP would leave it alone.
func TestKubeProxyBehind(t *testing.T) {
	daemonSet := func(container, image string) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kube-proxy"},
			Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: container, Image: image}},
			}}},
		}
	}
	kcp := func(version, repository string, skip bool) *controlplanev1.KubeadmControlPlane {
		k := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-control-plane", Annotations: map[string]string{}}}
		k.Spec.Version = version
		k.Spec.KubeadmConfigSpec.ClusterConfiguration = bootstrapv1.ClusterConfiguration{ImageRepository: repository, CertificatesDir: "/etc/kubernetes/pki"}
		if skip {
			k.Annotations[controlplanev1.SkipKubeProxyAnnotation] = ""
		}
		return k
	}
	for _, tc := range []struct {
		name   string
		ds     *appsv1.DaemonSet
		kcp    *controlplanev1.KubeadmControlPlane
		behind bool
	}{
		{"at the old version", daemonSet("kube-proxy", "registry.k8s.io/kube-proxy:v1.35.2"), kcp("v1.36.3", "", false), true},
		{"at the version", daemonSet("kube-proxy", "registry.k8s.io/kube-proxy:v1.36.3"), kcp("v1.36.3", "", false), false},
		{"in another repository than KCP names", daemonSet("kube-proxy", "registry.k8s.io/kube-proxy:v1.36.3"), kcp("v1.36.3", "mirror.example.com/k8s", false), true},
		{"in the repository KCP names", daemonSet("kube-proxy", "mirror.example.com/k8s/kube-proxy:v1.36.3"), kcp("v1.36.3", "mirror.example.com/k8s", false), false},
		{"KCP told to skip it", daemonSet("kube-proxy", "registry.k8s.io/kube-proxy:v1.35.2"), kcp("v1.36.3", "", true), false},
		{"no kube-proxy container", daemonSet("proxy", "registry.k8s.io/kube-proxy:v1.35.2"), kcp("v1.36.3", "", false), false},
		{"no DaemonSet", nil, kcp("v1.36.3", "", false), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset()
			if tc.ds != nil {
				kube = fake.NewClientset(tc.ds)
			}
			c := &Client{Kube: kube, Name: "default/demo"}
			behind, err := c.KubeProxyBehind(t.Context(), tc.kcp)
			if err != nil {
				t.Fatal(err)
			}
			if (behind != "") != tc.behind {
				t.Errorf("KubeProxyBehind = %q, want behind %v", behind, tc.behind)
			}
		})
	}
}
