package workload

import (
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
)

// TestCoreDNSBehind: CoreDNS is behind until its Deployment runs what KCP
// makes of it (the KCP's dns imageTag and repository), reads the migrated
// Corefile again, and has rolled out; never when KCP would leave it alone.
func TestCoreDNSBehind(t *testing.T) {
	const old, moved = "registry.k8s.io/coredns/coredns:v1.13.1", "registry.k8s.io/coredns/coredns:v1.14.2"
	deployment := func(image, corefileKey string, rolledOut bool) *appsv1.Deployment {
		d := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "coredns", Generation: 4},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(2)), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "coredns", Image: image}},
				Volumes: []corev1.Volume{{Name: "config-volume", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "coredns"},
					Items:                []corev1.KeyToPath{{Key: corefileKey, Path: "Corefile"}},
				}}}},
			}}},
			// The new pods run; one old pod is still there.
			Status: appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 3, UpdatedReplicas: 2, AvailableReplicas: 3},
		}
		if rolledOut {
			d.Status.Replicas, d.Status.AvailableReplicas = 2, 2
		}
		return d
	}
	corefile := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "coredns"},
		Data: map[string]string{"Corefile": ".:53 {\n}\n"}}
	kcp := func(tag, repository string, skip bool) *controlplanev1.KubeadmControlPlane {
		k := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-control-plane", Annotations: map[string]string{}}}
		k.Spec.Version = "v1.36.3"
		k.Spec.KubeadmConfigSpec.ClusterConfiguration = bootstrapv1.ClusterConfiguration{CertificatesDir: "/etc/kubernetes/pki",
			DNS: bootstrapv1.DNS{ImageTag: tag, ImageRepository: repository}}
		if skip {
			k.Annotations[controlplanev1.SkipCoreDNSAnnotation] = ""
		}
		return k
	}
	for _, tc := range []struct {
		name   string
		objs   []*appsv1.Deployment
		kcp    *controlplanev1.KubeadmControlPlane
		behind string
	}{
		{"at the old tag", []*appsv1.Deployment{deployment(old, "Corefile", true)}, kcp("v1.14.2", "", false), "KCP has not yet moved it to " + moved},
		{"reading the backup Corefile", []*appsv1.Deployment{deployment(moved, "Corefile-backup", true)}, kcp("v1.14.2", "", false), "Corefile-backup"},
		{"an old pod left", []*appsv1.Deployment{deployment(moved, "Corefile", false)}, kcp("v1.14.2", "", false), "1 old pods not yet gone"},
		{"rolled out", []*appsv1.Deployment{deployment(moved, "Corefile", true)}, kcp("v1.14.2", "", false), ""},
		{"no tag in the KCP: the running one stays", []*appsv1.Deployment{deployment(old, "Corefile", true)}, kcp("", "", false), ""},
		{"in another repository than KCP names", []*appsv1.Deployment{deployment(moved, "Corefile", true)}, kcp("v1.14.2", "mirror.example.com/k8s", false),
			"moved it to mirror.example.com/k8s/coredns:v1.14.2"}, // KCP keeps the image name alone
		{"KCP told to skip it", []*appsv1.Deployment{deployment(old, "Corefile", true)}, kcp("v1.14.2", "", true), ""},
		{"no Deployment", nil, kcp("v1.14.2", "", false), ""},
		// KCP's validateCoreDNSImageTag: its reconcile fails on these.
		{"a downgrade KCP refuses", []*appsv1.Deployment{deployment(moved, "Corefile", true)}, kcp("v1.13.1", "", false), "refused: a downgrade"},
		{"a current version the migration does not know", []*appsv1.Deployment{deployment("registry.k8s.io/coredns/coredns:v1.99.0", "Corefile", true)},
			kcp("v1.100.0", "", false), "refused: the Corefile migration does not know CoreDNS 1.99.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kube := fake.NewClientset(corefile)
			for _, d := range tc.objs {
				kube = fake.NewClientset(corefile, d)
			}
			c := &Client{Kube: kube, Name: "default/demo"}
			behind, err := c.CoreDNSBehind(t.Context(), tc.kcp)
			var refused *CoreDNSRefusedError
			if errors.As(err, &refused) {
				behind, err = "refused: "+refused.Why, nil
			}
			if err != nil {
				t.Fatal(err)
			}
			if (tc.behind == "") != (behind == "") || !strings.Contains(behind, tc.behind) {
				t.Errorf("CoreDNSBehind = %q, want %q", behind, tc.behind)
			}
		})
	}
}
