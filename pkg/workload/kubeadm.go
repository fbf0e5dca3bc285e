package workload

import (
	"context"
	"fmt"

	"github.com/blang/semver/v4"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	kcpworkload "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
)

// PrepareRollout does to the workload cluster what KCP's updateControlPlane
// does before it replaces outdated machines, with KCP's own code: make sure
// kubeadm's RBAC for the target version exists, and write the target version
// and the KubeadmControlPlane's cluster configuration into
// kube-system/kubeadm-config. `kubeadm join --control-plane` reads that
// ConfigMap, so without this a replacement would come up with the old images.
// It is idempotent and safe to repeat on every run.
func (c *Client) PrepareRollout(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, etcdManaged bool) error {
	version, err := semver.ParseTolerant(kcp.Spec.Version)
	if err != nil {
		return fmt.Errorf("KubeadmControlPlane %s: version %q: %w", kcp.Name, kcp.Spec.Version, err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	kube, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	w := &kcpworkload.Workload{Client: kube}
	if err := w.EnsureKubeadmPermissions(ctx, version); err != nil {
		return fmt.Errorf("workload cluster %s: kubeadm RBAC for %s: %w", c.Name, kcp.Spec.Version, err)
	}

	// The same mutators, in the same order, as KCP's update.go.
	var mutators []func(*bootstrapv1.ClusterConfiguration)
	if cc := kcp.Spec.KubeadmConfigSpec.ClusterConfiguration; cc.IsDefined() {
		mutators = append(mutators,
			w.UpdateImageRepositoryInKubeadmConfigMap(kcpworkload.ImageRepositoryFromClusterConfig(cc)),
			w.UpdateFeatureGatesInKubeadmConfigMap(kcp.Spec.KubeadmConfigSpec, version),
			w.UpdateAPIServerInKubeadmConfigMap(cc.APIServer),
			w.UpdateControllerManagerInKubeadmConfigMap(cc.ControllerManager),
			w.UpdateSchedulerInKubeadmConfigMap(cc.Scheduler),
			w.UpdateCertificateValidityPeriodDays(cc.CertificateValidityPeriodDays),
			w.UpdateEncryptionAlgorithm(cc.EncryptionAlgorithm))
		if etcdManaged {
			mutators = append(mutators, w.UpdateEtcdLocalInKubeadmConfigMap(cc.Etcd.Local))
		} else {
			mutators = append(mutators, w.UpdateEtcdExternalInKubeadmConfigMap(cc.Etcd.External))
		}
	}
	if err := w.UpdateClusterConfiguration(ctx, version, mutators...); err != nil {
		return fmt.Errorf("workload cluster %s: updating kube-system/kubeadm-config: %w", c.Name, err)
	}
	return nil
}
