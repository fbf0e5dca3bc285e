package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/reconcilers/kubeadmcontrolplane"
	kcpsetup "sigs.k8s.io/cluster-api/controlplane/kubeadm/setup"
	"sigs.k8s.io/cluster-api/core/reconcilers/machine"
	coresetup "sigs.k8s.io/cluster-api/core/setup"
	"sigs.k8s.io/cluster-api/util/index"
)

const (
	// remoteConditionsGracePeriod must exceed the ClusterCache's worst case to
	// drop a dead connection (75 s); core/main.go refuses less than 2m.
	remoteConditionsGracePeriod = 5 * time.Minute
	// syncPeriod matches the controllers' default resync.
	syncPeriod = 10 * time.Minute
)

// managerOptions are what both controller binaries pass to ctrl.NewManager,
// minus what a process of its own needs (leader election, metrics, health and
// webhook servers). Controller name validation is off because the two
// managers each register a "clustercache" controller in one process, as two
// separate binaries would.
func (s *Sim) managerOptions(name string, cacheOpts ctrlcache.Options, clientOpts client.Options) ctrl.Options {
	return ctrl.Options{
		Scheme: Scheme(),
		Logger: s.opts.Log.WithName(name),
		Controller: config.Controller{
			SkipNameValidation: ptr.To(true),
			CacheSyncTimeout:   2 * time.Minute,
		},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cacheOpts,
		Client:                 clientOpts,
	}
}

// startControllers starts, each in its own manager as in production, the
// Cluster API core controller (its Machine reconciler), the KCP controller
// unless disabled, and the simulated provider. startCtx bounds waiting for
// their caches; runCtx ends them.
func (s *Sim) startControllers(startCtx, runCtx context.Context) error {
	core, err := s.newCoreManager(runCtx)
	if err != nil {
		return fmt.Errorf("setting up the Machine controller: %w", err)
	}
	managers := []ctrl.Manager{core}
	if !s.opts.WithoutKCP {
		kcp, err := s.newKCPManager(runCtx)
		if err != nil {
			return fmt.Errorf("setting up the KubeadmControlPlane controller: %w", err)
		}
		managers = append(managers, kcp)
	}
	prov, err := s.newProviderManager()
	if err != nil {
		return fmt.Errorf("setting up the simulated provider: %w", err)
	}
	managers = append(managers, prov)

	names := []string{"cluster-api-controller-manager", "kubeadm-control-plane-controller-manager", "simulated-provider"}
	if s.opts.WithoutKCP {
		names = []string{names[0], names[2]}
	}
	for i, m := range managers {
		m := m
		s.goRun(names[i], func() error { return m.Start(runCtx) })
	}
	for i, m := range managers {
		if !m.GetCache().WaitForCacheSync(startCtx) {
			return fmt.Errorf("%s: caches did not sync: %w", names[i], context.Cause(startCtx))
		}
	}
	return nil
}

// watchNamespace is the namespace the controllers watch, as CAPI's
// --namespace flag sets it: the simulator's own on a shared management
// cluster, every namespace ("") on one of its own.
func (s *Sim) watchNamespace() string {
	if s.opts.Management != nil {
		return s.opts.Namespace
	}
	return ""
}

// managerNames hands out manager names. CAPI's setup reserves each manager's
// informer name for the life of the process (client-go never releases it),
// so a second simulator in the same test binary needs names of its own.
var managerNames = struct {
	sync.Mutex
	used map[string]int
}{used: map[string]int{}}

func uniqueManagerName(base string) string {
	managerNames.Lock()
	defer managerNames.Unlock()
	managerNames.used[base]++
	if n := managerNames.used[base]; n > 1 {
		return fmt.Sprintf("%s-%d", base, n)
	}
	return base
}

// newCoreManager wires the Machine reconciler as core/main.go does: the
// ClusterCache with a Secret-caching client and the core setup's cache and
// client options (its Node providerID index is what nodeRef lookup uses),
// and the default indexes.
func (s *Sim) newCoreManager(ctx context.Context) (ctrl.Manager, error) {
	controllerName := uniqueManagerName("cluster-api-controller-manager")
	mgr, err := ctrl.NewManager(s.mgmtConfig, s.managerOptions("machine",
		coresetup.ManagerCacheOptions(Scheme(), controllerName, s.watchNamespace(), syncPeriod),
		coresetup.ManagerClientOptions()))
	if err != nil {
		return nil, err
	}
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return nil, err
	}
	secretCachingClient, err := coresetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, err
	}
	clusterCache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretCachingClient,
		Cache:        coresetup.ClusterCacheCacheOptions(),
		Client:       coresetup.ClusterCacheClientOptions(controllerName, 20, 30),
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return nil, err
	}
	s.shutdownOnStop(clusterCache)
	if err := (&machine.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                clusterCache,
		RemoteConditionsGracePeriod: remoteConditionsGracePeriod,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, err
	}
	return mgr, nil
}

// newKCPManager wires the KubeadmControlPlane reconciler as
// controlplane/kubeadm/main.go does, with the in-place updates gate off (its
// default) so no Runtime SDK client is needed.
func (s *Sim) newKCPManager(ctx context.Context) (ctrl.Manager, error) {
	controllerName := uniqueManagerName("kubeadm-control-plane-manager")
	mgr, err := ctrl.NewManager(s.mgmtConfig, s.managerOptions("kcp",
		kcpsetup.ManagerCacheOptions(Scheme(), controllerName, s.watchNamespace(), syncPeriod),
		kcpsetup.ManagerClientOptions()))
	if err != nil {
		return nil, err
	}
	secretCachingClient, err := kcpsetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, err
	}
	clusterCache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretCachingClient,
		Cache:        kcpsetup.ClusterCacheCacheOptions(),
		Client:       kcpsetup.ClusterCacheClientOptions(controllerName, 20, 30),
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return nil, err
	}
	s.shutdownOnStop(clusterCache)
	if err := (&kubeadmcontrolplane.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		SecretCachingClient:         secretCachingClient,
		ClusterCache:                clusterCache,
		EtcdDialTimeout:             10 * time.Second,
		EtcdCallTimeout:             15 * time.Second,
		EtcdLogger:                  zap.NewNop(),
		RemoteConditionsGracePeriod: remoteConditionsGracePeriod,
	}).SetupWithManager(ctx, mgr, controller.Options{
		MaxConcurrentReconciles: 10,
		ReconciliationTimeout:   3 * time.Minute,
	}); err != nil {
		return nil, err
	}
	return mgr, nil
}

// shutdownOnStop arranges for a ClusterCache's workload-cluster caches to stop
// with the simulator. Their watches outlive the manager (a controller process
// simply exits), and the workload API server would wait a minute for them to
// close before it stops. CAPI's own tests stop them the same way.
func (s *Sim) shutdownOnStop(cc clustercache.ClusterCache) {
	if sd, ok := cc.(interface{ Shutdown() }); ok {
		s.shutdowns = append(s.shutdowns, sd.Shutdown)
	}
}
