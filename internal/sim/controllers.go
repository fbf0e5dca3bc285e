package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	bootstrapv1beta1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta1"
	controlplanev1beta1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta1"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/bootstrap/kubeadm/reconcilers/kubeadmconfig"
	bootstrapsetup "sigs.k8s.io/cluster-api/bootstrap/kubeadm/setup"
	bootstrapadmission "sigs.k8s.io/cluster-api/bootstrap/kubeadm/webhooks/admission"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/reconcilers/kubeadmcontrolplane"
	kcpsetup "sigs.k8s.io/cluster-api/controlplane/kubeadm/setup"
	kcpadmission "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"
	"sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	"sigs.k8s.io/cluster-api/core/reconcilers/clusterclass"
	"sigs.k8s.io/cluster-api/core/reconcilers/machine"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinehealthcheck"
	"sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	topologycluster "sigs.k8s.io/cluster-api/core/reconcilers/topology/cluster"
	topologymachinedeployment "sigs.k8s.io/cluster-api/core/reconcilers/topology/machinedeployment"
	topologymachineset "sigs.k8s.io/cluster-api/core/reconcilers/topology/machineset"
	coresetup "sigs.k8s.io/cluster-api/core/setup"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	"sigs.k8s.io/cluster-api/feature"
	"sigs.k8s.io/cluster-api/util/index"
)

const (
	// remoteConnectionGracePeriod is core/main.go's default: how long the
	// Cluster's RemoteConnectionProbe stays True after the last good probe.
	remoteConnectionGracePeriod = 50 * time.Second
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

// startCAPI starts, each provider in its own manager as in production,
// Cluster API's core controllers (with every provider's admission webhooks),
// the kubeadm bootstrap controller and, unless disabled, the KCP controller,
// and returns once they serve. On a shared management cluster they are the
// Management's, already running and watching every cluster on it as in
// production. startCtx bounds waiting for them; runCtx ends them.
func (s *Sim) startCAPI(startCtx, runCtx context.Context) error {
	if s.opts.Management != nil {
		return nil
	}
	if s.opts.release != nil {
		return s.startRelease(startCtx, runCtx)
	}
	managers, names, shutdowns, err := capiManagers(runCtx, s.mgmtConfig, &s.mgmtEnv.WebhookInstallOptions, s.opts.Log, !s.opts.WithoutKCP)
	s.shutdowns = append(s.shutdowns, shutdowns...)
	if err != nil {
		return err
	}
	for i, m := range managers {
		s.goRun(names[i], func() error { return m.Start(runCtx) })
	}
	if err := waitForCaches(startCtx, managers, names); err != nil {
		return err
	}
	if err := warmWatchCaches(startCtx, s.mgmtConfig, s.mgmtEnv.CRDs); err != nil {
		return err
	}
	return waitForWebhooks(startCtx, managers[0].GetWebhookServer())
}

// startProvider starts the simulated infrastructure provider, the
// simulator's own on a shared management cluster too.
func (s *Sim) startProvider(startCtx, runCtx context.Context) error {
	prov, err := s.newProviderManager()
	if err != nil {
		return fmt.Errorf("setting up the simulated provider: %w", err)
	}
	const name = "simulated-provider"
	s.goRun(name, func() error { return prov.Start(runCtx) })
	return waitForCaches(startCtx, []ctrl.Manager{prov}, []string{name})
}

// capiManagers sets up Cluster API's core controller manager, serving every
// provider's admission webhooks where hooks says, the kubeadm bootstrap
// controller manager and, with kcp, the KubeadmControlPlane controller
// manager; shutdowns stop their ClusterCaches' connections once the managers
// have stopped.
func capiManagers(ctx context.Context, cfg *rest.Config, hooks *envtest.WebhookInstallOptions, log logr.Logger, kcp bool) (managers []ctrl.Manager, names []string, shutdowns []func(), err error) {
	// ClusterClass users install Cluster API with this gate on
	// (EXP_CLUSTER_TOPOLOGY=true); without it the Cluster webhook refuses
	// every Cluster with a topology.
	if err := feature.MutableGates.SetFromMap(map[string]bool{string(feature.ClusterTopology): true}); err != nil {
		return nil, nil, nil, err
	}
	core, shutdown, err := newCoreManager(ctx, cfg, hooks, log)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("setting up the Cluster API core controllers: %w", err)
	}
	managers, names, shutdowns = append(managers, core), append(names, "cluster-api-controller-manager"), append(shutdowns, shutdown)
	bootstrap, shutdown, err := newBootstrapManager(ctx, cfg, log)
	if err != nil {
		return nil, nil, shutdowns, fmt.Errorf("setting up the kubeadm bootstrap controller: %w", err)
	}
	managers, names, shutdowns = append(managers, bootstrap), append(names, "kubeadm-bootstrap-controller-manager"), append(shutdowns, shutdown)
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

// waitForWebhooks returns once the webhook server answers: until then the
// API server rejects every write that a webhook checks.
func waitForWebhooks(ctx context.Context, server webhook.Server) error {
	started := server.StartedChecker()
	for {
		err := started(nil)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the admission webhook server did not start (%v): %w", err, context.Cause(ctx))
		case <-time.After(20 * time.Millisecond):
		}
	}
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

// newCoreManager wires the ClusterClass and topology, Cluster, Machine,
// MachineSet, MachineDeployment and MachineHealthCheck reconcilers as
// core/main.go does with the ClusterTopology gate on: the ClusterCache with
// a Secret-caching client and the core setup's cache and client options (its
// Node providerID index is what nodeRef lookup uses), and the default
// indexes. Its webhook
// server serves the admission webhooks of all three providers (core, kubeadm
// bootstrap, kubeadm control plane): in production each provider's process
// serves its own, but envtest points every webhook configuration at one
// local server, and what matters is that the same code admits the writes.
func newCoreManager(ctx context.Context, cfg *rest.Config, hooks *envtest.WebhookInstallOptions, log logr.Logger) (ctrl.Manager, func(), error) {
	controllerName := uniqueManagerName("cluster-api-controller-manager")
	scheme := coreScheme()
	opts := managerOptions(log, "core",
		coresetup.ManagerCacheOptions(scheme, controllerName, "", syncPeriod),
		coresetup.ManagerClientOptions())
	opts.Scheme = scheme
	opts.WebhookServer = webhook.NewServer(webhook.Options{
		Host:    hooks.LocalServingHost,
		Port:    hooks.LocalServingPort,
		CertDir: hooks.LocalServingCertDir,
	})
	mgr, err := ctrl.NewManager(cfg, opts)
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
	if err := (&clusterclass.Reconciler{Client: mgr.GetClient()}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, nil, err
	}
	if err := (&topologycluster.Reconciler{
		Client:       mgr.GetClient(),
		APIReader:    mgr.GetAPIReader(),
		ClusterCache: clusterCache,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, nil, err
	}
	if err := (&topologymachinedeployment.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).
		SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, nil, err
	}
	if err := (&topologymachineset.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).
		SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, nil, err
	}
	if err := (&cluster.Reconciler{
		Client:                      mgr.GetClient(),
		APIReader:                   mgr.GetAPIReader(),
		ClusterCache:                clusterCache,
		RemoteConnectionGracePeriod: remoteConnectionGracePeriod,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
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
	if err := (&machineset.Reconciler{
		Client:          mgr.GetClient(),
		APIReader:       mgr.GetAPIReader(),
		ClusterCache:    clusterCache,
		PreflightChecks: sets.New(clusterv1.MachineSetPreflightCheckAll), // core/main.go's default
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, nil, err
	}
	if err := (&machinedeployment.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, nil, err
	}
	if err := (&machinehealthcheck.Reconciler{
		Client:       mgr.GetClient(),
		ClusterCache: clusterCache,
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 10}); err != nil {
		return nil, nil, err
	}
	if err := setupWebhooks(mgr, clusterCache); err != nil {
		return nil, nil, err
	}
	return mgr, shutdownOf(clusterCache), nil
}

// coreScheme is Scheme with the v1beta1 API versions the providers' main.go
// files also register: each webhook registers the v1beta1 to v1beta2
// conversion of its kind, which needs both in the scheme. (No CRD here asks
// for conversion; the API server stores and serves v1beta2.)
func coreScheme() *runtime.Scheme {
	s := Scheme()
	for _, add := range []func(*runtime.Scheme) error{
		clusterv1beta1.AddToScheme,
		bootstrapv1beta1.AddToScheme,
		controlplanev1beta1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

// setupWebhooks registers the admission webhooks that the embedded webhook
// configurations name, as each provider's main.go does.
func setupWebhooks(mgr ctrl.Manager, clusterCache clustercache.ClusterCache) error {
	for _, w := range []interface{ SetupWebhookWithManager(ctrl.Manager) error }{
		&coreadmission.Cluster{Client: mgr.GetClient(), ClusterCacheReader: clusterCache},
		&coreadmission.ClusterClass{Client: mgr.GetClient()},
		&coreadmission.Machine{},
		&coreadmission.MachineSet{},
		&coreadmission.MachineDeployment{},
		&coreadmission.MachineDrainRule{},
		&coreadmission.MachinePool{},
		&coreadmission.MachineHealthCheck{},
		&bootstrapadmission.KubeadmConfig{},
		&bootstrapadmission.KubeadmConfigTemplate{},
		&kcpadmission.KubeadmControlPlane{},
		&kcpadmission.ScaleValidator{Client: mgr.GetClient()},
		&kcpadmission.KubeadmControlPlaneTemplate{},
	} {
		if err := w.SetupWebhookWithManager(mgr); err != nil {
			return fmt.Errorf("%T: %w", w, err)
		}
	}
	return nil
}

// newBootstrapManager wires the KubeadmConfig reconciler as
// bootstrap/kubeadm/main.go does: it writes each machine's bootstrap data
// (kubeadm init or join cloud-config) and, for a join, a bootstrap token in
// the workload cluster.
func newBootstrapManager(ctx context.Context, cfg *rest.Config, log logr.Logger) (ctrl.Manager, func(), error) {
	controllerName := uniqueManagerName("kubeadm-bootstrap-manager")
	mgr, err := ctrl.NewManager(cfg, managerOptions(log, "kubeadm-bootstrap",
		bootstrapsetup.ManagerCacheOptions(Scheme(), controllerName, "", syncPeriod),
		bootstrapsetup.ManagerClientOptions()))
	if err != nil {
		return nil, nil, err
	}
	secretCachingClient, err := bootstrapsetup.CreateSecretCachingClient(mgr)
	if err != nil {
		return nil, nil, err
	}
	clusterCache, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretCachingClient,
		Cache:        bootstrapsetup.ClusterCacheCacheOptions(),
		Client:       bootstrapsetup.ClusterCacheClientOptions(controllerName, 20, 30),
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return nil, nil, err
	}
	if err := (&kubeadmconfig.Reconciler{
		Client:              mgr.GetClient(),
		SecretCachingClient: secretCachingClient,
		APIReader:           mgr.GetAPIReader(),
		ClusterCache:        clusterCache,
		TokenTTL:            kubeadmconfig.DefaultTokenTTL,
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

// warmWatchCaches lists every kind of crds once, so that the API server
// serves each from an initialised watch cache, as it does on a management
// cluster whose controllers have run for a while. A fresh kube-apiserver
// creates a CRD's watch cache at the kind's first request and answers it
// "429 storage is (re)initializing" with a one-second Retry-After: a kind
// no controller has read yet (MachineDrainRules, before any drain) would
// cost the first run on a new simulator a second that no real cluster
// charges. The lists run side by side; client-go retries each through its
// 429s.
func warmWatchCaches(ctx context.Context, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) error {
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var g errgroup.Group
	for _, crd := range crds {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural}
			g.Go(func() error {
				if _, err := meta.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
					return fmt.Errorf("listing %s: %w", gvr, err)
				}
				return nil
			})
		}
	}
	return g.Wait()
}
