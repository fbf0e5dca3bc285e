package sim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
)

// Options configure a simulator. The zero value of every field means its default.
type Options struct {
	// ClusterName is the Cluster's name; the KCP is <ClusterName>-control-plane. Default "demo".
	ClusterName string
	// Namespace holds the Cluster and its objects; created when missing. Default "default".
	Namespace string
	// Labels are put on the Cluster, as a fleet's clusters carry labels
	// (env=prod, region=...) that select them. None by default.
	Labels map[string]string
	// Replicas is the number of control-plane machines. Default 3.
	Replicas int32
	// Version is the Kubernetes version of the KCP and its machines. Default "v1.35.2".
	Version string
	// Image is the machine image of the initial infrastructure machine
	// templates (spec.template.spec.image of a
	// GenericInfrastructureMachineTemplate; see InfraMachineImage), which a
	// machine's Node reports as status.nodeInfo.osImage. Default
	// "sim-image-<Version>".
	Image string

	// ProvisionDelay is how long the simulated infrastructure takes from an
	// InfraMachine getting a capacity slot to it being provisioned.
	ProvisionDelay time.Duration
	// DeleteDelay is how long a deleted InfraMachine takes to go away.
	DeleteDelay time.Duration
	// Capacity limits how many machines exist at once (the bare-metal case:
	// a surge machine waits for a host). 0 means unlimited.
	Capacity int

	// FailureDomains is how many control-plane failure domains (fd-1 ...
	// fd-N) the infrastructure cluster reports, as real providers report
	// zones; the initial machines are spread across them. 0 means none.
	FailureDomains int

	// WithoutKCP leaves the KubeadmControlPlane controller out: nothing serves
	// the kcp-cleanup pre-terminate hook or reconciles the KCP.
	WithoutKCP bool

	// Topology makes the Cluster a topology cluster: a ClusterClass
	// (<cluster>-class) with its templates, and the version, replicas and
	// workers in Cluster.spec.topology; the real topology controller creates
	// and owns the KCP and the workers' MachineDeployment.
	Topology bool

	// ClassVersions, on a topology cluster, are the Kubernetes versions the
	// ClusterClass declares (spec.kubernetesVersions): Cluster API's chained
	// upgrades then plan an upgrade across several minors through them, and
	// the Cluster's version must be one of them. Empty declares none.
	ClassVersions []string

	// Workers is how many worker machines a MachineDeployment
	// (<cluster>-md-0) keeps: nodes without etcd or static pods, that the
	// real MachineDeployment and MachineSet controllers create and roll.
	// 0 means none.
	Workers int32

	// WithoutMachineHealthCheck leaves out the MachineHealthCheck that
	// Cluster API's documentation recommends for a KCP control plane (a
	// machine whose node is not Ready for 5 minutes is remediated by KCP).
	WithoutMachineHealthCheck bool

	// AddressPrefix is the first three octets of the nodes' loopback
	// addresses (<prefix>.2, <prefix>.3, ...). Default "127.0.0". Simulators
	// running at the same time need different prefixes: members use the
	// kubeadm ports.
	AddressPrefix string

	// AuditLog, when set, is where the management API server writes its
	// audit log: one JSON event per request, at the Metadata level (who did
	// what to which object). Empty: no audit log.
	AuditLog string

	// Management is a management cluster shared with other simulators
	// (StartManagement), whose Cluster API controllers serve every cluster
	// on it; nil starts one of the simulator's own, with its own
	// controllers. Simulators on a shared one may share a Namespace as long
	// as their ClusterNames differ: each simulated provider serves its own
	// Cluster's objects only. WithoutKCP, AuditLog and
	// RestartManagementAPIServer need a management cluster of the
	// simulator's own.
	Management *Management

	// CAPIVersion, when set, runs that Cluster API release's own controller
	// binaries (core, kubeadm bootstrap, kubeadm control plane) as
	// processes, with its CRDs and webhooks, instead of Cluster API v1.14.2's
	// controllers in-process; the first start builds them (BuildRelease).
	// It needs a management cluster of the simulator's own and the KCP
	// controller.
	CAPIVersion string
	// release is CAPIVersion's, once built.
	release *Release

	// AssetsDir holds kube-apiserver and etcd; default AssetsDir().
	AssetsDir string
	// Log receives the controllers' logs; default discards them.
	Log logr.Logger
}

func (o *Options) defaults() error {
	if o.ClusterName == "" {
		o.ClusterName = "demo"
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Replicas == 0 {
		o.Replicas = 3
	}
	if o.Version == "" {
		o.Version = "v1.35.2"
	}
	if o.Image == "" {
		o.Image = "sim-image-" + o.Version
	}
	if o.AddressPrefix == "" {
		o.AddressPrefix = "127.0.0"
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	switch {
	case o.Replicas < 0:
		return fmt.Errorf("replicas must be positive, got %d", o.Replicas)
	case o.Workers < 0:
		return fmt.Errorf("workers must be 0 (none) or more, got %d", o.Workers)
	case o.Capacity < 0:
		return fmt.Errorf("capacity must be 0 (unlimited) or positive, got %d", o.Capacity)
	case o.Capacity > 0 && o.Capacity < int(o.Replicas):
		return fmt.Errorf("capacity %d cannot hold %d replicas", o.Capacity, o.Replicas)
	case o.ProvisionDelay < 0 || o.DeleteDelay < 0:
		return errors.New("delays must not be negative")
	case o.FailureDomains < 0:
		return fmt.Errorf("failure domains must be 0 (none) or more, got %d", o.FailureDomains)
	case o.Management != nil && o.AuditLog != "":
		return errors.New("an audit log needs a management cluster of the simulator's own")
	case len(o.ClassVersions) > 0 && !o.Topology:
		return errors.New("ClusterClass versions need a topology cluster")
	case o.Topology && o.WithoutKCP:
		return errors.New("a topology cluster needs the KCP controller")
	case o.Management != nil && o.WithoutKCP:
		return errors.New("leaving the KCP controller out needs a management cluster of the simulator's own")
	case o.CAPIVersion != "" && (o.Management != nil || o.WithoutKCP):
		return errors.New("a Cluster API release's binaries run on a management cluster of the simulator's own, KCP included")
	}
	if o.CAPIVersion != "" {
		if _, err := releaseMinor(o.CAPIVersion); err != nil {
			return err
		}
	}
	if o.AssetsDir == "" {
		dir, err := AssetsDir()
		if err != nil {
			return err
		}
		o.AssetsDir = dir
	}
	return nil
}

// Sim is a running simulator: a management and a workload cluster (each a real
// kube-apiserver and etcd), Cluster API's real controllers and webhooks, and
// the simulated infrastructure provider. Stop releases everything.
type Sim struct {
	opts Options
	// kcpName is the KubeadmControlPlane's: <cluster>-control-plane, or on a
	// topology cluster the name the topology controller gave it.
	kcpName string

	mgmtEnv     *envtest.Environment
	workloadEnv *envtest.Environment

	mgmtConfig     *rest.Config
	mgmtKubeconfig []byte
	workloadConfig *rest.Config
	mgmt           client.Client
	workload       client.Client

	provider *provider

	// staged holds what the faults that stage the readiness check's
	// findings keep in the simulator's process (staging.go).
	staged staged

	shutdowns []func() // after the managers stop

	binDir         string        // parent-death wrappers for the envtest binaries
	threadsRelease chan struct{} // ends the threads that started the clusters

	restartMu sync.Mutex
	restarted *exec.Cmd // the management API server after RestartManagementAPIServer

	runCtx   context.Context // ends when Stop begins
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errMu    sync.Mutex
	errs     []error
	stopOnce sync.Once
	stopErr  error
}

// Scheme is the management cluster's scheme: client-go's types and the
// Cluster API v1beta2 core, kubeadm control plane, bootstrap and runtime
// extension types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		clusterv1.AddToScheme,
		controlplanev1.AddToScheme,
		bootstrapv1.AddToScheme,
		runtimev1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}

// Start starts a simulator and returns once the Cluster, its KCP and the
// initial control-plane Machines exist and the controllers run. It does not
// wait for the machines: call WaitReady for that. ctx bounds start-up only;
// the simulator runs until Stop.
func Start(ctx context.Context, opts Options) (_ *Sim, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if opts.CAPIVersion != "" {
		if opts.release, err = BuildRelease(ctx, opts.CAPIVersion, logWriter{opts.Log.WithName("build")}); err != nil {
			return nil, err
		}
	}
	s := &Sim{opts: opts}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()

	began := time.Now()
	if err := s.startClusters(ctx); err != nil {
		return nil, err
	}
	s.opts.Log.Info("management and workload API servers started", "took", time.Since(began).String())

	runCtx, cancel := context.WithCancel(context.Background())
	s.runCtx, s.cancel = runCtx, cancel

	if err := s.createWorkloadObjects(ctx); err != nil {
		return nil, err
	}
	if err := s.createAddons(ctx); err != nil {
		return nil, err
	}
	if err := s.startAddonPods(ctx, runCtx); err != nil {
		return nil, fmt.Errorf("running the add-ons' pods: %w", err)
	}
	// Cluster API's controllers serve the admission webhooks that the
	// management objects pass through, so they start first; the provider
	// needs the cluster's certificates.
	if err := s.startCAPI(ctx, runCtx); err != nil {
		return nil, err
	}
	if err := s.createManagementObjects(ctx); err != nil {
		return nil, err
	}
	if err := s.startProvider(ctx, runCtx); err != nil {
		return nil, err
	}
	if err := s.createInitialMachines(ctx); err != nil {
		return nil, err
	}
	if err := s.resumeKCP(ctx); err != nil {
		return nil, err
	}
	s.opts.Log.Info("controllers running, initial machines created", "took", time.Since(began).String())
	return s, nil
}

// startClusters starts the management and workload API servers in parallel
// (or the workload one alone, on a shared management cluster): each takes a
// few seconds, most of it the API server's own start-up.
func (s *Sim) startClusters(ctx context.Context) error {
	var err error
	s.binDir, err = os.MkdirTemp("", "cp-rollout-sim-bin-")
	if err != nil {
		return err
	}
	apiServerBin, etcdBin, err := lifetimeBinaries(s.opts.AssetsDir, s.binDir)
	if err != nil {
		return err
	}
	if shared := s.opts.Management; shared != nil {
		s.mgmtConfig, s.mgmtKubeconfig = shared.config, shared.env.KubeConfig
	} else if s.mgmtEnv, err = managementEnvironment(apiServerBin, etcdBin, s.opts.AssetsDir, s.opts.release); err != nil {
		return err
	}
	s.workloadEnv = &envtest.Environment{
		ControlPlane:             envtest.ControlPlane{APIServer: &envtest.APIServer{Path: apiServerBin}, Etcd: &envtest.Etcd{Path: etcdBin}},
		BinaryAssetsDirectory:    s.opts.AssetsDir,
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	// A deprecated API that the deprecated-api-client fault can call: v1.36
	// serves none by default (staging.go).
	s.workloadEnv.ControlPlane.GetAPIServer().Configure().Set("runtime-config", workloadRuntimeConfig)
	if s.opts.AuditLog != "" {
		policy := filepath.Join(s.binDir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
			return err
		}
		s.mgmtEnv.ControlPlane.GetAPIServer().Configure().
			Set("audit-policy-file", policy).
			Set("audit-log-path", s.opts.AuditLog).
			Set("audit-log-format", "json")
	}
	// envtest reads KUBEBUILDER_ASSETS before BinaryAssetsDirectory; both
	// point at the same binaries when set, and AssetsDir already checked them.

	s.threadsRelease = make(chan struct{})
	var wg sync.WaitGroup
	var mgmtErr, workloadErr error
	if s.mgmtEnv != nil {
		wg.Go(func() {
			onOwnThread(s.threadsRelease, func() { s.mgmtConfig, mgmtErr = s.mgmtEnv.Start() })
			if mgmtErr == nil {
				s.mgmtKubeconfig = s.mgmtEnv.KubeConfig
			}
		})
	}
	wg.Go(func() {
		onOwnThread(s.threadsRelease, func() { s.workloadConfig, workloadErr = s.workloadEnv.Start() })
	})
	wg.Wait()
	if mgmtErr != nil {
		s.mgmtEnv = nil
		return fmt.Errorf("starting the management cluster: %w", mgmtErr)
	}
	if workloadErr != nil {
		s.workloadEnv = nil
		return fmt.Errorf("starting the workload cluster: %w", workloadErr)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mgmt, err = client.New(s.mgmtConfig, client.Options{Scheme: Scheme()})
	if err != nil {
		return err
	}
	s.workload, err = client.New(s.workloadConfig, client.Options{Scheme: clientgoscheme.Scheme})
	return err
}

// auditPolicy records every request once, when its response is complete.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
`

// goRun runs fn until the simulator stops, recording a failure other than
// the cancellation Stop causes.
func (s *Sim) goRun(name string, fn func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := fn(); err != nil && !errors.Is(err, context.Canceled) {
			s.errMu.Lock()
			s.errs = append(s.errs, fmt.Errorf("%s: %w", name, err))
			s.errMu.Unlock()
			s.opts.Log.Error(err, "simulator component stopped", "component", name)
		}
	}()
}

// Stop stops the controllers, every simulated node (etcd member, kubelet
// stand-in) and both clusters, and removes their temporary directories. It
// is safe to call more than once.
func (s *Sim) Stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		if s.cancel != nil {
			s.cancel()
		}
		s.wg.Wait()
		for _, shutdown := range s.shutdowns {
			shutdown()
		}
		if s.provider != nil {
			s.provider.stopAll()
		}
		if s.opts.Management != nil && s.mgmt != nil {
			// The shared controllers' ClusterCaches watch the workload
			// cluster until its Cluster is gone, and its API server would
			// wait for those watches before it stops.
			s.forgetCluster()
		}
		if err := s.stopRestarted(); err != nil {
			errs = append(errs, err)
		}
		// The two clusters stop in parallel: a kube-apiserver's graceful
		// shutdown takes seconds on a loaded machine.
		var envWG sync.WaitGroup
		var envMu sync.Mutex
		for i, env := range []*envtest.Environment{s.mgmtEnv, s.workloadEnv} {
			if env == nil {
				continue
			}
			envWG.Add(1)
			go func() {
				defer envWG.Done()
				began := time.Now()
				defer func() {
					s.opts.Log.Info("cluster stopped", "cluster", []string{"management", "workload"}[i], "took", time.Since(began).String())
				}()
				if err := env.Stop(); err != nil {
					envMu.Lock()
					errs = append(errs, err)
					envMu.Unlock()
				}
			}()
		}
		envWG.Wait()
		if s.threadsRelease != nil {
			close(s.threadsRelease)
		}
		if s.binDir != "" {
			_ = os.RemoveAll(s.binDir)
		}
		s.errMu.Lock()
		errs = append(errs, s.errs...)
		s.errMu.Unlock()
		s.stopErr = errors.Join(errs...)
	})
	return s.stopErr
}

// Options returns the options the simulator runs with, defaults applied.
func (s *Sim) Options() Options { return s.opts }

// ClusterKey is the namespace and name of the simulated Cluster.
func (s *Sim) ClusterKey() client.ObjectKey {
	return client.ObjectKey{Namespace: s.opts.Namespace, Name: s.opts.ClusterName}
}

// KCPKey is the namespace and name of the Cluster's KubeadmControlPlane.
func (s *Sim) KCPKey() client.ObjectKey {
	return client.ObjectKey{Namespace: s.opts.Namespace, Name: s.kcpName}
}

// ManagementConfig is an admin rest.Config for the management cluster.
func (s *Sim) ManagementConfig() *rest.Config { return rest.CopyConfig(s.mgmtConfig) }

// WorkloadConfig is an admin rest.Config for the workload cluster.
func (s *Sim) WorkloadConfig() *rest.Config { return rest.CopyConfig(s.workloadConfig) }

// ManagementClient is an uncached admin client for the management cluster.
func (s *Sim) ManagementClient() client.Client { return s.mgmt }

// WorkloadClient is an uncached admin client for the workload cluster.
func (s *Sim) WorkloadClient() client.Client { return s.workload }

// ManagementKubeconfig is a kubeconfig for the management cluster with
// embedded admin credentials and a current context whose namespace is the
// Cluster's, so kubectl and the plugin find the Cluster without flags.
func (s *Sim) ManagementKubeconfig() ([]byte, error) {
	cfg, err := clientcmd.Load(s.mgmtKubeconfig)
	if err != nil {
		return nil, err
	}
	const name = "cp-rollout-sim"
	if len(cfg.Contexts) == 0 {
		return nil, errors.New("envtest kubeconfig has no context")
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil {
		return nil, errors.New("envtest kubeconfig has no current context")
	}
	renamed := ctx.DeepCopy()
	renamed.Namespace = s.opts.Namespace
	cfg.Contexts = map[string]*clientcmdapi.Context{name: renamed}
	cfg.CurrentContext = name
	return clientcmd.Write(*cfg)
}

func (o Options) addressPrefix() string { return o.AddressPrefix }
