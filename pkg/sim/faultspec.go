package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Faults asked for through the management cluster, so that an operator
// rehearsing a runbook breaks the simulator with kubectl (or
// `cp-rollout-sim fault`) and a test scripts an incident the same way. The
// simulator's fault controller (faultcontroller.go) applies what
// FaultAnnotation asks for and records in FaultAppliedAnnotation, and in an
// Event on the object, what it did.

const (
	// FaultAnnotation on a control-plane Machine or on the Cluster asks for
	// faults: a comma-separated list of fault names (FaultCatalogue).
	// Removing a name undoes that fault.
	FaultAnnotation = "sim.cp-rollout.io/fault"
	// FaultAppliedAnnotation is the simulator's record of the faults in
	// effect on the object, in the same form: a fault asked for but not yet
	// in effect (its machine is still provisioning) is missing here.
	FaultAppliedAnnotation = "sim.cp-rollout.io/fault-applied"
)

// FaultScope is the kind of object a fault is asked for on.
type FaultScope string

const (
	// MachineFault acts on one control-plane machine's simulated host.
	MachineFault FaultScope = "machine"
	// ClusterFault acts on the cluster as a whole.
	ClusterFault FaultScope = "cluster"
)

// Fault names and describes one fault, for help texts and the README.
type Fault struct {
	Name   string
	Scope  FaultScope
	Effect string
	Undo   string
}

// Machine and cluster fault names. Static pods have one unready fault per
// component: <component>-unready.
const (
	FaultEtcdStopped    = "etcd-stopped"
	FaultNodeNotReady   = "node-not-ready"
	FaultDrainBlocked   = "drain-blocked"
	FaultNeverProvision = "never-provision"
	FaultStaleLearner   = "stale-learner"

	unreadySuffix = "-unready"
)

// FaultCatalogue lists every fault, machine faults first.
func FaultCatalogue() []Fault {
	faults := []Fault{{
		Name: FaultEtcdStopped, Scope: MachineFault,
		Effect: "the machine's etcd member stops, as a crashed etcd: listed, unreachable",
		Undo:   "the member restarts with its identity and data",
	}}
	for _, c := range Components {
		faults = append(faults, Fault{
			Name: c + unreadySuffix, Scope: MachineFault,
			Effect: "the " + c + " static pod reports Running but not Ready",
			Undo:   "the pod is Ready again",
		})
	}
	return append(faults, Fault{
		Name: FaultNodeNotReady, Scope: MachineFault,
		Effect: "the Node's Ready condition turns False (and its not-ready taint comes back); the MachineHealthCheck remediates after 5m",
		Undo:   "the Node is Ready again, taint lifted",
	}, Fault{
		Name: FaultDrainBlocked, Scope: MachineFault,
		Effect: "a pod on the node behind a PodDisruptionBudget that allows no disruption: every eviction of it is refused (429)",
		Undo:   "the pod and its budget are deleted",
	}, Fault{
		Name: FaultNeverProvision, Scope: ClusterFault,
		Effect: "the next machine created never provisions (no host boots)",
		Undo:   "held machines provision after all; an unused one is forgotten",
	}, Fault{
		Name: FaultStaleLearner, Scope: ClusterFault,
		Effect: "an etcd learner that never starts (a failed kubeadm join): unnamed, no machine owns it",
		Undo:   "the learner is removed from etcd",
	})
}

// LookupFault returns the fault of scope named name.
func LookupFault(scope FaultScope, name string) (Fault, error) {
	var other FaultScope
	for _, f := range FaultCatalogue() {
		if f.Name != name {
			continue
		}
		if f.Scope == scope {
			return f, nil
		}
		other = f.Scope
	}
	if other != "" {
		return Fault{}, fmt.Errorf("fault %q is a %s fault, not a %s fault", name, other, scope)
	}
	var names []string
	for _, f := range FaultCatalogue() {
		if f.Scope == scope {
			names = append(names, f.Name)
		}
	}
	return Fault{}, fmt.Errorf("unknown %s fault %q (one of %s)", scope, name, strings.Join(names, ", "))
}

// ParseFaults reads an annotation value: the known faults of scope, sorted
// and without duplicates, and an error naming every name it does not know
// (a typo made with kubectl annotate is reported, the rest still applies).
func ParseFaults(scope FaultScope, value string) ([]string, error) {
	var faults []string
	var errs []error
	for name := range strings.SplitSeq(value, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if _, err := LookupFault(scope, name); err != nil {
			errs = append(errs, err)
			continue
		}
		faults = append(faults, name)
	}
	slices.Sort(faults)
	return slices.Compact(faults), errors.Join(errs...)
}

// FormatFaults is the annotation value of a set of faults.
func FormatFaults(faults []string) string {
	sorted := slices.Sorted(slices.Values(faults))
	return strings.Join(slices.Compact(sorted), ",")
}

// WithFault is the annotation value with the fault set (on) or removed. The
// names already there are kept as they are, unknown ones too: the value is
// the user's, and only the fault named changes.
func WithFault(value, fault string, on bool) string {
	var names []string
	for name := range strings.SplitSeq(value, ",") {
		if name = strings.TrimSpace(name); name != "" && name != fault {
			names = append(names, name)
		}
	}
	if on {
		names = append(names, fault)
	}
	return FormatFaults(names)
}

// AnnotationPatch is a JSON merge patch that sets the annotation key to
// value, or removes it when value is empty. A merge patch leaves every other
// annotation as it is, whoever owns it.
func AnnotationPatch(key, value string) []byte {
	var v any // null removes the key
	if value != "" {
		v = value
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: v}}})
	return patch
}

// staticPodFault returns the component a <component>-unready fault names.
func staticPodFault(fault string) (component string, ok bool) {
	component, ok = strings.CutSuffix(fault, unreadySuffix)
	return component, ok && slices.Contains(Components, component)
}
