// Command cp-rollout-sim runs the simulated Cluster API management and
// workload clusters (see internal/sim) in the foreground, for demos, manual runs of
// the plugin and rehearsing runbooks.
//
//	cp-rollout-sim up --kubeconfig-out FILE [--cluster demo] [--namespace default]
//	    [--replicas 3] [--version v1.35.2] [--image sim-image-<version>] [--provision-delay 2s] [--delete-delay 1s]
//	    [--capacity 0] [--failure-domains 0] [--workers 0] [--topology] [--class-versions V,V,...] [--mhc=true] [--without-kcp]
//	    [--clusters 1] [--inert-clusters 0] [--inert-machines 3] [--capi-version V]
//
// --capi-version runs that Cluster API release's own controller binaries as
// processes, with its CRDs and webhooks, instead of the v1.14.2 controllers
// linked in; the first use of a release builds them from the Go module proxy
// (minutes), later ones start them from the cache.
//
//	cp-rollout-sim build-capi VERSION
//
// builds (or finds in the cache) a release's controllers and prints their
// directory, so that a CI run builds them before its tests start.
//
// One cluster is named --cluster. --clusters N runs N, <cluster>-1 …
// <cluster>-N, on one management cluster with one set of Cluster API
// controllers, each with its own workload API server, etcd members and nodes
// (on 127.0.<i>.x) and the other flags' settings; all are labelled env=sim.
// --inert-clusters M adds inert-1 … inert-M, labelled env=inert: paused
// clusters of --inert-machines healthy-looking control-plane machines that
// are management-cluster objects only (sim.CreateInertClusters), a fleet to
// select from at little cost. Every cluster is in --namespace.
//
//	cp-rollout-sim fault [--kubeconfig FILE] [--namespace NS] [--wait 1m] MACHINE|cluster/NAME FAULT[=off|=VALUE]
//
// sets or removes one fault (with its value, for a setting such as
// certs-expire-in=10d) in the sim.cp-rollout.io/fault annotation of a
// Machine or the Cluster of a running simulator, as kubectl annotate would,
// and waits until the simulator reports it in effect; `fault --help` lists
// the faults (internal/sim FaultCatalogue).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/cp-rollout/cp-rollout/internal/sim"
)

const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// maxClusters is how many simulated clusters --clusters may ask for: each
// takes a loopback /24, 127.0.1 … 127.0.254.
const maxClusters = 254

type upOptions struct {
	kubeconfigOut string
	mhc           bool
	verbose       bool
	startTimeout  time.Duration
	clusters      int
	inertClusters int
	inertMachines int
	// sim is every simulated cluster's options; a cluster of several gets
	// its name, addresses and the shared management cluster from
	// clusterOptions.
	sim sim.Options
}

func parseUp(args []string) (*upOptions, error) {
	o := &upOptions{}
	fs := pflag.NewFlagSet("up", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.kubeconfigOut, "kubeconfig-out", "", "write the management cluster's kubeconfig to this file (required)")
	fs.StringVar(&o.sim.ClusterName, "cluster", "demo", "name of the simulated Cluster")
	fs.StringVar(&o.sim.Namespace, "namespace", "default", "namespace of the Cluster")
	fs.Int32Var(&o.sim.Replicas, "replicas", 3, "control-plane replicas")
	fs.StringVar(&o.sim.Version, "version", "v1.35.2", "Kubernetes version of the control plane")
	fs.StringVar(&o.sim.Image, "image", "", "machine image of the infrastructure machine templates (spec.template.spec.image), the nodes' osImage; default sim-image-<version>")
	fs.DurationVar(&o.sim.ProvisionDelay, "provision-delay", 2*time.Second, "time a simulated machine takes to provision")
	fs.DurationVar(&o.sim.DeleteDelay, "delete-delay", time.Second, "time a simulated machine takes to go away")
	fs.IntVar(&o.sim.Capacity, "capacity", 0, "most machines that can exist at once; 0 means unlimited")
	fs.IntVar(&o.sim.FailureDomains, "failure-domains", 0, "control-plane failure domains fd-1 ... fd-N the infrastructure reports; 0 means none")
	fs.Int32Var(&o.sim.Workers, "workers", 0, "worker machines in a MachineDeployment (demo-md-0); 0 means none")
	fs.BoolVar(&o.sim.Topology, "topology", false, "make the Cluster a topology cluster of a ClusterClass (demo-class); the topology controller owns its KCP and workers")
	fs.Func("class-versions", "with --topology, the Kubernetes versions the ClusterClass declares, comma-separated (Cluster API's chained upgrades plan through them)", func(v string) error {
		o.sim.ClassVersions = strings.Split(v, ",")
		return nil
	})
	fs.BoolVar(&o.mhc, "mhc", true, "watch the control-plane machines with the MachineHealthCheck Cluster API recommends (node not Ready for 5m)")
	fs.BoolVar(&o.sim.WithoutKCP, "without-kcp", false, "do not run the KubeadmControlPlane controller")
	fs.StringVar(&o.sim.CAPIVersion, "capi-version", "", "run this Cluster API release's own controller binaries (built from the Go module proxy on first use, minutes) instead of the v1.14.2 controllers linked in")
	fs.IntVar(&o.clusters, "clusters", 1, "simulated clusters <cluster>-1 ... <cluster>-N on one management cluster, each with its own workload cluster, etcd and nodes; 1 means one named --cluster")
	fs.IntVar(&o.inertClusters, "inert-clusters", 0, "paused clusters inert-1 ... inert-M (env=inert) that are management-cluster objects only: no workload cluster, no etcd")
	fs.IntVar(&o.inertMachines, "inert-machines", 3, "control-plane machines of each inert cluster (odd, as KCP's webhook wants with stacked etcd)")
	fs.BoolVarP(&o.verbose, "verbose", "v", false, "log the controllers to stderr")
	fs.DurationVar(&o.startTimeout, "start-timeout", 3*time.Minute, "give up when not ready after this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.sim.WithoutMachineHealthCheck = !o.mhc
	o.sim.Labels = map[string]string{"env": "sim"}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.kubeconfigOut == "":
		return nil, errors.New("--kubeconfig-out is required")
	case o.sim.Replicas < 1:
		return nil, fmt.Errorf("--replicas must be at least 1, got %d", o.sim.Replicas)
	case o.sim.Capacity < 0:
		return nil, fmt.Errorf("--capacity must be 0 (unlimited) or more, got %d", o.sim.Capacity)
	case o.sim.Capacity > 0 && o.sim.Capacity < int(o.sim.Replicas):
		return nil, fmt.Errorf("--capacity %d cannot hold --replicas %d", o.sim.Capacity, o.sim.Replicas)
	case o.sim.ProvisionDelay < 0 || o.sim.DeleteDelay < 0:
		return nil, errors.New("delays must not be negative")
	case o.sim.FailureDomains < 0:
		return nil, fmt.Errorf("--failure-domains must be 0 (none) or more, got %d", o.sim.FailureDomains)
	case o.sim.Workers < 0:
		return nil, fmt.Errorf("--workers must be 0 (none) or more, got %d", o.sim.Workers)
	case o.sim.ClusterName == "" || o.sim.Namespace == "":
		return nil, errors.New("--cluster and --namespace must not be empty")
	case o.clusters < 1 || o.clusters > maxClusters:
		return nil, fmt.Errorf("--clusters must be between 1 and %d, got %d", maxClusters, o.clusters)
	case o.clusters > 1 && o.sim.WithoutKCP:
		return nil, errors.New("--without-kcp needs a management cluster of the cluster's own, not one of --clusters > 1")
	case o.sim.CAPIVersion != "" && (o.clusters > 1 || o.sim.WithoutKCP):
		return nil, errors.New("--capi-version runs one cluster with its KCP controller: it takes neither --clusters > 1 nor --without-kcp")
	case o.sim.CAPIVersion != "" && !capiRelease.MatchString(o.sim.CAPIVersion):
		return nil, fmt.Errorf("--capi-version must be a Cluster API release such as v1.13.6, got %q", o.sim.CAPIVersion)
	case o.inertClusters < 0:
		return nil, fmt.Errorf("--inert-clusters must be 0 (none) or more, got %d", o.inertClusters)
	case o.inertMachines < 1 || o.inertMachines%2 == 0:
		return nil, fmt.Errorf("--inert-machines must be odd (a KubeadmControlPlane with stacked etcd), got %d", o.inertMachines)
	}
	for i := 1; i <= o.clusters; i++ {
		if name := o.clusterOptions(i, nil).ClusterName; o.isInert(name) {
			return nil, fmt.Errorf("cluster %s would be one of the inert clusters: choose another --cluster", name)
		}
	}
	return o, nil
}

// clusterOptions are the options of the i-th (from 1) simulated cluster: the
// one named --cluster, or <cluster>-<i> of several on the management cluster
// m with addresses of its own.
func (o *upOptions) clusterOptions(i int, m *sim.Management) sim.Options {
	opts := o.sim
	opts.Labels = maps.Clone(o.sim.Labels)
	if o.clusters > 1 {
		opts.ClusterName = fmt.Sprintf("%s-%d", o.sim.ClusterName, i)
		opts.AddressPrefix = fmt.Sprintf("127.0.%d", i)
		opts.Management = m
	}
	return opts
}

// isInert reports whether name is one of the inert clusters'.
func (o *upOptions) isInert(name string) bool {
	_, number, ok := strings.Cut(name, "-")
	i, err := strconv.Atoi(number)
	return ok && err == nil && i >= 1 && i <= o.inertClusters && name == sim.InertClusterName(i)
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "fault" {
		return runFaultCommand(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "build-capi" {
		return runBuildCAPI(args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "up" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(stdout, usage)
			fmt.Fprintln(stdout, faultUsage)
			fmt.Fprintln(stdout, buildUsage)
			return exitOK
		}
		fmt.Fprintln(stderr, "error: expected the `up`, `fault` or `build-capi` command; usage: "+usage+" | "+faultUsage+" | "+buildUsage)
		return exitUsage
	}
	o, err := parseUp(args[1:])
	if errors.Is(err, pflag.ErrHelp) {
		fmt.Fprintln(stdout, usage)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitUsage
	}

	logger := logr.Discard()
	if o.verbose {
		logger = funcr.New(func(prefix, args string) {
			fmt.Fprintf(stderr, "%s %s %s\n", time.Now().Format(time.TimeOnly), prefix, args)
		}, funcr.Options{})
	}
	// Controller-runtime and client-go log through these globals; without a
	// logger they would print warnings and retries over the output a user reads.
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	o.sim.Log = logger

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := up(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitError
	}
	return exitOK
}

const usage = "cp-rollout-sim up --kubeconfig-out FILE [--cluster demo] [--namespace default] [--replicas 3] [--version v1.35.2] [--image sim-image-<version>] [--provision-delay 2s] [--delete-delay 1s] [--capacity 0] [--failure-domains 0] [--workers 0] [--topology] [--class-versions V,V,...] [--mhc=true] [--without-kcp] [--clusters 1] [--inert-clusters 0] [--inert-machines 3] [--capi-version V] [-v]"

const buildUsage = "cp-rollout-sim build-capi VERSION (a Cluster API release such as v1.13.6)"

var capiRelease = regexp.MustCompile(`^v1\.\d+\.\d+$`)

// runBuildCAPI builds a Cluster API release's controllers into the cache, or
// finds them there, and prints their directory.
func runBuildCAPI(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 || !capiRelease.MatchString(args[0]) {
		fmt.Fprintln(stderr, "error: usage: "+buildUsage)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := sim.BuildRelease(ctx, args[0], stderr)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitError
	}
	fmt.Fprintln(stdout, r.Dir)
	return exitOK
}

// startConcurrency is how many simulated clusters start at once: a start-up
// keeps a core busy (an API server, its CRDs and etcd), and the machine this
// runs on may have two.
const startConcurrency = 2

func up(ctx context.Context, o *upOptions, stdout, stderr io.Writer) (err error) {
	if o.sim.CAPIVersion != "" {
		// Before the start-up timeout: the first build of a release takes
		// minutes.
		if _, err := sim.BuildRelease(ctx, o.sim.CAPIVersion, stderr); err != nil {
			return err
		}
	}
	began := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, o.startTimeout)
	defer cancel()
	sims, stop, err := startClusters(startCtx, o)
	defer func() {
		// The kubeconfig names servers that no longer exist once stopped.
		_ = os.Remove(o.kubeconfigOut)
		if stopErr := stop(); stopErr != nil && err == nil && ctx.Err() == nil {
			err = stopErr
		}
		fmt.Fprintln(stderr, "stopped")
	}()
	if err != nil {
		return err
	}

	kubeconfig, err := sims[0].ManagementKubeconfig()
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.kubeconfigOut, kubeconfig, 0o600); err != nil {
		return err
	}
	if o.inertClusters > 0 {
		if err := sim.CreateInertClusters(startCtx, sims[0].ManagementClient(), o.sim.Namespace, o.inertClusters, o.inertMachines, o.sim.Version); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("creating the inert clusters: %w", err)
		}
	}
	for _, s := range sims {
		if err := s.WaitReady(startCtx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("cluster %s: %w", s.ClusterKey().Name, err)
		}
	}

	var names []string
	for _, s := range sims {
		names = append(names, s.ClusterKey().String())
	}
	inert := ""
	if o.inertClusters > 0 {
		inert = fmt.Sprintf(", %d inert clusters (%s ... %s) of %d machines", o.inertClusters,
			sim.InertClusterName(1), sim.InertClusterName(o.inertClusters), o.inertMachines)
	}
	if len(sims) == 1 {
		fmt.Fprintf(stdout, "ready: cluster %s, %d control-plane machines%s, management kubeconfig %s (%.1fs)\n",
			names[0], o.sim.Replicas, inert, o.kubeconfigOut, time.Since(began).Seconds())
	} else {
		fmt.Fprintf(stdout, "ready: clusters %s, %d control-plane machines each%s, management kubeconfig %s (%.1fs)\n",
			strings.Join(names, ", "), o.sim.Replicas, inert, o.kubeconfigOut, time.Since(began).Seconds())
	}
	list := "kubectl get cluster,kcp,machines"
	if len(sims) > 1 || o.inertClusters > 0 {
		list = "kubectl get clusters -L env"
	}
	fmt.Fprintf(stdout, "  export KUBECONFIG=%s\n  %s\n  kubectl cp-rollout status %s\n", o.kubeconfigOut, list, sims[0].ClusterKey().Name)
	select {
	case <-ctx.Done():
		return nil
	case <-waitErr(ctx, sims):
		var errs []error
		for _, s := range sims {
			errs = append(errs, s.Err())
		}
		return errors.Join(errs...)
	}
}

// startClusters starts the simulated clusters: one with a management
// cluster of its own, or several on one they share, startConcurrency at a
// time. stop stops whatever started, also when err is set.
func startClusters(ctx context.Context, o *upOptions) (sims []*sim.Sim, stop func() error, err error) {
	if o.clusters == 1 {
		s, err := sim.Start(ctx, o.clusterOptions(1, nil))
		if err != nil {
			return nil, func() error { return nil }, err
		}
		return []*sim.Sim{s}, s.Stop, nil
	}
	m, err := sim.StartManagement(ctx, o.sim.AssetsDir, o.sim.Log)
	if err != nil {
		return nil, func() error { return nil }, err
	}
	sims = make([]*sim.Sim, o.clusters)
	stop = func() error {
		// Each stops its workload API server, seconds on a busy machine:
		// in parallel, then the management cluster they share.
		var g errgroup.Group
		for _, s := range sims {
			if s != nil {
				g.Go(s.Stop)
			}
		}
		return errors.Join(g.Wait(), m.Stop())
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(startConcurrency)
	for i := range sims {
		g.Go(func() error {
			s, err := sim.Start(gctx, o.clusterOptions(i+1, m))
			if err != nil {
				return fmt.Errorf("cluster %s: %w", o.clusterOptions(i+1, m).ClusterName, err)
			}
			sims[i] = s
			return nil
		})
	}
	return sims, stop, g.Wait()
}

// waitErr is closed when a component of any of the simulators fails.
func waitErr(ctx context.Context, sims []*sim.Sim) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				for _, s := range sims {
					if s.Err() != nil {
						close(ch)
						return
					}
				}
			}
		}
	}()
	return ch
}
