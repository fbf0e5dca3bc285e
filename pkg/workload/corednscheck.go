package workload

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
)

// CoreDNS is the workload cluster's CoreDNS as KCP's UpdateCoreDNS reads it
// (CAPI v1.14.2, controlplane/kubeadm/pkg/workload_cluster_coredns.go,
// getCoreDNSInfo): kubeadm's ConfigMap and Deployment kube-system/coredns.
// The readiness check judges it against what KCP will make of it.
type CoreDNS struct {
	// Absent names what of kubeadm's CoreDNS is not there, "" when both
	// are: KCP takes a not-found read as a cluster without kubeadm's
	// CoreDNS and leaves it alone.
	Absent string
	// Corefile is the ConfigMap's Corefile. HasCorefile is false when the
	// ConfigMap lacks the key, which KCP's reconcile fails on, not found
	// or not.
	Corefile    string
	HasCorefile bool
	// Image is the coredns container's image; "" when the Deployment has
	// no such container, which KCP's reconcile fails on too.
	Image string
}

// ReadCoreDNS reads the workload cluster's CoreDNS ConfigMap and Deployment.
// A read that fails for another reason than not found is an error.
func (c *Client) ReadCoreDNS(ctx context.Context) (CoreDNS, error) {
	var dns CoreDNS
	cm, err := c.Kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, coreDNS, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		dns.Absent = "ConfigMap kube-system/" + coreDNS
		return dns, nil
	case err != nil:
		return dns, fmt.Errorf("workload cluster %s: reading the CoreDNS ConfigMap: %w", c.Name, err)
	}
	dns.Corefile, dns.HasCorefile = cm.Data[corefileKey]
	d, err := c.Kube.AppsV1().Deployments(metav1.NamespaceSystem).Get(ctx, coreDNS, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		dns.Absent = "Deployment kube-system/" + coreDNS
		return dns, nil
	case err != nil:
		return dns, fmt.Errorf("workload cluster %s: reading the CoreDNS Deployment: %w", c.Name, err)
	}
	for _, ctr := range d.Spec.Template.Spec.Containers {
		if ctr.Name == coreDNS {
			dns.Image = ctr.Image
			break
		}
	}
	return dns, nil
}

// CoreDNSTarget is the image KCP moves CoreDNS to from the image current
// runs, by the KubeadmControlPlane's dns imageRepository and imageTag (the
// running tag when it names none) — the rule CoreDNSBehind waits for. Not ok
// when KCP cannot parse the current image's tag or the KCP's: its reconcile
// fails on them.
func CoreDNSTarget(current string, kcp *controlplanev1.KubeadmControlPlane) (string, bool) {
	return coreDNSImage(current, kcp)
}

// CoreDNSRefusal says why KCP refuses to move CoreDNS from image from to
// image to (its unexported validateCoreDNSImageTag: a downgrade, a current
// version the migration library does not know, a tag it cannot parse), ""
// when it does not.
func CoreDNSRefusal(from, to string) string {
	return coreDNSRefused(from, to)
}
