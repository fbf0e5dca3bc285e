package sim

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim/manifests"
)

// Management is a management cluster (a real kube-apiserver and etcd with
// Cluster API's CRDs, core and KubeadmControlPlane controllers) that several
// simulators share, as one management cluster hosts many clusters. Each
// simulator on it has its own simulated provider, workload cluster, etcd
// members and nodes, and its Cluster in a namespace of its own or in one it
// shares with other simulators' Clusters of other names. Sharing saves
// an API server's and the controllers' start-up (most of a simulator's) and
// their idle load per cluster.
//
// The controllers watch every namespace, as in production: Cluster API
// v1.14.2's KubeadmControlPlane controller cannot watch one namespace alone
// (--namespace), its consistency check fails to cast the namespaced Machine
// informer ("failed to cast Machine informer to SharedIndexInformer").
type Management struct {
	env            *envtest.Environment
	config         *rest.Config
	binDir         string
	threadsRelease chan struct{}

	cancel    context.CancelFunc
	wg        sync.WaitGroup
	shutdowns []func()
}

// StartManagement starts a management cluster for simulators to share; stop
// it with Stop once they have all stopped. assetsDir holds kube-apiserver and
// etcd; empty means AssetsDir().
func StartManagement(ctx context.Context, assetsDir string, log logr.Logger) (_ *Management, err error) {
	if assetsDir == "" {
		if assetsDir, err = AssetsDir(); err != nil {
			return nil, err
		}
	}
	m := &Management{threadsRelease: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = m.Stop()
		}
	}()
	if m.binDir, err = os.MkdirTemp("", "cp-rollout-sim-bin-"); err != nil {
		return nil, err
	}
	apiServerBin, etcdBin, err := lifetimeBinaries(assetsDir, m.binDir)
	if err != nil {
		return nil, err
	}
	if m.env, err = managementEnvironment(apiServerBin, etcdBin, assetsDir, nil); err != nil {
		return nil, err
	}
	var startErr error
	onOwnThread(m.threadsRelease, func() { m.config, startErr = m.env.Start() })
	if startErr != nil {
		m.env = nil
		return nil, fmt.Errorf("starting the management cluster: %w", startErr)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	managers, names, shutdowns, err := capiManagers(runCtx, m.config, &m.env.WebhookInstallOptions, log, true)
	m.shutdowns = shutdowns
	if err != nil {
		return nil, err
	}
	for i, mgr := range managers {
		m.wg.Go(func() {
			if err := mgr.Start(runCtx); err != nil {
				log.Error(err, "controller manager stopped", "manager", names[i])
			}
		})
	}
	if err := waitForCaches(ctx, managers, names); err != nil {
		return nil, err
	}
	if err := warmWatchCaches(ctx, m.config, m.env.CRDs); err != nil {
		return nil, err
	}
	if err := waitForWebhooks(ctx, managers[0].GetWebhookServer()); err != nil {
		return nil, err
	}
	return m, nil
}

// Stop stops the management cluster. It is safe to call more than once.
func (m *Management) Stop() error {
	if m.cancel != nil {
		m.cancel()
		m.wg.Wait()
		m.cancel = nil
	}
	for _, shutdown := range m.shutdowns {
		shutdown()
	}
	m.shutdowns = nil
	var err error
	if m.env != nil {
		err = m.env.Stop()
		m.env = nil
	}
	if m.threadsRelease != nil {
		close(m.threadsRelease)
		m.threadsRelease = nil
	}
	if m.binDir != "" {
		_ = os.RemoveAll(m.binDir)
		m.binDir = ""
	}
	return err
}

// managementEnvironment describes a management cluster: its API server, its
// etcd, Cluster API's CRDs with the generic infrastructure provider's, and
// Cluster API's admission webhook configurations, which envtest points at a
// local server with a certificate of its own (the core manager serves it).
func managementEnvironment(apiServerBin, etcdBin, assetsDir string, release *Release) (*envtest.Environment, error) {
	var crdList []*apiextensionsv1.CustomResourceDefinition
	var mutating []*admissionv1.MutatingWebhookConfiguration
	var validating []*admissionv1.ValidatingWebhookConfiguration
	var err error
	if release != nil {
		// The release's webhook configurations are installed once its
		// managers have ports (startRelease); envtest only issues the
		// serving certificate they share.
		if crdList, err = release.CRDs(); err != nil {
			return nil, err
		}
		crdList = append(crdList, manifests.InfrastructureCRDs()...)
	} else {
		if crdList, err = manifests.ManagementCRDs(); err != nil {
			return nil, err
		}
		if mutating, validating, err = manifests.Webhooks(); err != nil {
			return nil, err
		}
	}
	return &envtest.Environment{
		ControlPlane:          envtest.ControlPlane{APIServer: &envtest.APIServer{Path: apiServerBin}, Etcd: &envtest.Etcd{Path: etcdBin}},
		BinaryAssetsDirectory: assetsDir,
		Scheme:                Scheme(),
		CRDs:                  crdList,
		ErrorIfCRDPathMissing: true,
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			MutatingWebhooks:   mutating,
			ValidatingWebhooks: validating,
		},
		// A loaded two-core machine can take longer than envtest's 20 s
		// default to start or stop a kube-apiserver.
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}, nil
}

// forgetCluster deletes the simulator's Cluster from the shared management
// cluster, so that the shared ClusterCaches disconnect from its workload
// cluster. The Cluster is paused first and its finalizer removed: the
// simulator is going away with its machines, and the Cluster controller would
// otherwise delete the control plane and wait for every machine to go.
func (s *Sim) forgetCluster() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cluster := &clusterv1.Cluster{}
	if err := s.mgmt.Get(ctx, s.ClusterKey(), cluster); err != nil {
		return
	}
	paused := client.MergeFrom(cluster.DeepCopy())
	cluster.Spec.Paused = ptr.To(true)
	if err := s.mgmt.Patch(ctx, cluster, paused); err != nil {
		return
	}
	if err := s.mgmt.Delete(ctx, cluster); err != nil {
		return
	}
	unblocked := client.MergeFrom(cluster.DeepCopy())
	cluster.Finalizers = nil
	if err := s.mgmt.Patch(ctx, cluster, unblocked); err != nil && !apierrors.IsNotFound(err) {
		return
	}
	for ctx.Err() == nil {
		if err := s.mgmt.Get(ctx, s.ClusterKey(), cluster); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
