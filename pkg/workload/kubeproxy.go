package workload

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	kcpworkload "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/container"
)

// kubeProxy is the DaemonSet and container kubeadm names kube-proxy.
const kubeProxy = "kube-proxy"

// KubeProxyBehind says how the workload cluster's kube-proxy differs from what
// KCP makes of it once a rollout is done, or "" when it does not: KCP, on its
// first reconcile that finds every machine up to date, retags the kube-proxy
// DaemonSet to its version (and its image repository, when the KCP names
// one). As in KCP, a KCP annotated to skip kube-proxy, a cluster without the
// DaemonSet and a DaemonSet without a kube-proxy container leave nothing to
// wait for. The expected image is computed with the image helpers KCP uses.
func (c *Client) KubeProxyBehind(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane) (string, error) {
	if _, skip := kcp.Annotations[controlplanev1.SkipKubeProxyAnnotation]; skip {
		return "", nil
	}
	ds, err := c.Kube.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(ctx, kubeProxy, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("workload cluster %s: reading the kube-proxy DaemonSet: %w", c.Name, err)
	}
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		if ctr.Name != kubeProxy {
			continue
		}
		want, err := container.ModifyImageTag(ctr.Image, kcp.Spec.Version)
		if err != nil {
			return "", fmt.Errorf("workload cluster %s: kube-proxy image %q: %w", c.Name, ctr.Image, err)
		}
		if repo := kcpworkload.ImageRepositoryFromClusterConfig(kcp.Spec.KubeadmConfigSpec.ClusterConfiguration); repo != "" {
			if want, err = container.ModifyImageRepository(want, repo); err != nil {
				return "", fmt.Errorf("workload cluster %s: kube-proxy image %q: %w", c.Name, ctr.Image, err)
			}
		}
		if ctr.Image != want {
			return fmt.Sprintf("kube-proxy runs %s, KCP has not yet moved it to %s", ctr.Image, want), nil
		}
		return "", nil
	}
	return "", nil
}
