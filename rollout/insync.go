package rollout

import (
	"fmt"
	"strings"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/inplace"
)

// OutOfSync returns the machines, deleting ones included, whose in-place-
// mutable fields (deletion timeouts, labels, annotations, taints, readiness
// gates; their InfraMachines' and KubeadmConfigs' labels and annotations)
// differ from what the KubeadmControlPlane asks for, oldest first, with a
// sentence naming each and its fields. KCP's syncMachines would push them on
// its next reconcile; while the run holds it paused, the run does
// (inplace.Drift says what differs, SyncMachine writes it).
//
// A projection (Plan) counts every machine as in sync: its machines are
// stand-ins, not what KCP's desired state makes, and a sync is done once.
func OutOfSync(s *Snapshot) ([]*clusterv1.Machine, string) {
	if s.projected {
		return nil, ""
	}
	var (
		machines []*clusterv1.Machine
		parts    []string
	)
	for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
		drift := inplace.Drift(s.CP, m)
		if len(drift) == 0 {
			continue
		}
		machines = append(machines, m)
		name := "machine " + m.Name
		if m.DeletionTimestamp != nil {
			name += " (deleting)"
		}
		parts = append(parts, name+": "+strings.Join(drift, ", "))
	}
	if len(machines) == 0 {
		return nil, ""
	}
	return machines, fmt.Sprintf("push what KubeadmControlPlane %s asks for, as KCP would were it not paused, to %s",
		s.CP.KCP.Name, strings.Join(parts, "; "))
}

// syncStep is the SyncMachines step when a machine is out of sync. It names
// the machine when there is one.
func syncStep(s *Snapshot) (Step, bool) {
	machines, reason := OutOfSync(s)
	if len(machines) == 0 {
		return Step{}, false
	}
	step := Step{Action: SyncMachines, Reason: reason}
	if len(machines) == 1 {
		step.Machine = machines[0]
	}
	return step, true
}
