// Command cp-rollout-sim runs the simulated Cluster API management and
// workload clusters (see pkg/sim) in the foreground, for demos, manual runs of
// the plugin and rehearsing runbooks.
//
//	cp-rollout-sim up --kubeconfig-out FILE [--cluster demo] [--namespace default]
//	    [--replicas 3] [--version v1.35.2] [--provision-delay 2s] [--delete-delay 1s]
//	    [--capacity 0] [--failure-domains 0] [--workers 0] [--topology] [--class-versions V,V,...] [--mhc=true] [--without-kcp]
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/cp-rollout/cp-rollout/pkg/sim"
)

const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type upOptions struct {
	kubeconfigOut string
	mhc           bool
	verbose       bool
	startTimeout  time.Duration
	sim           sim.Options
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
	fs.BoolVarP(&o.verbose, "verbose", "v", false, "log the controllers to stderr")
	fs.DurationVar(&o.startTimeout, "start-timeout", 3*time.Minute, "give up when not ready after this long")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.sim.WithoutMachineHealthCheck = !o.mhc
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
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "up" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintln(stdout, usage)
			return exitOK
		}
		fmt.Fprintln(stderr, "error: expected the `up` command; usage: "+usage)
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

const usage = "cp-rollout-sim up --kubeconfig-out FILE [--cluster demo] [--namespace default] [--replicas 3] [--version v1.35.2] [--provision-delay 2s] [--delete-delay 1s] [--capacity 0] [--failure-domains 0] [--workers 0] [--topology] [--class-versions V,V,...] [--mhc=true] [--without-kcp] [-v]"

func up(ctx context.Context, o *upOptions, stdout, stderr io.Writer) (err error) {
	began := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, o.startTimeout)
	defer cancel()
	s, err := sim.Start(startCtx, o.sim)
	if err != nil {
		return err
	}
	defer func() {
		// The kubeconfig names servers that no longer exist once stopped.
		_ = os.Remove(o.kubeconfigOut)
		if stopErr := s.Stop(); stopErr != nil && err == nil && ctx.Err() == nil {
			err = stopErr
		}
		fmt.Fprintln(stderr, "stopped")
	}()

	kubeconfig, err := s.ManagementKubeconfig()
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.kubeconfigOut, kubeconfig, 0o600); err != nil {
		return err
	}
	if err := s.WaitReady(startCtx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	key := s.ClusterKey()
	fmt.Fprintf(stdout, "ready: cluster %s, %d control-plane machines, management kubeconfig %s (%.1fs)\n",
		key, o.sim.Replicas, o.kubeconfigOut, time.Since(began).Seconds())
	fmt.Fprintf(stdout, "  export KUBECONFIG=%s\n  kubectl get cluster,kcp,machines\n  kubectl cp-rollout status %s\n", o.kubeconfigOut, key.Name)
	select {
	case <-ctx.Done():
		return nil
	case <-waitErr(ctx, s):
		return s.Err()
	}
}

// waitErr is closed when a simulator component fails.
func waitErr(ctx context.Context, s *sim.Sim) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if s.Err() != nil {
					close(ch)
					return
				}
			}
		}
	}()
	return ch
}
