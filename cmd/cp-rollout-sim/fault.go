package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
)

// faultOptions are `cp-rollout-sim fault`'s: set or remove one fault in the
// fault annotation of a Machine or the Cluster, the same write kubectl
// annotate makes, so a runbook rehearsal and a script break the simulator
// the same way.
type faultOptions struct {
	kubeconfig string
	namespace  string
	wait       time.Duration
	scope      sim.FaultScope
	name       string // of the Machine or Cluster
	fault      string
	// value is the setting of a fault that takes one (certs-expire-in=10d).
	value string
	on    bool
}

// entry is the fault as the annotation holds it: NAME or NAME=VALUE.
func (o *faultOptions) entry() string {
	if o.value == "" {
		return o.fault
	}
	return o.fault + "=" + o.value
}

// badTarget is a target the management cluster shows to be wrong (no such
// object, a worker for a control-plane fault): bad input, like a misspelt
// fault, though only the cluster can tell.
type badTarget struct{ error }

func newFaultFlags(o *faultOptions) *pflag.FlagSet {
	fs := pflag.NewFlagSet("fault", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "the management cluster's kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVarP(&o.namespace, "namespace", "n", "", "namespace of the Machine or Cluster (default: the kubeconfig context's, then default)")
	fs.DurationVar(&o.wait, "wait", time.Minute, "wait this long for the simulator to report the change in effect; 0 returns once the annotation is written")
	return fs
}

func parseFault(args []string) (*faultOptions, error) {
	o := &faultOptions{}
	fs := newFaultFlags(o)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() != 2 {
		return nil, fmt.Errorf("expected MACHINE|cluster/NAME and FAULT[=off|=VALUE], got %d arguments", fs.NArg())
	}
	if o.wait < 0 {
		return nil, fmt.Errorf("--wait must not be negative, got %s", o.wait)
	}
	target, fault := fs.Arg(0), fs.Arg(1)
	o.scope, o.name = sim.MachineFault, target
	if kind, name, ok := strings.Cut(target, "/"); ok {
		switch strings.ToLower(kind) {
		case "cluster", "clusters":
			o.scope = sim.ClusterFault
		case "machine", "machines":
		default:
			return nil, fmt.Errorf("target %q: want MACHINE, machine/NAME or cluster/NAME", target)
		}
		o.name = name
	}
	if o.name == "" {
		return nil, fmt.Errorf("target %q names no object", target)
	}
	name, arg, hasArg := strings.Cut(fault, "=")
	f, err := sim.LookupFault(o.scope, name)
	if err != nil {
		return nil, err
	}
	o.fault, o.on = name, true
	switch {
	case arg == "off":
		o.on = false
	case f.Value != "":
		// A setting: the value after = is the fault's, checked as the
		// simulator will read it.
		_, value, err := sim.ParseFault(o.scope, fault)
		if err != nil {
			return nil, err
		}
		o.value = value
	case hasArg && arg != "on":
		return nil, fmt.Errorf("fault %q: the state after = is on or off", fault)
	}
	return o, nil
}

func runFaultCommand(args []string, stdout, stderr io.Writer) int {
	o, err := parseFault(args)
	if errors.Is(err, pflag.ErrHelp) {
		fmt.Fprint(stdout, faultHelp())
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = o.run(ctx, stdout)
	switch {
	case errors.As(err, new(badTarget)):
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitUsage
	case err != nil:
		fmt.Fprintf(stderr, "error: %v\n", err)
		return exitError
	}
	return exitOK
}

func (o *faultOptions) run(ctx context.Context, stdout io.Writer) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	config := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	if o.namespace == "" {
		ns, _, err := config.Namespace()
		if err != nil {
			return err
		}
		o.namespace = ns
	}
	rest, err := config.ClientConfig()
	if err != nil {
		return err
	}
	c, err := client.New(rest, client.Options{Scheme: sim.Scheme()})
	if err != nil {
		return err
	}

	var obj client.Object = &clusterv1.Machine{}
	if o.scope == sim.ClusterFault {
		obj = &clusterv1.Cluster{}
	}
	key := client.ObjectKey{Namespace: o.namespace, Name: o.name}
	display := fmt.Sprintf("%s/%s", o.scope, o.name)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key, obj); err != nil {
			if apierrors.IsNotFound(err) {
				return badTarget{fmt.Errorf("%s not found in namespace %s", display, o.namespace)}
			}
			return err
		}
		if err := o.fits(obj); err != nil {
			return err
		}
		value := sim.WithFault(obj.GetAnnotations()[sim.FaultAnnotation], o.entry(), o.on)
		// The resourceVersion makes the patch fail on a concurrent change
		// rather than drop another fault written meanwhile.
		patch := client.MergeFromWithOptions(obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
		annotations := obj.GetAnnotations()
		if annotations == nil {
			annotations = map[string]string{}
		}
		if value == "" {
			delete(annotations, sim.FaultAnnotation)
		} else {
			annotations[sim.FaultAnnotation] = value
		}
		obj.SetAnnotations(annotations)
		return c.Patch(ctx, obj, patch)
	})
	if err != nil {
		return err
	}
	state := map[bool]string{true: "on", false: "off"}[o.on]
	if o.wait == 0 {
		fmt.Fprintf(stdout, "%s: %s %s asked for\n", display, o.entry(), state)
		return nil
	}
	applied, err := o.awaitApplied(ctx, c, key, obj)
	if err != nil {
		kind := map[sim.FaultScope]string{sim.MachineFault: "machine", sim.ClusterFault: "cluster"}[o.scope]
		return fmt.Errorf("%s: %s %s asked for, not in effect after %s (%v): `kubectl describe %s %s -n %s` shows the simulator's Events",
			display, o.entry(), state, o.wait, err, kind, o.name, o.namespace)
	}
	if applied == "" {
		applied = "none"
	}
	fmt.Fprintf(stdout, "%s: %s %s, in effect (faults in effect: %s)\n", display, o.entry(), state, applied)
	return nil
}

// fits refuses a fault the target cannot have: the etcd and static pod
// faults act on what only a control-plane machine runs, and KCP records
// certificate expiries of its own machines only.
func (o *faultOptions) fits(obj client.Object) error {
	if o.scope != sim.MachineFault || o.fault == sim.FaultNodeNotReady || o.fault == sim.FaultDrainBlocked {
		return nil
	}
	if _, cp := obj.GetLabels()[clusterv1.MachineControlPlaneLabel]; !cp {
		return badTarget{fmt.Errorf("machine %s is a worker: %s acts on a control-plane machine", o.name, o.fault)}
	}
	return nil
}

// awaitApplied waits for the simulator's record of the faults in effect to
// agree with what was asked for, and returns that record.
func (o *faultOptions) awaitApplied(ctx context.Context, c client.Client, key types.NamespacedName, obj client.Object) (string, error) {
	var applied string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, o.wait, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, key, obj); err != nil {
			return false, err
		}
		applied = obj.GetAnnotations()[sim.FaultAppliedAnnotation]
		faults, _ := sim.ParseFaults(o.scope, applied)
		if o.on {
			return slices.Contains(faults, o.entry()), nil
		}
		return !slices.ContainsFunc(faults, func(f string) bool { return sim.FaultName(f) == o.fault }), nil
	})
	return applied, err
}

const faultUsage = "cp-rollout-sim fault [--kubeconfig FILE] [--namespace NS] [--wait 1m] MACHINE|cluster/NAME FAULT[=off|=VALUE]"

// faultHelp is `fault --help`: the usage, what the command writes, and the
// faults from the simulator's catalogue.
func faultHelp() string {
	var b strings.Builder
	fmt.Fprintf(&b, `Usage: %s

Sets a fault on a control-plane Machine or on the Cluster (FAULT=off removes
it; a fault listed as FAULT=VALUE takes a value, and a new value replaces the
old) by writing the %s annotation, as
  kubectl annotate machine NAME %s=etcd-stopped,certs-expire-in=10d --overwrite
would, and waits until the simulator records it in effect in %s.
The simulator also reports what it did as Events on the object.

`, faultUsage, sim.FaultAnnotation, sim.FaultAnnotation, sim.FaultAppliedAnnotation)
	for _, scope := range []sim.FaultScope{sim.MachineFault, sim.ClusterFault} {
		fmt.Fprintf(&b, "%s faults:\n", map[sim.FaultScope]string{sim.MachineFault: "Machine", sim.ClusterFault: "Cluster"}[scope])
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
		for _, f := range sim.FaultCatalogue() {
			if f.Scope == scope {
				usage := f.Name
				if f.Value != "" {
					usage += "=" + f.Value
				}
				fmt.Fprintf(tw, "  %s\t%s; off: %s\n", usage, f.Effect, f.Undo)
			}
		}
		_ = tw.Flush()
		b.WriteString("\n")
	}
	b.WriteString("Flags:\n")
	b.WriteString(newFaultFlags(&faultOptions{}).FlagUsages())
	return b.String()
}
