package rollout

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// A world is a hand-built snapshot: machines m0, m1, … created in that order,
// each on node n<i> with etcd member id i+1, all healthy unless changed.

type machineSpec struct {
	outdated   bool
	noNode     bool
	deleting   bool
	preTermOK  bool // Deleting condition at WaitingForPreTerminateHook
	noHook     bool
	otherHook  bool
	deleteMark bool
	nodeDown   bool
	podDown    bool
	noMember   bool
	learner    bool // added and started, not yet promoted
	unnamed    bool // added, not yet started
	unhealthy  bool
	leader     bool
	alarm      bool
	noInfra    bool
	// inPlace marks an in-place update in progress: its annotation, or a
	// pending UpdateMachine hook.
	inPlace, updateHook bool
	// mhc marks a machine a MachineHealthCheck condemned:
	// HealthCheckSucceeded=False and OwnerRemediated=False; mhcRecovered one
	// it flagged and then found healthy again (HealthCheckSucceeded=True).
	mhc, mhcRecovered bool
	// apiDown marks its kube-apiserver static pod not Ready.
	apiDown bool
	// remediationFor is its remediation-for annotation: it replaced a
	// machine remediated then.
	remediationFor string
	// certsExpireIn, when set, is when the machine's certificates expire,
	// from the snapshot's now (status.certificatesExpiryDate).
	certsExpireIn time.Duration
}

func world(specs ...machineSpec) *Snapshot {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &Snapshot{
		Now:         base.Add(time.Hour),
		EtcdManaged: true,
		Nodes:       map[string]workload.Node{},
		CP: &kcpstate.ControlPlane{
			Cluster:             &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}},
			KCP:                 &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp"}, Spec: controlplanev1.KubeadmControlPlaneSpec{Version: "v1.36.3", Replicas: ptr.To(int32(3))}},
			Machines:            collections.New(),
			MachinesNotUpToDate: collections.New(),
			InfraResources:      map[string]*unstructured.Unstructured{},
			KubeadmConfigs:      map[string]*bootstrapv1.KubeadmConfig{},
		},
	}
	for i, sp := range specs {
		name, node := "m"+string(rune('0'+i)), "n"+string(rune('0'+i))
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default", CreationTimestamp: metav1.NewTime(base.Add(time.Duration(i) * time.Minute)),
			Annotations: map[string]string{controlplanev1.PreTerminateHookCleanupAnnotation: ""},
		}}
		if sp.noHook {
			delete(m.Annotations, controlplanev1.PreTerminateHookCleanupAnnotation)
		}
		if sp.otherHook {
			m.Annotations[clusterv1.PreTerminateDeleteHookAnnotationPrefix+"/other"] = ""
		}
		if sp.deleteMark {
			m.Annotations[clusterv1.DeleteMachineAnnotation] = ""
		}
		if sp.inPlace {
			m.Annotations[clusterv1.UpdateInProgressAnnotation] = ""
		}
		if sp.updateHook {
			m.Annotations[runtimev1.PendingHooksAnnotation] = "UpdateMachine"
		}
		if sp.deleting {
			m.DeletionTimestamp = ptr.To(metav1.NewTime(base.Add(time.Duration(30+i) * time.Minute)))
			reason := "DrainingNode"
			if sp.preTermOK {
				reason = clusterv1.MachineDeletingWaitingForPreTerminateHookReason
			}
			m.Status.Conditions = []metav1.Condition{{Type: clusterv1.MachineDeletingCondition, Status: metav1.ConditionTrue, Reason: reason}}
		}
		if sp.certsExpireIn != 0 {
			m.Status.CertificatesExpiryDate = metav1.NewTime(s.Now.Add(sp.certsExpireIn))
		}
		if sp.remediationFor != "" {
			m.Annotations[controlplanev1.RemediationForAnnotation] = sp.remediationFor
		}
		if sp.mhcRecovered {
			conditions.Set(m, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionTrue, Reason: "Healthy"})
			conditions.Set(m, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse, Reason: "WaitingForRemediation"})
		}
		if sp.mhc {
			conditions.Set(m, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse, Reason: "UnhealthyNode"})
			conditions.Set(m, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition, Status: metav1.ConditionFalse, Reason: "WaitingForRemediation"})
		}
		s.CP.Machines.Insert(m)
		if sp.outdated {
			s.CP.MachinesNotUpToDate.Insert(m)
		}
		if !sp.noInfra {
			s.CP.InfraResources[name] = &unstructured.Unstructured{}
		}
		s.CP.KubeadmConfigs[name] = &bootstrapv1.KubeadmConfig{}
		if sp.noNode {
			continue
		}
		m.Status.NodeRef = clusterv1.MachineNodeReference{Name: node}
		pods := map[string]bool{}
		for _, c := range append([]string{workload.EtcdComponent}, workload.Components...) {
			pods[c] = !sp.podDown
		}
		if sp.apiDown {
			pods["kube-apiserver"] = false
		}
		s.Nodes[node] = workload.Node{Name: node, Found: true, Ready: !sp.nodeDown, Pods: pods}
		if sp.noMember {
			continue
		}
		member := etcd.Member{ID: uint64(i + 1), Name: node, Learner: sp.learner || sp.unnamed, Healthy: !sp.unhealthy, Leader: sp.leader}
		if sp.unnamed {
			member.Name = ""
		}
		if sp.alarm {
			// As etcd.Client.Members reads it: a member with alarms is not
			// healthy.
			member.Alarms, member.Healthy = []string{"NOSPACE"}, false
		}
		s.Members = append(s.Members, member)
	}
	return s
}

func TestNext(t *testing.T) {
	upgrade := Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}
	surge0 := Target{Operation: "upgrade", Replicas: 3, MaxSurge: 0}
	old, cur := machineSpec{outdated: true}, machineSpec{}
	cases := []stepCase{
		{name: "all up to date", s: world(cur, cur, cur), t: upgrade, action: Done},
		{name: "surge 1 creates first", s: world(old, old, old), t: upgrade, action: Create},
		{name: "surge 0 deletes the oldest outdated first", s: world(old, old, old), t: surge0, action: Delete, machine: "m0"},
		{name: "after the surge, the oldest outdated goes", s: world(old, old, old, cur), t: upgrade, action: Delete, machine: "m0"},
		{name: "delete-machine annotation wins", s: world(old, machineSpec{outdated: true, deleteMark: true}, old, cur), t: upgrade, action: Delete, machine: "m1"},
		{name: "replacement without node is awaited", s: world(old, old, old, machineSpec{noNode: true}), t: upgrade, action: AwaitJoin, machine: "m3", says: "no node yet"},
		{name: "replacement learner is awaited", s: world(old, old, old, machineSpec{learner: true}), t: upgrade, action: AwaitJoin, machine: "m3", says: "learner"},
		{name: "replacement with an unstarted member is awaited", s: world(old, old, old, machineSpec{unnamed: true}), t: upgrade, action: AwaitJoin, machine: "m3", says: "joining"},
		{name: "replacement with pods not ready is awaited", s: world(old, old, old, machineSpec{podDown: true}), t: upgrade, action: AwaitJoin, machine: "m3", says: "static pod"},
		{name: "a deleting machine is finished first", s: world(old, old, machineSpec{outdated: true, deleting: true}, cur), t: upgrade, action: AwaitDeletion, machine: "m2"},
		{name: "a deleting machine at its pre-terminate hook is served", s: world(old, old, machineSpec{outdated: true, deleting: true, preTermOK: true}, cur), t: upgrade, action: ServeCleanupHook, machine: "m2"},
		{name: "another pre-terminate hook goes first", s: world(old, old, machineSpec{outdated: true, deleting: true, preTermOK: true, otherHook: true}, cur), t: upgrade, action: AwaitDeletion, machine: "m2"},
		{name: "a deleting machine never counts as needing rollout", s: world(cur, cur, cur, machineSpec{outdated: true, deleting: true, noHook: true}), t: upgrade, action: AwaitDeletion, machine: "m3"},
		{name: "outdated machine with a stopped member is refused", s: world(old, machineSpec{outdated: true, unhealthy: true}, old), t: upgrade, action: Refuse, code: exitcode.Unsafe, says: "n1"},
		{name: "up-to-date machine with a stopped member is refused", s: world(old, machineSpec{unhealthy: true}, cur), t: upgrade, action: Refuse, code: exitcode.Unsafe, says: "etcd member n1"},
		{name: "nothing to do with a broken machine is done, naming its replace", s: world(cur, machineSpec{unhealthy: true}, cur), t: upgrade, action: Done, warns: "kubectl cp-rollout replace demo m1"},
		{name: "alarm is refused", s: world(old, old, machineSpec{outdated: true, alarm: true}), t: upgrade, action: Refuse, code: exitcode.Unsafe, says: "NOSPACE"},
		{name: "node down on an old machine is refused", s: world(old, machineSpec{outdated: true, nodeDown: true}, old), t: upgrade, action: Refuse, code: exitcode.Unsafe, says: "node n1 not Ready"},
		{name: "missing infra machine is refused", s: world(old, machineSpec{outdated: true, noInfra: true}, old), t: upgrade, action: Refuse, code: exitcode.Unsafe, says: "m1"},
		{name: "scale up", s: world(cur, cur, cur), t: Target{Replicas: 5, MaxSurge: 1}, action: Create},
		{name: "scale down deletes the oldest", s: world(cur, cur, cur, cur, cur), t: Target{Replicas: 3, MaxSurge: 1}, action: Delete, machine: "m0"},
		{name: "replace names a healthy machine", s: world(cur, cur, cur), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m1"}, action: Create},
		{name: "replace deletes the named machine after the surge", s: world(cur, cur, cur, cur), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m1"}, action: Delete, machine: "m1"},
		{name: "the last machine is never deleted", s: world(old), t: Target{Replicas: 1, MaxSurge: 0}, action: Refuse, code: exitcode.Unsafe, says: "last control-plane machine"},
		{name: "one replica surges", s: world(old), t: Target{Replicas: 1, MaxSurge: 1}, action: Create},
		{name: "one replica: after the surge the old one goes", s: world(machineSpec{outdated: true, leader: true}, cur), t: Target{Replicas: 1, MaxSurge: 1}, action: Delete, machine: "m0"},
		{name: "a deleting machine without the hook goes before any hook is served",
			s: world(machineSpec{outdated: true, deleting: true, preTermOK: true}, machineSpec{outdated: true, deleting: true, noHook: true}, cur), t: upgrade, action: AwaitDeletion, machine: "m1"},
		{name: "a KCP version changed by someone else stops the run", s: world(cur, cur, cur), t: Target{Replicas: 3, MaxSurge: 1, Version: "v1.37.0"}, action: Refuse, code: exitcode.Unsafe, says: "someone changed it"},
		{name: "a KCP machine template changed by someone else stops the run", s: world(cur, cur, cur), t: Target{Replicas: 3, MaxSurge: 1, Version: "v1.36.3", Template: "demo-v2"}, action: Refuse, code: exitcode.Unsafe, says: "not demo-v2: someone changed it"},
		{name: "an in-place update in progress is refused", s: world(old, machineSpec{inPlace: true}, old), t: upgrade, action: Refuse, code: exitcode.Unsafe, says: "machine m1 is being updated in place"},
		{name: "a pending UpdateMachine hook is refused", s: world(cur, cur, machineSpec{updateHook: true}), t: upgrade, action: Refuse, code: exitcode.Unsafe, says: "machine m2 is being updated in place"},
		{name: "no machine at all is refused", s: world(), t: upgrade, action: Refuse, code: exitcode.Unsafe, says: "no control-plane machine"},

		// Members no machine owns (a replacement failed mid-join and was deleted).
		{name: "a stale unnamed learner is removed before anything is created",
			s: withMembers(world(old, old, old), staleLearner), t: upgrade, action: RemoveStaleMember, says: "(not started) [63]"},
		{name: "a stale unnamed learner is removed before a surge-0 deletion",
			s: withMembers(world(old, old, old), staleLearner), t: surge0, action: RemoveStaleMember, says: "(not started) [63]"},
		{name: "an unnamed learner is kept while a machine is provisioning: it may be that machine's",
			s: withMembers(world(old, old, old, machineSpec{noNode: true}), staleLearner), t: upgrade, action: AwaitJoin, machine: "m3"},
		{name: "an unnamed learner is kept while a machine's node has no member yet",
			s: withMembers(world(old, old, old, machineSpec{noMember: true}), staleLearner), t: upgrade, action: AwaitJoin, machine: "m3"},
		{name: "a deleting machine before its pre-terminate hook is awaited first",
			s: withMembers(world(old, old, machineSpec{outdated: true, deleting: true}, cur), staleLearner), t: upgrade, action: AwaitDeletion, machine: "m2"},
		{name: "a stale named member goes before a pre-terminate hook is served: it would fail the health check for good",
			s: withMembers(world(old, old, machineSpec{outdated: true, deleting: true, preTermOK: true}, cur), staleDown), t: upgrade, action: RemoveStaleMember, says: "gone-node [64]"},
		{name: "a stale named voter that is down goes when the voters left keep quorum",
			s: withMembers(world(cur, cur, cur), staleDown), t: upgrade, action: RemoveStaleMember, says: "gone-node [64]"},
		{name: "the unnamed one goes first, as KCP orders them",
			s: withMembers(world(cur, cur, cur), staleDown, staleLearner), t: upgrade, action: RemoveStaleMember, says: "(not started) [63]"},
		{name: "a stale voter whose removal would cost quorum is refused, named",
			s: withMembers(world(cur), staleDown, etcd.Member{ID: 0x65, Name: "lost-node"}), t: Target{Replicas: 1, MaxSurge: 1},
			action: Refuse, code: exitcode.Unsafe, says: "etcd member gone-node [64] has no control-plane machine"},
		{name: "no stale member with external etcd",
			s: external(withMembers(world(cur, cur, cur), staleDown)), t: upgrade, action: Done},

		// Broken machines to replace: judged without them, and replaced first.
		{name: "replace of a machine whose member is lost deletes it first",
			s: world(cur, machineSpec{unhealthy: true}, cur), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m1"}, action: Delete, machine: "m1", says: "lost their etcd member"},
		{name: "replace of a dead machine with surge 0 deletes it",
			s: world(cur, machineSpec{unhealthy: true, podDown: true}, cur), t: Target{Replicas: 3, MaxSurge: 0, Replace: "m1"}, action: Delete, machine: "m1"},
		{name: "replace of a machine with a static pod down but its member healthy surges",
			s: world(cur, machineSpec{podDown: true}, cur), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m1"}, action: Create},
		{name: "after the surge, the broken machine named goes",
			s: world(cur, machineSpec{podDown: true}, cur, cur), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m1"}, action: Delete, machine: "m1"},
		{name: "replace of a machine that never got a node",
			s: world(cur, cur, cur, machineSpec{noNode: true}), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m3"}, action: Delete, machine: "m3"},
		{name: "replace of one machine while another is broken is refused, naming the broken one",
			s: world(cur, machineSpec{unhealthy: true}, cur), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m2"}, action: Refuse, code: exitcode.Unsafe, says: "machine m1: etcd member n1"},
		{name: "an upgrade asked to replace a broken machine deletes it first",
			s: world(old, machineSpec{outdated: true, unhealthy: true}, old), t: Target{Replicas: 3, MaxSurge: 1, Condemned: []string{"m1"}}, action: Delete, machine: "m1"},
		{name: "an upgrade replaces what a MachineHealthCheck condemned first",
			s: world(old, machineSpec{outdated: true, mhc: true}, old, cur), t: upgrade, action: Delete, machine: "m1"},
		{name: "a machine a MachineHealthCheck condemned holds nothing up, though broken",
			s: world(old, machineSpec{outdated: true, mhc: true, nodeDown: true}, old), t: surge0, action: Delete, machine: "m1"},
		// The target's own criteria, which KCP's UpToDate does not see: a
		// restart's cut-off (spec.rollout.after) and certificates expiring
		// within N days (spec.rollout.before). The world's machines are
		// created a minute apart from its base, an hour before now.
		{name: "restart: machines created before the cut-off are replaced, surge first",
			s: world(cur, cur, cur), t: restart(3 * time.Minute), action: Create},
		{name: "restart: after the surge, the oldest machine created before the cut-off goes",
			s: world(cur, cur, cur, cur), t: restart(150 * time.Second), action: Delete, machine: "m0"},
		{name: "restart: with surge 0, the oldest created before the cut-off goes first",
			s: world(cur, cur, cur), t: withSurge(restart(3*time.Minute), 0), action: Delete, machine: "m0"},
		{name: "restart: machines created since the cut-off are done",
			s: world(cur, cur, cur), t: restart(0), action: Done},
		{name: "restart: a machine created before the cut-off but deleting is awaited, never counted",
			s: world(cur, cur, cur, machineSpec{deleting: true, noHook: true}), t: restart(0), action: AwaitDeletion, machine: "m3"},
		{name: "certificates expiring within the days are replaced, surge first",
			s: world(cur, machineSpec{certsExpireIn: 10 * 24 * time.Hour}, cur), t: certificates(30), action: Create},
		{name: "after the surge, the machine whose certificates expire goes, not the oldest",
			s: world(cur, machineSpec{certsExpireIn: 10 * 24 * time.Hour}, cur, cur), t: certificates(30), action: Delete, machine: "m1"},
		{name: "certificates expiring later than the days are left",
			s: world(cur, machineSpec{certsExpireIn: 40 * 24 * time.Hour}, cur), t: certificates(30), action: Done},
		{name: "certificates already expired are replaced",
			s: world(cur, cur, machineSpec{certsExpireIn: -time.Hour}), t: withSurge(certificates(30), 0), action: Delete, machine: "m2"},
		{name: "a machine without a known expiry is left",
			s: world(cur, cur, cur), t: certificates(30), action: Done},
		{name: "a deleting machine whose certificates expire is awaited, never counted",
			s: world(cur, cur, cur, machineSpec{deleting: true, noHook: true, certsExpireIn: time.Hour}), t: certificates(30), action: AwaitDeletion, machine: "m3"},
		{name: "a condemned machine that is deleting is awaited, not condemned again",
			s: world(cur, machineSpec{deleting: true, unhealthy: true}, cur), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m1"}, action: AwaitDeletion, machine: "m1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, tc.check)
	}
}

// stepCase is one decision a test expects of Next.
type stepCase struct {
	name    string
	s       *Snapshot
	t       Target
	action  Action
	machine string
	code    int    // for Refuse; Unsafe when 0
	says    string // in the reason
	warns   string // in the warning
	lacks   string // not in the reason
}

func (tc stepCase) check(t *testing.T) {
	step := Next(context.Background(), tc.s, tc.t)
	if step.Action != tc.action {
		t.Fatalf("action %s (%s), want %s", step.Action, step.Reason, tc.action)
	}
	if tc.action == RemoveStaleMember && !strings.Contains(tc.says, step.Member.String()) {
		t.Fatalf("removes member %s, want %s", step.Member, tc.says)
	}
	if tc.machine != "" && (step.Machine == nil || step.Machine.Name != tc.machine) {
		t.Fatalf("machine %v, want %s (%s)", machineName(step.Machine), tc.machine, step.Reason)
	}
	if code := cmp.Or(tc.code, exitcode.Unsafe); tc.action == Refuse && exitcode.Of(step.Err) != code {
		t.Fatalf("exit code %d, want %d: %v", exitcode.Of(step.Err), code, step.Err)
	}
	if !strings.Contains(step.Reason, tc.says) {
		t.Fatalf("reason %q lacks %q", step.Reason, tc.says)
	}
	if tc.lacks != "" && strings.Contains(step.Reason, tc.lacks) {
		t.Fatalf("reason %q has %q", step.Reason, tc.lacks)
	}
	if (tc.warns == "") != (step.Warning == "") || !strings.Contains(step.Warning, tc.warns) {
		t.Fatalf("warning %q, want %q", step.Warning, tc.warns)
	}
}

// TestNextSyncsInPlaceFields: a machine whose in-place-mutable fields differ
// from the paused KCP's spec is synced before anything else — before the wait
// on a deleting machine, whose drain timeout is what an operator raises to
// unstick a drain — and a machine in sync is not.
func TestNextSyncsInPlaceFields(t *testing.T) {
	upgrade := Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}
	cur, deleting := machineSpec{}, machineSpec{outdated: true, deleting: true}
	labeled := func(s *Snapshot) *Snapshot {
		s.CP.KCP.Spec.MachineTemplate.ObjectMeta.Labels = map[string]string{"tier": "gold"}
		for _, m := range s.CP.Machines {
			m.Labels = map[string]string{"tier": "gold"}
			s.CP.InfraResources[m.Name].SetLabels(map[string]string{"tier": "gold"})
			s.CP.KubeadmConfigs[m.Name].Labels = map[string]string{"tier": "gold"}
		}
		return s
	}
	// drain sets the KCP's drain timeout and each machine's, m0 first.
	drain := func(kcp *int32, machines ...*int32) func(*Snapshot) *Snapshot {
		return func(s *Snapshot) *Snapshot {
			s.CP.KCP.Spec.MachineTemplate.Spec.Deletion.NodeDrainTimeoutSeconds = kcp
			for i, v := range machines {
				s.CP.Machines[fmt.Sprintf("m%d", i)].Spec.Deletion.NodeDrainTimeoutSeconds = v
			}
			return s
		}
	}
	set := func(s *Snapshot, change func(*Snapshot)) *Snapshot { change(s); return s }
	s60, s600 := ptr.To(int32(60)), ptr.To(int32(600))
	cases := []struct {
		name    string
		s       *Snapshot
		action  Action
		machine string
		says    string
	}{
		{name: "in sync: nothing to do", s: labeled(world(cur, cur, cur)), action: Done},
		{name: "a label missing on one machine is synced", s: set(labeled(world(cur, cur, cur)), func(s *Snapshot) { delete(s.CP.Machines["m1"].Labels, "tier") }),
			action: SyncMachines, machine: "m1", says: "machine m1: label tier=gold"},
		{name: "a label missing on an InfraMachine is synced", s: set(labeled(world(cur, cur, cur)), func(s *Snapshot) { s.CP.InfraResources["m2"].SetLabels(nil) }),
			action: SyncMachines, machine: "m2", says: "machine m2: InfraMachine label tier=gold"},
		{name: "a raised drain timeout reaches every machine", s: drain(s600, s60, s60, s60)(world(cur, cur, cur)),
			action: SyncMachines, says: "machine m0: nodeDrainTimeoutSeconds 60s → 600s; machine m1"},
		{name: "in sync with the raised drain timeout", s: drain(s600, s600, s600, s600)(world(cur, cur, cur)), action: Done},
		{name: "a deleting machine out of sync is synced before its deletion is awaited", s: drain(s600, s600, s600, s60, s600)(world(cur, cur, deleting, cur)),
			action: SyncMachines, machine: "m2", says: "machine m2 (deleting): nodeDrainTimeoutSeconds 60s → 600s"},
		{name: "a deleting machine in sync is awaited", s: drain(s600, s600, s600, s600, s600)(world(cur, cur, deleting, cur)),
			action: AwaitDeletion, machine: "m2"},
		{name: "a drain timeout the KCP dropped is dropped from a deleting machine, as KCP's patch does",
			s: drain(nil, nil, nil, s60, nil)(world(cur, cur, deleting, cur)), action: SyncMachines, machine: "m2", says: "nodeDrainTimeoutSeconds 60s → unset"},
		{name: "a drain timeout the KCP does not set is left alone on other machines", s: drain(nil, s60, nil, nil)(world(cur, cur, cur)), action: Done},
		{name: "labels are not pushed to a deleting machine, as KCP does not",
			s:      set(labeled(world(cur, cur, deleting, cur)), func(s *Snapshot) { delete(s.CP.Machines["m2"].Labels, "tier") }),
			action: AwaitDeletion, machine: "m2"},
		{name: "an added readiness gate is synced", s: set(world(cur, cur, cur), func(s *Snapshot) {
			s.CP.KCP.Spec.MachineTemplate.Spec.ReadinessGates = []clusterv1.MachineReadinessGate{{ConditionType: "Example"}}
		}), action: SyncMachines, says: "readiness gate Example"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			step := Next(context.Background(), tc.s, upgrade)
			if step.Action != tc.action {
				t.Fatalf("action %s (%s), want %s", step.Action, step.Reason, tc.action)
			}
			if machineName(step.Machine) != tc.machine {
				t.Fatalf("machine %q, want %q (%s)", machineName(step.Machine), tc.machine, step.Reason)
			}
			if !strings.Contains(step.Reason, tc.says) {
				t.Fatalf("reason %q lacks %q", step.Reason, tc.says)
			}
		})
	}

	// A plan shows the sync once and goes on: the machines it projects are
	// bare stand-ins, not out of sync.
	s := drain(s600, s60, s60, s60)(world(machineSpec{outdated: true}, machineSpec{outdated: true}, machineSpec{outdated: true}))
	var got []string
	for _, step := range Plan(context.Background(), s, upgrade) {
		got = append(got, string(step.Action))
	}
	if want := "sync-machines, create, delete, create, delete, create, delete"; strings.Join(got, ", ") != want {
		t.Fatalf("plan %q, want %q", strings.Join(got, ", "), want)
	}
}

// Members that no machine owns, as a replacement that failed mid-join and was
// deleted leaves them: kubeadm's learner that never started, and a started
// member whose node is gone (never reachable, so never healthy).
var (
	staleLearner = etcd.Member{ID: 0x63, Learner: true}
	staleDown    = etcd.Member{ID: 0x64, Name: "gone-node"}
)

// restart is a restart of 3 machines whose cut-off is after from the
// world's base (when its first machine was created).
func restart(after time.Duration) Target {
	return Target{Operation: "restart", Replicas: 3, MaxSurge: 1, RolloutAfter: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(after)}
}

// certificates is a rollout of 3 machines that also replaces those whose
// certificates expire within days.
func certificates(days int32) Target {
	return Target{Operation: "rollout", Replicas: 3, MaxSurge: 1, CertificatesExpiryDays: days}
}

func withSurge(t Target, surge int32) Target {
	t.MaxSurge = surge
	return t
}

func withMembers(s *Snapshot, members ...etcd.Member) *Snapshot {
	s.Members = append(s.Members, members...)
	return s
}

// external is s with external etcd: the engine then reads no members.
func external(s *Snapshot) *Snapshot {
	s.EtcdManaged, s.Members = false, nil
	return s
}

func TestQuorumGuards(t *testing.T) {
	// Three voting members, one stopped: removing a healthy one would leave 1 of 2.
	s := world(machineSpec{outdated: true}, machineSpec{outdated: true, unhealthy: true}, machineSpec{outdated: true})
	m0 := s.CP.Machines.Oldest()
	if err := SafeToRemove(s, m0); err == nil || !strings.Contains(err.Error(), "n1") {
		t.Fatalf("removing m0 with n1 stopped: %v, want a refusal naming n1", err)
	}
	// Removing the stopped member itself keeps 2 of 2 healthy.
	var m1 *clusterv1.Machine
	for _, m := range s.CP.Machines {
		if m.Name == "m1" {
			m1 = m
		}
	}
	if err := SafeToRemove(s, m1); err != nil {
		t.Fatalf("removing the stopped member: %v", err)
	}
	// A learner anywhere blocks removals.
	for _, joining := range []machineSpec{{learner: true}, {unnamed: true}} {
		s = world(machineSpec{}, machineSpec{}, machineSpec{}, joining)
		if err := SafeToRemove(s, s.CP.Machines.Oldest()); err == nil {
			t.Fatalf("removal allowed while a member is joining (%+v)", joining)
		}
	}
	// A machine without a member is safe to remove (nothing to lose).
	s = world(machineSpec{}, machineSpec{}, machineSpec{}, machineSpec{noMember: true})
	if err := SafeToRemove(s, s.CP.Machines.Newest()); err != nil {
		t.Fatalf("machine without a member: %v", err)
	}
}

func TestLeaderCandidates(t *testing.T) {
	// m0 leads; m1 outdated, m2 and m3 up to date (m3 newest), m4 deleting.
	s := world(machineSpec{outdated: true, leader: true}, machineSpec{outdated: true}, machineSpec{}, machineSpec{},
		machineSpec{deleting: true, outdated: true})
	var names []string
	for _, c := range LeaderCandidates(s, s.CP.Machines.Oldest()) {
		names = append(names, c.Name)
	}
	if got, want := strings.Join(names, ","), "n3,n2,n1"; got != want {
		t.Fatalf("candidates %s, want %s (up to date first, newest first, never the deleting one)", got, want)
	}
	// A machine a MachineHealthCheck condemned comes last, even up to date
	// and newest (as KCP ranks it: with two faults it may be the only
	// healthy member left); one it finds healthy keeps its place.
	condemn := func(m *clusterv1.Machine, ownerRemediated metav1.ConditionStatus) {
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionFalse, Reason: "UnhealthyNode"})
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineOwnerRemediatedCondition, Status: ownerRemediated, Reason: "WaitingForRemediation"})
	}
	condemn(s.CP.Machines["m3"], metav1.ConditionFalse)
	conditions.Set(s.CP.Machines["m1"], metav1.Condition{Type: clusterv1.MachineHealthCheckSucceededCondition, Status: metav1.ConditionTrue, Reason: "Succeeded"})
	names = nil
	for _, c := range LeaderCandidates(s, s.CP.Machines.Oldest()) {
		names = append(names, c.Name)
	}
	if got, want := strings.Join(names, ","), "n2,n1,n3"; got != want {
		t.Fatalf("candidates %s, want %s (the MachineHealthCheck's condemned one last)", got, want)
	}
	// Unhealthy and learner members are never candidates.
	s = world(machineSpec{leader: true}, machineSpec{unhealthy: true}, machineSpec{learner: true}, machineSpec{unnamed: true})
	if c := LeaderCandidates(s, s.CP.Machines.Oldest()); len(c) != 0 {
		t.Fatalf("candidates %v, want none", c)
	}
}

func TestHealthyNamesOrphanMember(t *testing.T) {
	s := world(machineSpec{}, machineSpec{}, machineSpec{})
	s.Members = append(s.Members, etcd.Member{ID: 99, Name: "gone-node", Healthy: true})
	err := Healthy(s)
	if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "gone-node") {
		t.Fatalf("orphan member: %v", err)
	}
}

func TestPlan(t *testing.T) {
	old := machineSpec{outdated: true}
	cases := []struct {
		name string
		s    *Snapshot
		t    Target
		want string
	}{
		{"surge 1", world(old, old, old), Target{Replicas: 3, MaxSurge: 1},
			"create, delete m0, create, delete m1, create, delete m2"},
		{"surge 0", world(old, old, old), Target{Replicas: 3, MaxSurge: 0},
			"delete m0, create, delete m1, create, delete m2, create"},
		{"scale up", world(machineSpec{}, machineSpec{}, machineSpec{}), Target{Replicas: 5, MaxSurge: 1}, "create, create"},
		{"scale down", world(machineSpec{}, machineSpec{}, machineSpec{}, machineSpec{}, machineSpec{}), Target{Replicas: 3, MaxSurge: 1}, "delete m0, delete m1"},
		{"resume with a replacement in flight", world(old, old, old, machineSpec{noNode: true}), Target{Replicas: 3, MaxSurge: 1},
			"await-join m3, delete m0, create, delete m1, create, delete m2"},
		{"resume with a deletion in flight", world(old, old, machineSpec{outdated: true, deleting: true}, machineSpec{}), Target{Replicas: 3, MaxSurge: 1},
			"await-deletion m2, create, delete m0, create, delete m1"},
		{"refusal ends the plan", world(old, machineSpec{outdated: true, unhealthy: true}, old), Target{Replicas: 3, MaxSurge: 1}, "refuse m1"},
		{"a dead machine replaced while another's API server is down: its remediation carries the create",
			world(machineSpec{unhealthy: true}, machineSpec{apiDown: true}, machineSpec{}), Target{Replicas: 3, MaxSurge: 1, Replace: "m0", Broken: []string{"m1"}},
			"delete m0, create"},
		{"one replica", world(old), Target{Replicas: 1, MaxSurge: 1}, "create, delete m0"},
		{"scale 3 to 1", world(machineSpec{}, machineSpec{}, machineSpec{}), Target{Replicas: 1, MaxSurge: 1}, "delete m0, delete m1"},
		{"nothing to do", world(machineSpec{}, machineSpec{}, machineSpec{}), Target{Replicas: 3, MaxSurge: 1}, ""},
		{"a stale member goes first", withMembers(world(old, old, old), staleLearner), Target{Replicas: 3, MaxSurge: 1},
			"remove-stale-member, create, delete m0, create, delete m1, create, delete m2"},
		{"stale members only", withMembers(world(machineSpec{}, machineSpec{}, machineSpec{}), staleDown, staleLearner), Target{Replicas: 3, MaxSurge: 1},
			"remove-stale-member, remove-stale-member"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(tc.s.CP.Machines)
			var got []string
			for _, step := range Plan(context.Background(), tc.s, tc.t) {
				got = append(got, strings.TrimSpace(string(step.Action)+" "+machineName(step.Machine)))
			}
			if strings.Join(got, ", ") != tc.want {
				t.Fatalf("plan %q, want %q", strings.Join(got, ", "), tc.want)
			}
			if len(tc.s.CP.Machines) != before {
				t.Fatal("planning changed the snapshot it was given")
			}
		})
	}
}

// spread puts the world's machines into failure domains fd1, fd2, … in turn,
// and declares those domains for control-plane machines on the Cluster.
func spread(s *Snapshot, domains int) *Snapshot {
	for i := 1; i <= domains; i++ {
		s.CP.Cluster.Status.FailureDomains = append(s.CP.Cluster.Status.FailureDomains,
			clusterv1.FailureDomain{Name: fmt.Sprintf("fd%d", i), ControlPlane: ptr.To(true)})
	}
	for i, m := range s.CP.Machines.SortedByCreationTimestamp() {
		m.Spec.FailureDomain = fmt.Sprintf("fd%d", i%domains+1)
	}
	return s
}

// After a rollout over three failure domains, each holds one machine: losing
// a domain must never cost quorum.
func TestFailureDomainsStaySpread(t *testing.T) {
	old, cur := machineSpec{outdated: true}, machineSpec{}
	cases := []struct {
		name string
		s    *Snapshot
		t    Target
	}{
		{"upgrade surge 1", spread(world(old, old, old), 3), Target{Replicas: 3, MaxSurge: 1}},
		{"upgrade surge 0", spread(world(old, old, old), 3), Target{Replicas: 3, MaxSurge: 0}},
		{"replace m0", spread(world(cur, cur, cur), 3), Target{Replicas: 3, MaxSurge: 1, Replace: "m0"}},
		{"replace m1", spread(world(cur, cur, cur), 3), Target{Replicas: 3, MaxSurge: 1, Replace: "m1"}},
		{"replace m2", spread(world(cur, cur, cur), 3), Target{Replicas: 3, MaxSurge: 1, Replace: "m2"}},
		{"replace m1 with surge 0", spread(world(cur, cur, cur), 3), Target{Replicas: 3, MaxSurge: 0, Replace: "m1"}},
		{"scale 1 to 3", spread(world(cur), 3), Target{Replicas: 3, MaxSurge: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			end := tc.s.clone()
			for n, step := range Plan(context.Background(), tc.s, tc.t) {
				switch step.Action {
				case Create:
					end.join(fmt.Sprintf("new-%d", n+1), step.FailureDomain)
				case Delete:
					end.remove(step.Machine)
				default:
					t.Fatalf("unexpected step %s %s", step.Action, step.Reason)
				}
			}
			perDomain := map[string]int{}
			for _, m := range end.CP.Machines {
				perDomain[m.Spec.FailureDomain]++
			}
			if len(perDomain) != 3 || perDomain["fd1"] != 1 || perDomain["fd2"] != 1 || perDomain["fd3"] != 1 {
				t.Fatalf("machines per failure domain after the plan: %v, want one in each", perDomain)
			}
		})
	}
}

// A restart's plan replaces each machine once: the replacements it projects
// are created after the cut-off, so they are never due themselves.
func TestPlanRestartReplacesEachMachineOnce(t *testing.T) {
	s := world(machineSpec{}, machineSpec{}, machineSpec{})
	var deleted []string
	creates := 0
	for _, step := range Plan(context.Background(), s, restart(3*time.Minute)) {
		switch step.Action {
		case Create:
			creates++
		case Delete:
			deleted = append(deleted, step.Machine.Name)
		case Refuse:
			t.Fatalf("refused: %s", step.Reason)
		}
	}
	if creates != 3 || strings.Join(deleted, ",") != "m0,m1,m2" {
		t.Fatalf("%d created, deleted %v; want 3 created and m0, m1, m2 deleted", creates, deleted)
	}
}
