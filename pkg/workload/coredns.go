package workload

import (
	"context"
	"fmt"
	"strings"

	"github.com/blang/semver/v4"
	"github.com/coredns/corefile-migration/migration"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	kcpworkload "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/container"
	"sigs.k8s.io/cluster-api/util/version"
)

// The names KCP's UpdateCoreDNS (controlplane/kubeadm/pkg/
// workload_cluster_coredns.go) looks for: kubeadm's CoreDNS Deployment and
// ConfigMap, the container, the volume that mounts the Corefile and the key
// KCP points it back at once it has migrated the Corefile.
const (
	coreDNS           = "coredns"
	coreDNSVolume     = "config-volume"
	corefileKey       = "Corefile"
	corefileBackupKey = "Corefile-backup"
)

// CoreDNSBehind says how the workload cluster's CoreDNS differs from what KCP
// makes of it once a rollout is done, or "" when it does not. KCP, in the
// reconcile that finds every machine up to date, moves the CoreDNS Deployment
// to the image its spec.kubeadmConfigSpec.clusterConfiguration.dns names (a
// new imageTag comes with a new Kubernetes version), migrating the Corefile
// on the way; the new pods then replace the old. CoreDNS is behind until the
// Deployment runs KCP's image, mounts the migrated Corefile again, and has
// rolled out: every replica updated and available, no old pod left. As in
// KCP, a KCP annotated to skip CoreDNS, one without a ClusterConfiguration
// and a cluster without the ConfigMap, Deployment or container leave nothing
// to wait for; what KCP cannot parse it fails its reconcile on, which the
// KCP's status says (Unsettled).
func (c *Client) CoreDNSBehind(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) (string, error) {
	if _, skip := kcp.Annotations[controlplanev1.SkipCoreDNSAnnotation]; skip || !kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.IsDefined() {
		return "", nil
	}
	cm, err := c.Kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, coreDNS, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("workload cluster %s: reading the CoreDNS ConfigMap: %w", c.Name, err)
	}
	if _, ok := cm.Data[corefileKey]; !ok {
		return "", nil
	}
	d, err := c.Kube.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, coreDNS, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("workload cluster %s: reading the CoreDNS Deployment: %w", c.Name, err)
	}
	for _, ctr := range d.Spec.Template.Spec.Containers {
		if ctr.Name != coreDNS {
			continue
		}
		want, ok := coreDNSImage(ctr.Image, kcp)
		if !ok {
			return "", nil
		}
		if ctr.Image != want {
			if why := coreDNSRefused(ctr.Image, want); why != "" {
				return "", &CoreDNSRefusedError{From: ctr.Image, To: want, Why: why}
			}
			return fmt.Sprintf("CoreDNS runs %s, KCP has not yet moved it to %s", ctr.Image, want), nil
		}
		if readsBackup(d) {
			return "CoreDNS still reads " + corefileBackupKey + ": KCP's migration of the Corefile is under way", nil
		}
		return rollingOut(d, want), nil
	}
	return "", nil
}

// CoreDNSRefusedError is a move of CoreDNS that KCP refuses: its reconcile
// fails on it (before it writes its observedGeneration) until the KCP's dns
// imageTag is changed or the KCP is annotated to skip CoreDNS.
type CoreDNSRefusedError struct {
	From, To, Why string
}

func (e *CoreDNSRefusedError) Error() string {
	return fmt.Sprintf("KCP refuses to move CoreDNS from %s to %s (%s): its reconcile fails on it until spec.kubeadmConfigSpec.clusterConfiguration.dns.imageTag names a version it can migrate to, or the KubeadmControlPlane is annotated %s",
		e.From, e.To, e.Why, controlplanev1.SkipCoreDNSAnnotation)
}

// coreDNSRefused says why KCP refuses to move CoreDNS from image from to
// image to, "" when it does not: KCP's validateCoreDNSImageTag (CAPI v1.14.2,
// controlplane/kubeadm/pkg/workload_cluster_coredns.go; unexported) refuses
// a downgrade and a current version that the Corefile migration library it
// uses does not know, since it could not migrate that Corefile.
func coreDNSRefused(from, to string) string {
	tagOf := func(image string) string {
		if ref, err := container.ImageFromString(image); err == nil {
			return ref.Tag
		}
		return ""
	}
	f, err := version.ParseTolerantImageTag(tagOf(from))
	if err != nil {
		return fmt.Sprintf("cannot parse the current version %q", tagOf(from))
	}
	t, err := version.ParseTolerantImageTag(tagOf(to))
	if err != nil {
		return fmt.Sprintf("cannot parse the target version %q", tagOf(to))
	}
	if version.Compare(f, t, version.WithoutPreReleases()) > 0 {
		return "a downgrade"
	}
	if _, ok := migration.Versions[fmt.Sprintf("%d.%d.%d", f.Major, f.Minor, f.Patch)]; !ok {
		return fmt.Sprintf("the Corefile migration does not know CoreDNS %d.%d.%d", f.Major, f.Minor, f.Patch)
	}
	return ""
}

// coreDNSImage is the image KCP's getCoreDNSInfo moves CoreDNS to from
// current: the repository the KCP's dns (or, before it, its
// imageRepository) names, the tag its dns names, and the upstream image's
// rename from coredns to coredns/coredns at CoreDNS 1.8. Not ok where KCP
// fails to parse them.
func coreDNSImage(current string, kcp *controlplanev1.KubeadmControlPlane) (string, bool) {
	config := kcp.Spec.KubeadmConfigSpec.ClusterConfiguration
	image, err := container.ImageFromString(current)
	if err != nil || image.Tag == "" {
		return "", false
	}
	if _, err := version.ParseTolerantImageTag(image.Tag); err != nil {
		return "", false
	}
	repository := image.Repository
	if r := kcpworkload.ImageRepositoryFromClusterConfig(config); r != "" {
		repository = strings.TrimSuffix(r, "/")
	}
	if config.DNS.ImageRepository != "" {
		repository = strings.TrimSuffix(config.DNS.ImageRepository, "/")
	}
	tag := image.Tag
	if config.DNS.ImageTag != "" {
		tag = config.DNS.ImageTag
	}
	target, err := version.ParseTolerantImageTag(tag)
	if err != nil {
		return "", false
	}
	name := image.Name
	if (repository == "k8s.gcr.io" || repository == "registry.k8s.io") && name == "coredns" &&
		version.Compare(target, semver.MustParse("1.8.0"), version.WithoutPreReleases()) >= 0 {
		name = "coredns/coredns"
	}
	return fmt.Sprintf("%s/%s:%s", repository, name, tag), true
}

// readsBackup: the Corefile volume points at the backup KCP makes while it
// migrates; it points it back as it moves the image.
func readsBackup(d *appsv1.Deployment) bool {
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name != coreDNSVolume || v.ConfigMap == nil || v.ConfigMap.Name != coreDNS {
			continue
		}
		for _, item := range v.ConfigMap.Items {
			if item.Key == corefileBackupKey {
				return true
			}
		}
	}
	return false
}

// rollingOut says what a Deployment's rollout to image still waits for, as
// kubectl rollout status judges it, or "" when it is complete.
func rollingOut(d *appsv1.Deployment, image string) string {
	st, want := d.Status, ptr.Deref(d.Spec.Replicas, 1)
	for _, c := range st.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded" {
			return "CoreDNS Deployment exceeded its progress deadline: " + c.Message
		}
	}
	switch {
	case st.ObservedGeneration < d.Generation:
		return fmt.Sprintf("CoreDNS Deployment: generation %d not yet observed by its controller", d.Generation)
	case st.UpdatedReplicas < want:
		return fmt.Sprintf("CoreDNS rolling out: %d of %d pods at %s", st.UpdatedReplicas, want, image)
	case st.Replicas > st.UpdatedReplicas:
		return fmt.Sprintf("CoreDNS rolling out: %d old pods not yet gone", st.Replicas-st.UpdatedReplicas)
	case st.AvailableReplicas < st.UpdatedReplicas:
		return fmt.Sprintf("CoreDNS rolling out: %d of %d updated pods available", st.AvailableReplicas, st.UpdatedReplicas)
	}
	return ""
}
