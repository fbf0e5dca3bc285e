package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"
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
func managerOptions(log logr.Logger, name string, cacheOpts ctrlcache.Options, clientOpts client.Options) ctrl.Options {
	return ctrl.Options{
		Scheme: Scheme(),
		Logger: log.WithName(name),
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
// unless disabled, and the simulated provider. On a shared management
// cluster the core and KCP controllers are the Management's, watching every
// cluster on it as in production; only the provider is the simulator's own.
// startCtx bounds waiting for their caches; runCtx ends them.
func (s *Sim) startControllers(startCtx, runCtx context.Context) error {
	var managers []ctrl.Manager
	var names []string
	if s.opts.Management == nil {
		capi, capiNames, shutdowns, err := capiManagers(runCtx, s.mgmtConfig, s.opts.Log, !s.opts.WithoutKCP)
		s.shutdowns = append(s.shutdowns, shutdowns...)
		if err != nil {
			return err
		}
		managers, names = capi, capiNames
	}
	prov, err := s.newProviderManager()
	if err != nil {
		return fmt.Errorf("setting up the simulated provider: %w", err)
	}
	managers = append(managers, prov)
	names = append(names, "simulated-provider")
	for i, m := range managers {
		s.goRun(names[i], func() error { return m.Start(runCtx) })
	}
	return waitForCaches(startCtx, managers, names)
}

// capiManagers sets up Cluster API's core controller manager and, with kcp,
// the KubeadmControlPlane controller manager; shutdowns stop their
// ClusterCaches' connections once the managers have stopped.
func capiManagers(ctx context.Context, cfg *rest.Config, log logr.Logger, kcp bool) (managers []ctrl.Manager, names []string, shutdowns []func(), err error) {
	core, shutdown, err := newCoreManager(ctx, cfg, log)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("setting up the Machine controller: %w", err)
	}
	managers, names, shutdowns = append(managers, core), append(names, "cluster-api-controller-manager"), append(shutdowns, shutdown)
	if kcp {
		m, shutdown, err := newKCPManager(ctx, cfg, log)
		if err != nil {
			return nil, nil, shutdowns, fmt.Errorf("setting up the KubeadmControlPlane controller: %w", err)
		}
		managers, names, shutdowns = append(managers, m), append(names, "kubeadm-control-plane-controller-manager"), append(shutdowns, shutdown)
	}
	return managers, names, shutdowns, nil
}

func waitForCaches(ctx context.Context, managers []ctrl.Manager, names []string) error {
	for i, m := range managers {
		if !m.GetCache().WaitForCacheSync(ctx) {
			return fmt.Errorf("%s: caches did not sync: %w", names[i], context.Cause(ctx))
		}
	}
	return nil
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
func newCoreManager(ctx context.Context, cfg *rest.Config, log logr.Logger) (ctrl.Manager, func(), error) {
	controllerName := uniqueManagerName("cluster-api-controller-manager")
	mgr, err := ctrl.NewManager(cfg, managerOptions(log, "machine",
		coresetup.ManagerCacheOptions(Scheme(), controllerName, "", syncPeriod),
		coresetup.ManagerClientOptions()))
	if err != nil {
		return nil, nil, err
	}
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return nil, nil, err
	}
	secretCachingClient, err := coresetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, nil, err
	}
	clusterCache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretCachingClient,
		Cache:        coresetup.ClusterCacheCacheOptions(),
		Client:       coresetup.ClusterCacheClientOptions(controllerName, 20, 30),
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return nil, nil, err
	}
	if err := (&machine.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                clusterCache,
		RemoteConditionsGracePeriod: remoteConditionsGracePeriod,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, nil, err
	}
	return mgr, shutdownOf(clusterCache), nil
}

// newKCPManager wires the KubeadmControlPlane reconciler as
// controlplane/kubeadm/main.go does, with the in-place updates gate off (its
// default) so no Runtime SDK client is needed.
func newKCPManager(ctx context.Context, cfg *rest.Config, log logr.Logger) (ctrl.Manager, func(), error) {
	controllerName := uniqueManagerName("kubeadm-control-plane-manager")
	mgr, err := ctrl.NewManager(cfg, managerOptions(log, "kcp",
		kcpsetup.ManagerCacheOptions(Scheme(), controllerName, "", syncPeriod),
		kcpsetup.ManagerClientOptions()))
	if err != nil {
		return nil, nil, err
	}
	secretCachingClient, err := kcpsetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, nil, err
	}
	clusterCache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretCachingClient,
		Cache:        kcpsetup.ClusterCacheCacheOptions(),
		Client:       kcpsetup.ClusterCacheClientOptions(controllerName, 20, 30),
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return nil, nil, err
	}
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
		return nil, nil, err
	}
	return mgr, shutdownOf(clusterCache), nil
}

// shutdownOf is what stops a ClusterCache's workload-cluster caches. Their
// watches outlive the manager (a controller process simply exits), and the
// workload API server would wait a minute for them to close before it stops.
// CAPI's own tests stop them the same way.
func shutdownOf(cc clustercache.ClusterCache) func() {
	if sd, ok := cc.(interface{ Shutdown() }); ok {
		return sd.Shutdown
	}
	return func() {}
}
