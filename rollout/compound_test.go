package rollout

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/reconcilers/kubeadmcontrolplane"

	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// Two things wrong at once: each case is a state KCP v1.14.2 recovers from
// (or refuses) by the rules cited in the guards, and that the decision core
// once got wrong.
func TestNextCompoundFaults(t *testing.T) {
	dead := machineSpec{unhealthy: true}
	deadOld := machineSpec{outdated: true, unhealthy: true}
	deadAtHook := machineSpec{outdated: true, unhealthy: true, deleting: true, preTermOK: true}
	old, cur := machineSpec{outdated: true}, machineSpec{}
	upgrade5 := Target{Operation: "upgrade", Replicas: 5, MaxSurge: 1}
	replace := func(m string, broken ...string) Target {
		return Target{Operation: "replace", Replicas: 3, MaxSurge: 1, Replace: m, Broken: broken}
	}
	mhcDown := machineSpec{mhc: true, apiDown: true}
	inProgress := func(s *Snapshot, at time.Time) *Snapshot {
		s.CP.KCP.Annotations = map[string]string{controlplanev1.RemediationInProgressAnnotation: Remediation{Machine: "gone", Timestamp: metav1.NewTime(at)}.Marshal()}
		return s
	}
	base := world().Now.Add(-time.Hour) // the first machine's creation
	cases := []stepCase{
		// KCP's reconcilePreTerminateHook: one machine with working
		// components and quorum without the member, not every other machine
		// healthy.
		{name: "5 replicas, two dead members: the first one's hook is served though the second is dead",
			s: world(deadAtHook, machineSpec{outdated: true, unhealthy: true}, old, old, old, cur),
			t: Target{Operation: "upgrade", Replicas: 5, MaxSurge: 1, Condemned: []string{"m1"}}, action: ServeCleanupHook, machine: "m0"},
		{name: "3 replicas, a dead member at its hook and another machine's API server down: served",
			s: world(deadAtHook, machineSpec{apiDown: true}, cur), t: replace("m0"), action: ServeCleanupHook, machine: "m0"},
		{name: "but not when the hook's release would cost quorum",
			s: world(deadAtHook, dead, cur), t: replace("m0"), action: Refuse, machine: "m0", says: "quorum needs 2"},
		{name: "nor when no other machine keeps working components",
			s: world(deadAtHook, machineSpec{apiDown: true}, machineSpec{apiDown: true}), t: replace("m0"), action: Refuse, machine: "m0", says: "no control-plane machine with all its components working"},
		// replace X never deletes a healthy Y that someone marked.
		{name: "replace m1 with a marked healthy m3: m1 goes",
			s: world(cur, cur, cur, machineSpec{deleteMark: true}), t: replace("m1"), action: Delete, machine: "m1"},
		// A remediation goes on beside another broken machine.
		{name: "replace a dead machine while another's API server is down: delete it first",
			s: world(dead, machineSpec{apiDown: true}, cur), t: replace("m0", "m1"), action: Delete, machine: "m0", says: "as KCP remediates"},
		{name: "its replacement joins beside the broken machine once the remediation is recorded",
			s: inProgress(world(machineSpec{apiDown: true}, cur), base.Add(time.Hour)), t: replace("gone", "m0"), action: Create},
		{name: "without the record, a broken machine holds the create",
			s: world(machineSpec{apiDown: true}, cur), t: Target{Operation: "scale", Replicas: 3, MaxSurge: 1, Broken: []string{"m0"}}, action: Refuse, machine: "m0", says: "kube-apiserver"},
		{name: "a record older than a machine is stale: it relaxes nothing",
			s: inProgress(world(machineSpec{apiDown: true}, cur), base.Add(-time.Hour)), t: Target{Operation: "scale", Replicas: 3, MaxSurge: 1, Broken: []string{"m0"}}, action: Refuse, machine: "m0"},
		{name: "a broken machine left after the replace is named, with its command",
			s: world(machineSpec{apiDown: true}, cur, cur), t: replace("gone", "m0"), action: Done, warns: "kubectl cp-rollout replace demo m0"},
		{name: "--replace-unhealthy on 5 with two dead: the dead go before any surge",
			s: world(deadOld, deadOld, old, old, old), t: Target{Operation: "upgrade", Replicas: 5, MaxSurge: 1, Condemned: []string{"m0", "m1"}}, action: Delete, machine: "m0"},
		// KCP's targetEtcdClusterHealthy leaves out the member it removes.
		{name: "an alarm on the replaced machine's own member does not refuse its replacement: it goes first",
			s: world(cur, machineSpec{alarm: true}, cur), t: replace("m1"), action: Delete, machine: "m1"},
		{name: "but no machine is added beside an alarm: etcd takes no writes",
			s: inProgress(world(cur, machineSpec{alarm: true}), base.Add(time.Hour)), t: replace("gone", "m1"), action: Refuse, says: "etcdctl alarm disarm"},
		{name: "an alarm on another member still refuses",
			s: world(cur, machineSpec{alarm: true}, cur), t: replace("m2"), action: Refuse, says: "NOSPACE"},
		{name: "with external etcd a broken machine's replacement still comes first, surge 1",
			s: external(world(machineSpec{apiDown: true}, cur, cur)), t: replace("m0"), action: Create},
		{name: "replace of the machine that cannot go first names the one that can",
			s: world(dead, machineSpec{apiDown: true}, cur), t: replace("m1", "m0"), action: Refuse, says: "kubectl cp-rollout replace demo m0"},
		{name: "an older machine that went bad stops the run before a join is waited on",
			s: world(old, deadOld, old, machineSpec{noNode: true}), t: Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}, action: Refuse, machine: "m1"},
		// KCP's canSafelyRemediateMachine and
		// checkHealthinessWhileRemediationInProgress: one machine with all
		// components healthy, before a delete and before an add.
		{name: "all three condemned, etcd fine, surge 1: no create",
			s: world(mhcDown, mhcDown, mhcDown), t: Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}, action: Refuse, says: "no control-plane machine with all its components working"},
		{name: "replace of one of three with every API server down names no other replace (it would refuse too)",
			s: world(machineSpec{apiDown: true}, machineSpec{apiDown: true}, machineSpec{apiDown: true}), t: replace("m0", "m1", "m2"), action: Refuse, says: "by hand", lacks: "kubectl cp-rollout replace"},
		{name: "all three condemned, etcd fine, surge 0: no delete",
			s: world(mhcDown, mhcDown, mhcDown), t: Target{Operation: "upgrade", Replicas: 3, MaxSurge: 0}, action: Refuse, says: "no control-plane machine with all its components working"},
		// KCP reads a MachineHealthCheck's verdict as
		// IsUnhealthyAndOwnerRemediated.
		{name: "a machine flagged and then found healthy is not condemned",
			s: world(cur, machineSpec{mhcRecovered: true}, cur), t: upgrade5, action: Create, says: "3 of 5"},
		{name: "a machine condemned by its MachineHealthCheck goes first",
			s: world(cur, machineSpec{mhc: true}, cur, cur), t: Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}, action: Delete, machine: "m1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, tc.check)
	}
}

// TestRemediationRetryLimits: KCP's checkRetryLimits, on a machine that is
// itself the replacement of a remediated one.
func TestRemediationRetryLimits(t *testing.T) {
	now := world().Now
	at := func(ago time.Duration, retries int) string {
		return Remediation{Machine: "m9", Timestamp: metav1.NewTime(now.Add(-ago)), RetryCount: retries}.Marshal()
	}
	cases := []struct {
		name      string
		annot     string
		remedy    controlplanev1.KubeadmControlPlaneRemediationSpec
		retries   int
		held      string
		condemned bool
	}{
		{name: "no earlier remediation", condemned: true},
		{name: "one longer ago than the minimum healthy period starts afresh", annot: at(2*time.Hour, 5), remedy: controlplanev1.KubeadmControlPlaneRemediationSpec{MaxRetry: ptr.To(int32(1))}, condemned: true},
		{name: "a retry within the period counts on", annot: at(10*time.Minute, 1), retries: 2, condemned: true},
		{name: "a retry before the retry period is held", annot: at(10*time.Minute, 0), remedy: controlplanev1.KubeadmControlPlaneRemediationSpec{RetryPeriodSeconds: ptr.To(int32(1800))}, held: "retryPeriodSeconds"},
		{name: "a retry past maxRetry is held", annot: at(10*time.Minute, 2), remedy: controlplanev1.KubeadmControlPlaneRemediationSpec{MaxRetry: ptr.To(int32(2))}, held: "maxRetry is 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := world(machineSpec{}, machineSpec{mhc: true, remediationFor: tc.annot}, machineSpec{})
			s.CP.KCP.Spec.Remediation = tc.remedy
			m := s.CP.Machines["m1"]
			r, held := RemediationFor(s, m)
			if (held == "") != (tc.held == "") || !strings.Contains(held, tc.held) {
				t.Fatalf("held %q, want %q", held, tc.held)
			}
			if tc.held == "" && r.RetryCount != tc.retries {
				t.Fatalf("retry count %d, want %d", r.RetryCount, tc.retries)
			}
			if got := Condemned(s, Target{}).Has(m); got != tc.condemned {
				t.Fatalf("condemned %v, want %v", got, tc.condemned)
			}
		})
	}
}

// TestRemediationIsKCPs: the record this tool writes is the one KCP reads.
func TestRemediationIsKCPs(t *testing.T) {
	ours := Remediation{Machine: "m1", Timestamp: metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), RetryCount: 2}
	kcps, err := kubeadmcontrolplane.RemediationDataFromAnnotation(ours.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if kcps.Machine != ours.Machine || !kcps.Timestamp.Equal(&ours.Timestamp) || kcps.RetryCount != ours.RetryCount {
		t.Fatalf("KCP reads %+v from %s", kcps, ours.Marshal())
	}
	back, err := kcps.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if back != ours.Marshal() {
		t.Fatalf("KCP writes %s, this tool %s", back, ours.Marshal())
	}
}

// TestAdmitReplaceBesideBrokenMachines: a replace of a broken machine, and
// one resumed after its machine went, go on beside the other broken
// machines (Target.Broken), which are then neither refused nor waited on as
// joins; a replace of a healthy machine is refused, naming the broken one.
func TestAdmitReplaceBesideBrokenMachines(t *testing.T) {
	replace := func(m string) (Request, Target) {
		return Request{Operation: "replace", Replace: m}, Target{Operation: "replace", Replicas: 3, MaxSurge: 1, Replace: m}
	}
	broken := machineSpec{apiDown: true}
	s := world(machineSpec{unhealthy: true}, broken, machineSpec{})
	r, tg := replace("m0")
	if got, err := Admit(s, r, tg, false); err != nil || strings.Join(got.Broken, ",") != "m1" {
		t.Errorf("replace of broken m0: broken %v, %v; want m1 left to go on beside", got.Broken, err)
	}
	r, tg = replace("m2")
	if _, err := Admit(s, r, tg, false); err == nil || !strings.Contains(err.Error(), "kubectl cp-rollout replace demo m0") {
		t.Errorf("replace of healthy m2 beside broken m0 and m1: %v, want a refusal naming m0's replace", err)
	}
	// The machine named first is the one whose removal keeps quorum: the
	// most broken, not the oldest.
	s = world(broken, machineSpec{unhealthy: true}, machineSpec{})
	upgrade := Request{Operation: "upgrade"}
	if _, err := Admit(s, upgrade, Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}, false); err == nil || !strings.Contains(err.Error(), "kubectl cp-rollout replace demo m1") {
		t.Errorf("upgrade beside a dead member and an API server down: %v, want the dead member's machine named first", err)
	}
	// With no machine keeping its components working, no command could
	// replace one: the refusal says what to do by hand.
	s = world(broken, broken, broken)
	if _, err := Admit(s, upgrade, Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}, false); err == nil ||
		!strings.Contains(err.Error(), "by hand") || strings.Contains(err.Error(), "kubectl cp-rollout replace") {
		t.Errorf("upgrade with every API server down: %v, want what to do by hand and no replace", err)
	}
	// Resumed: m0 went, its replacement is still to come.
	s = world(broken, machineSpec{})
	s.CP.KCP.Annotations = map[string]string{controlplanev1.RemediationInProgressAnnotation: Remediation{Machine: "m9", Timestamp: metav1.NewTime(s.Now)}.Marshal()}
	r, tg = replace("m9")
	got, err := Admit(s, r, tg, true)
	if err != nil || strings.Join(got.Broken, ",") != "m0" {
		t.Fatalf("resumed replace: broken %v, %v; want m0", got.Broken, err)
	}
	if step := Next(t.Context(), s, got); step.Action != Create {
		t.Errorf("resumed replace: %s (%s), want the remediated machine's replacement", step.Action, step.Reason)
	}
}

// TestConvergeNamesTheBrokenMachinesItLeaves: a run done beside a machine
// it was not asked to replace says so, with the command that replaces it.
func TestConvergeNamesTheBrokenMachinesItLeaves(t *testing.T) {
	f := newScripted(pausedByUs(world(machineSpec{apiDown: true}, machineSpec{}, machineSpec{})))
	e, ev := engineFor(f, fast)
	if err := converge(t, e, Target{Operation: "replace", Replicas: 3, MaxSurge: 1, Replace: "gone", Broken: []string{"m0"}}); err != nil {
		t.Fatal(err)
	}
	if !ev.find("unhealthy", progress.Done, "kubectl cp-rollout replace demo m0") {
		t.Errorf("the broken machine left is not named")
	}
}
