package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Faults asked for through the management cluster, so that an operator
// rehearsing a runbook breaks the simulator with kubectl (or
// `cp-rollout-sim fault`) and a test scripts an incident the same way. The
// simulator's fault controller (faultcontroller.go) applies what
// FaultAnnotation asks for and records in FaultAppliedAnnotation, and in an
// Event on the object, what it did.

const (
	// FaultAnnotation on a control-plane Machine or on the Cluster asks for
	// faults: a comma-separated list of fault names (FaultCatalogue), each
	// with =VALUE when the fault takes one (certs-expire-in=10d). Removing a
	// name undoes that fault; changing a value applies the new one.
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

// Fault names and describes one fault, for help texts and docs/simulator.md.
type Fault struct {
	Name  string
	Scope FaultScope
	// Value names the value a fault takes (asked for as Name=VALUE), for a
	// fault that is a setting rather than on or off; empty otherwise.
	Value  string
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
	// FaultCertsExpireIn=DURATION (ParseExpiresIn) makes KCP's record of a
	// machine's certificate expiry say now+DURATION (certexpiry.go).
	FaultCertsExpireIn = "certs-expire-in"

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
		Name: FaultCertsExpireIn, Scope: MachineFault, Value: "DURATION",
		Effect: "KCP's record of the machine's API server certificate expiry (annotation " + clusterv1.MachineCertificatesExpiryDateAnnotation +
			" on its KubeadmConfig, which KCP does not overwrite) says now+DURATION (10d, 36h; 0 for expired), so spec.rollout.before.certificatesExpiryDays rolls it out",
		Undo: "the record says the expiry of the certificate the node serves, as KCP records it",
	}, Fault{
		Name: FaultEtcdAlarm, Scope: MachineFault,
		Effect: "the machine's etcd member raises a NOSPACE alarm (etcd's maintenance API, AlarmRequest ACTIVATE): etcd lists it, refuses writes cluster-wide, and every member's status reports it",
		Undo:   "the alarm is disarmed (AlarmRequest DEACTIVATE, as etcdctl alarm disarm)",
	}, Fault{
		Name: FaultNeverProvision, Scope: ClusterFault,
		Effect: "the next machine created never provisions (no host boots)",
		Undo:   "held machines provision after all; an unused one is forgotten",
	}, Fault{
		Name: FaultStaleLearner, Scope: ClusterFault,
		Effect: "an etcd learner that never starts (a failed kubeadm join): unnamed, no machine owns it",
		Undo:   "the learner is removed from etcd",
	}, Fault{
		Name: FaultDeprecatedAPIClient, Scope: ClusterFault,
		Effect: "a client lists " + DeprecatedAPI.Resource + " at " + DeprecatedAPI.GroupVersion().String() + " (deprecated, removed in " + DeprecatedAPIRemovedRelease +
			") on the workload API server every " + deprecatedClientInterval.String() + ", so its /metrics reports it in apiserver_requested_deprecated_apis",
		Undo: "the client stops and the workload API server's metrics are reset (DELETE /metrics)",
	}, Fault{
		Name: FaultOldWorkers, Scope: ClusterFault, Value: "VERSION",
		Effect: "worker Nodes " + strings.Join(OldWorkerNames(), " and ") + ", joined by hand (no Machine, no providerID, no control-plane label), Ready, whose kubelets report VERSION (v1.32.4); each gets a kube-proxy pod",
		Undo:   "the Nodes are deleted, their pods with them",
	}, Fault{
		Name: FaultFailClosedWebhook, Scope: ClusterFault,
		Effect: "a ValidatingWebhookConfiguration (" + WebhookName + ") with failurePolicy Fail whose Service's only ready endpoint is on the oldest control-plane machine's node; " +
			"its selectors match a label nothing carries (" + WebhookSelectorLabel + "), so it intercepts nothing",
		Undo: "the webhook configuration, Service and EndpointSlice are deleted",
	}, Fault{
		Name: FaultCorefileUnknownPlugin, Scope: ClusterFault,
		Effect: "the Corefile in kube-system/coredns gains the plugin " + UnknownCorefilePlugin + ", which the CoreDNS migration library KCP uses does not know (migration.Unsupported reports it; Migrate carries it over)",
		Undo:   "the plugin's line is taken out again",
	}, Fault{
		Name: FaultAddonUnready, Scope: ClusterFault,
		Effect: "kube-proxy's pod on every node that joins from now on stays Running but not Ready",
		Undo:   "every kube-proxy pod is Ready",
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

// ParseFault reads one entry of an annotation value, NAME or NAME=VALUE:
// the fault of scope it names and its value, checked.
func ParseFault(scope FaultScope, entry string) (Fault, string, error) {
	name, value, hasValue := strings.Cut(entry, "=")
	f, err := LookupFault(scope, name)
	if err != nil {
		return Fault{}, "", err
	}
	switch {
	case f.Value == "" && hasValue:
		return Fault{}, "", fmt.Errorf("fault %q takes no value, got %q", name, entry)
	case f.Value != "" && !hasValue:
		return Fault{}, "", fmt.Errorf("fault %q needs a value: %s=%s", name, name, f.Value)
	case name == FaultCertsExpireIn:
		if _, err := ParseExpiresIn(value); err != nil {
			return Fault{}, "", fmt.Errorf("fault %s: %w", name, err)
		}
	case name == FaultOldWorkers:
		if err := parseKubeletVersion(value); err != nil {
			return Fault{}, "", fmt.Errorf("fault %s: %w", name, err)
		}
	}
	return f, value, nil
}

// FaultName is the fault an entry of an annotation value names: the entry
// without its =VALUE.
func FaultName(entry string) string {
	name, _, _ := strings.Cut(entry, "=")
	return name
}

// ParseFaults reads an annotation value: the known faults of scope, as
// entries NAME or NAME=VALUE sorted and without duplicates, and an error
// naming every entry it cannot use (a typo made with kubectl annotate is
// reported, the rest still applies). A fault given twice with different
// values takes the last, as a later --overwrite would.
func ParseFaults(scope FaultScope, value string) ([]string, error) {
	byName := map[string]string{}
	var errs []error
	for entry := range strings.SplitSeq(value, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		if _, _, err := ParseFault(scope, entry); err != nil {
			errs = append(errs, err)
			continue
		}
		name := FaultName(entry)
		if earlier, ok := byName[name]; ok && earlier != entry {
			errs = append(errs, fmt.Errorf("fault %q given twice (%s, %s): %s applies", name, earlier, entry, entry))
		}
		byName[name] = entry
	}
	return slices.Sorted(maps.Values(byName)), errors.Join(errs...)
}

// FormatFaults is the annotation value of a set of faults.
func FormatFaults(faults []string) string {
	sorted := slices.Sorted(slices.Values(faults))
	return strings.Join(slices.Compact(sorted), ",")
}

// WithFault is the annotation value with fault (NAME or NAME=VALUE) set
// (on) or, by its name, removed. The names already there are kept as they
// are, unknown ones too: the value is the user's, and only the fault named
// changes.
func WithFault(value, fault string, on bool) string {
	var names []string
	for entry := range strings.SplitSeq(value, ",") {
		if entry = strings.TrimSpace(entry); entry != "" && FaultName(entry) != FaultName(fault) {
			names = append(names, entry)
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
