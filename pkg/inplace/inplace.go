// Package inplace is the in-place-mutable fields of control-plane machines:
// what KCP's syncMachines pushes from the
// KubeadmControlPlane to every existing machine on each reconcile (CAPI
// v1.14.2, controlplane/kubeadm/reconcilers/kubeadmcontrolplane/
// kubeadmcontrolplane_controller.go, syncMachines, ~876–962, with
// updateMachine and updateLabelsAndAnnotations in helpers.go ~283–321). A
// paused KCP pushes nothing, so while a run holds it paused an operator's
// change there — a longer drain timeout for a drain a PodDisruptionBudget
// holds — would reach no machine. The run pushes them instead, writing what
// KCP writes under KCP's field managers, so that after the hand-back KCP's
// own sync finds nothing to change and nothing to fight over.
//
// Drift says where a machine differs; the management cluster client's
// SyncMachine writes it.
package inplace

import (
	"fmt"
	"maps"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg/desiredstate"
)

// Drift names each in-place-mutable field in which m, with its
// InfraMachine and KubeadmConfig in cp, differs from what cp's
// KubeadmControlPlane asks for (as "nodeDrainTimeoutSeconds 60s → 600s" or
// "InfraMachine label tier=gold"); none when in sync.
//
// It looks at what the KubeadmControlPlane's spec decides — its machine
// template's labels, annotations, deletion timeouts, taints and readiness
// gates — and only at additions and changes: a label KCP's apply would remove
// because it left the spec can only be told from managedFields, which the
// watches' caches drop, and a decision must read the same on a cache as live.
// The fields KCP adds on its own (cluster labels, the kcp-cleanup hook, the
// mandatory readiness gates) are set when a machine is made and are not what
// an operator changes; a sync writes them too.
func Drift(cp *kcpstate.ControlPlane, m *clusterv1.Machine) []string {
	tmpl := cp.KCP.Spec.MachineTemplate
	if !m.DeletionTimestamp.IsZero() {
		return deletionDrift(cp.KCP, m, SyncedDeleting(cp.KCP, m), true)
	}
	labels := desiredstate.ControlPlaneMachineLabels(cp.KCP, cp.Cluster.Name)
	annotations := desiredstate.ControlPlaneMachineAnnotations(cp.KCP)
	drift := metadataDrift("", m.Labels, m.Annotations, tmpl.ObjectMeta, labels, annotations)
	// A timeout the spec leaves unset is left alone: KCP's apply would drop
	// it only where KCP set it before, which a cached read cannot tell.
	drift = append(drift, deletionDrift(cp.KCP, m, SyncedDeleting(cp.KCP, m), false)...)
	for _, gate := range tmpl.Spec.ReadinessGates {
		if !slices.Contains(m.Spec.ReadinessGates, gate) {
			drift = append(drift, "readiness gate "+gate.ConditionType)
		}
	}
	for _, taint := range tmpl.Spec.Taints {
		if !slices.Contains(m.Spec.Taints, taint) {
			drift = append(drift, "taint "+taintString(taint))
		}
	}
	if infra, ok := cp.InfraResources[m.Name]; ok {
		drift = append(drift, metadataDrift("InfraMachine ", infra.GetLabels(), infra.GetAnnotations(), tmpl.ObjectMeta, labels, annotations)...)
	}
	if config, ok := cp.KubeadmConfigs[m.Name]; ok {
		drift = append(drift, metadataDrift("KubeadmConfig ", config.Labels, config.Annotations, tmpl.ObjectMeta, labels, annotations)...)
	}
	return drift
}

// metadataDrift compares the template's labels and annotations, with the
// values KCP gives them (its own labels win over the template's), to have.
func metadataDrift(prefix string, haveLabels, haveAnnotations map[string]string, tmpl clusterv1.ObjectMeta, labels, annotations map[string]string) []string {
	var drift []string
	for _, k := range slices.Sorted(maps.Keys(tmpl.Labels)) {
		if v, ok := haveLabels[k]; !ok || v != labels[k] {
			drift = append(drift, fmt.Sprintf("%slabel %s=%s", prefix, k, labels[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(tmpl.Annotations)) {
		if v, ok := haveAnnotations[k]; !ok || v != annotations[k] {
			drift = append(drift, fmt.Sprintf("%sannotation %s", prefix, k))
		}
	}
	return drift
}

// SyncedDeleting is m as the deleting branch of syncMachines leaves it: the
// deletion timeouts and taints of the KCP's machine template, the node
// deletion timeout defaulted as the Machine webhook does (KCP defaults it for
// the same reason: an unset one is never stored).
func SyncedDeleting(kcp *controlplanev1.KubeadmControlPlane, m *clusterv1.Machine) *clusterv1.Machine {
	synced := m.DeepCopy()
	deletion := kcp.Spec.MachineTemplate.Spec.Deletion
	synced.Spec.Deletion.NodeDrainTimeoutSeconds = deletion.NodeDrainTimeoutSeconds
	synced.Spec.Deletion.NodeDeletionTimeoutSeconds = deletion.NodeDeletionTimeoutSeconds
	defaultNodeDeletionTimeout(synced)
	synced.Spec.Deletion.NodeVolumeDetachTimeoutSeconds = deletion.NodeVolumeDetachTimeoutSeconds
	synced.Spec.Taints = kcp.Spec.MachineTemplate.Spec.Taints
	return synced
}

// deletionDrift compares m's deletion timeouts (and, deleting, its taints)
// to synced's. Deleting, KCP's merge patch sets them exactly, unset included;
// otherwise only a timeout the KCP sets is compared (see Drift).
func deletionDrift(kcp *controlplanev1.KubeadmControlPlane, m, synced *clusterv1.Machine, deleting bool) []string {
	spec := kcp.Spec.MachineTemplate.Spec.Deletion
	have := m.DeepCopy()
	defaultNodeDeletionTimeout(have) // stored machines always have one
	var drift []string
	for _, f := range []struct {
		name       string
		have, want *int32
		// set: the KCP's template sets it (not the webhook's default).
		set bool
	}{
		{"nodeDrainTimeoutSeconds", have.Spec.Deletion.NodeDrainTimeoutSeconds, synced.Spec.Deletion.NodeDrainTimeoutSeconds, spec.NodeDrainTimeoutSeconds != nil},
		{"nodeVolumeDetachTimeoutSeconds", have.Spec.Deletion.NodeVolumeDetachTimeoutSeconds, synced.Spec.Deletion.NodeVolumeDetachTimeoutSeconds, spec.NodeVolumeDetachTimeoutSeconds != nil},
		{"nodeDeletionTimeoutSeconds", have.Spec.Deletion.NodeDeletionTimeoutSeconds, synced.Spec.Deletion.NodeDeletionTimeoutSeconds, spec.NodeDeletionTimeoutSeconds != nil},
	} {
		if !equality.Semantic.DeepEqual(f.have, f.want) && (deleting || f.set) {
			drift = append(drift, fmt.Sprintf("%s %s → %s", f.name, seconds(f.have), seconds(f.want)))
		}
	}
	if deleting && !(len(m.Spec.Taints) == 0 && len(synced.Spec.Taints) == 0) && !equality.Semantic.DeepEqual(m.Spec.Taints, synced.Spec.Taints) {
		drift = append(drift, "taints")
	}
	return drift
}

func seconds(v *int32) string {
	if v == nil {
		return "unset"
	}
	return strconv.Itoa(int(*v)) + "s"
}

func taintString(t clusterv1.MachineTaint) string {
	s := t.Key
	if t.Value != "" {
		s += "=" + t.Value
	}
	return s + ":" + string(t.Effect)
}

// defaultNodeDeletionTimeoutSeconds is the Machine webhook's default.
const defaultNodeDeletionTimeoutSeconds = int32(10)

// defaultNodeDeletionTimeout defaults m's node deletion timeout as Cluster
// API's Machine webhook does (admission.DefaultMachineNodeDeletionTimeoutSeconds).
// It is written here, not imported: that package links the webhooks' CEL
// and apiserver validation and OpenTelemetry, 9 MB of the release binary, for
// these three lines. TestDefaultNodeDeletionTimeoutIsTheWebhooks holds it to
// Cluster API's.
func defaultNodeDeletionTimeout(m *clusterv1.Machine) {
	if m.Spec.Deletion.NodeDeletionTimeoutSeconds == nil {
		m.Spec.Deletion.NodeDeletionTimeoutSeconds = ptr.To(defaultNodeDeletionTimeoutSeconds)
	}
}
