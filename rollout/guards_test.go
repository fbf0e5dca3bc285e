package rollout

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// The refusals a request meets before anything changes: each names its
// cause and carries its exit code, decided from one snapshot.

func TestCheckStateRefuses(t *testing.T) {
	upgrade := Request{Operation: "upgrade", Version: "v1.36.3"}
	cases := []struct {
		name   string
		change func(s *Snapshot)
		says   string
	}{
		{"a deleting Cluster", func(s *Snapshot) { s.CP.Cluster.DeletionTimestamp = ptr.To(metav1.Now()) }, "cluster demo is being deleted"},
		{"a paused Cluster", func(s *Snapshot) { s.CP.Cluster.Spec.Paused = ptr.To(true) }, "cluster demo is paused"},
		{"a KCP paused by someone else", func(s *Snapshot) {
			s.CP.KCP.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
		}, "paused by someone else"},
		{"a remediation in progress", func(s *Snapshot) {
			s.CP.KCP.Annotations = map[string]string{controlplanev1.RemediationInProgressAnnotation: "{}"}
		}, "remediation in progress"},
		{"KCP's own remediation, begun before our record", func(s *Snapshot) {
			s.CP.KCP.Annotations = map[string]string{clusterv1.PausedAnnotation: "true",
				record.Annotation: `{"operation":"upgrade","target":"v1.36.3","who":"us","started":"2026-01-01T02:00:00Z"}`,
				controlplanev1.RemediationInProgressAnnotation: `{"machine":"m1","timestamp":"2026-01-01T01:00:00Z","retryCount":0}`}
		}, "remediation in progress"},
		{"an unfinished operation for another target", func(s *Snapshot) {
			s.CP.KCP.Annotations = map[string]string{clusterv1.PausedAnnotation: "true",
				record.Annotation: `{"operation":"scale","target":"replicas=5","who":"someone"}`}
		}, "holds an unfinished operation"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := world(machineSpec{}, machineSpec{}, machineSpec{})
			tc.change(s)
			err := CheckState(s, upgrade)
			if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got exit %d %v; want exit 3 saying %q", exitcode.Of(err), err, tc.says)
			}
		})
	}
	t.Run("a pause record of another operation refuses the pause verb, naming it", func(t *testing.T) {
		s := pausedByUs(world(machineSpec{}, machineSpec{}, machineSpec{}))
		s.CP.KCP.Annotations[record.Annotation] = `{"operation":"upgrade","target":"v1.36.3","who":"us"}`
		err := CheckState(s, Request{Operation: record.PauseOperation})
		if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "upgrade to v1.36.3") || !strings.Contains(err.Error(), "handback") {
			t.Fatalf("got exit %d %v; want exit 3 naming the upgrade and the way on", exitcode.Of(err), err)
		}
	})
	t.Run("a KCP held by pause is every verb's to take over", func(t *testing.T) {
		for _, r := range []Request{upgrade, {Operation: "scale", Replicas: ptr.To(int32(5))}, {Operation: "replace", Replace: "m1"},
			{Operation: "rollout"}, {Operation: "rollout", CertificatesExpiryDays: 30}, {Operation: "restart"}, {Operation: record.PauseOperation}} {
			s := pausedByUs(world(machineSpec{outdated: true}, machineSpec{outdated: true}, machineSpec{}))
			s.CP.KCP.Annotations[record.Annotation] = `{"operation":"pause","target":"","who":"alice","reason":"audit flags"}`
			if err := CheckState(s, r); err != nil {
				t.Errorf("%s: %v", r.Operation, err)
			}
		}
	})
	t.Run("a rollout of a KCP that is rolling out by itself is refused, naming it", func(t *testing.T) {
		s := world(machineSpec{outdated: true}, machineSpec{outdated: true}, machineSpec{})
		s.CP.KCP.Status.Conditions = []metav1.Condition{{Type: controlplanev1.KubeadmControlPlaneRollingOutCondition, Status: metav1.ConditionTrue,
			Reason: controlplanev1.KubeadmControlPlaneRollingOutReason, Message: "Rolling out 2 not up-to-date replicas"}}
		err := CheckState(s, Request{Operation: "rollout"})
		for _, says := range []string{"KCP's own rollout", "RollingOut=True (RollingOut): Rolling out 2 not up-to-date replicas", "outdated: m0, m1", "kubectl cp-rollout pause demo"} {
			if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), says) {
				t.Fatalf("got exit %d %v; want exit 3 saying %q", exitcode.Of(err), err, says)
			}
		}
		if err := CheckState(world(machineSpec{}, machineSpec{}, machineSpec{}), Request{Operation: "rollout"}); err != nil {
			t.Fatalf("nothing outdated: %v", err)
		}
		s.CP.KCP.Annotations = map[string]string{clusterv1.PausedAnnotation: "true",
			record.Annotation: `{"operation":"rollout","target":"spec","who":"us"}`}
		if err := CheckState(s, Request{Operation: "rollout"}); err != nil {
			t.Fatalf("our own rollout resumes: %v", err)
		}
	})
	t.Run("our own unfinished operation resumes", func(t *testing.T) {
		s := pausedByUs(world(machineSpec{}, machineSpec{}, machineSpec{}))
		s.CP.KCP.Annotations[record.Annotation] = `{"operation":"upgrade","target":"v1.36.3","who":"us"}`
		if err := CheckState(s, upgrade); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("our own remediation, begun under our record, resumes", func(t *testing.T) {
		s := pausedByUs(world(machineSpec{}, machineSpec{}, machineSpec{}))
		s.CP.KCP.Annotations[record.Annotation] = `{"operation":"upgrade","target":"v1.36.3","who":"us","started":"2026-01-01T01:00:00Z"}`
		s.CP.KCP.Annotations[controlplanev1.RemediationInProgressAnnotation] = `{"machine":"m1","timestamp":"2026-01-01T01:10:00Z","retryCount":0}`
		if err := CheckState(s, upgrade); err != nil {
			t.Fatal(err)
		}
	})
}

// On a topology cluster the Cluster is where a change of target shows while
// the KCP is paused mid-rollout: the topology controller holds it back from
// the KCP.
// Due is what the target's own criteria add to KCP's verdict; never a
// deleting machine, and nothing without a criterion.
func TestDue(t *testing.T) {
	expiring := machineSpec{certsExpireIn: 24 * time.Hour}
	s := world(machineSpec{}, expiring, machineSpec{outdated: true}, machineSpec{deleting: true, certsExpireIn: time.Hour})
	for _, tc := range []struct {
		t          Target
		due, needs string
	}{
		{Target{}, "", "m2"},
		{certificates(30), "m1", "m1,m2"},
		{restart(90 * time.Second), "m0,m1", "m0,m1,m2"},
		{restart(59 * time.Minute), "m0,m1,m2", "m0,m1,m2"},
		// As spec.rollout.after: a cut-off not yet passed counts nothing.
		{restart(time.Hour), "", "m2"},
	} {
		if got := strings.Join(sorted(Due(s, tc.t)), ","); got != tc.due {
			t.Errorf("%+v: due %q, want %q", tc.t, got, tc.due)
		}
		if got := strings.Join(sorted(NeedingRollout(s, tc.t)), ","); got != tc.needs {
			t.Errorf("%+v: needing rollout %q, want %q", tc.t, got, tc.needs)
		}
	}
}

func sorted(ms collections.Machines) []string {
	names := ms.Names()
	slices.Sort(names)
	return names
}

func TestTargetUnchangedOnTopology(t *testing.T) {
	target := Target{Operation: "upgrade", Version: "v1.36.3", Replicas: 3, MaxSurge: 1}
	s := world(machineSpec{}, machineSpec{}, machineSpec{})
	s.CP.KCP.Spec.Version = "v1.36.3"
	s.CP.Cluster.Spec.Topology = clusterv1.Topology{ClassRef: clusterv1.ClusterClassRef{Name: "some-class"}, Version: "v1.36.3"}
	if err := TargetUnchanged(s, target); err != nil {
		t.Fatalf("topology and KCP at the target: %v", err)
	}
	s.CP.Cluster.Spec.Topology.Version = "v1.36.4"
	if err := TargetUnchanged(s, target); exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "Cluster demo's topology asks for v1.36.4") {
		t.Fatalf("topology moved on: exit %d %v; want exit 3 naming the Cluster", exitcode.Of(err), err)
	}
	s.CP.Cluster.Spec.Topology = clusterv1.Topology{}
	if err := TargetUnchanged(s, target); err != nil {
		t.Fatalf("no topology: %v", err)
	}
}

func TestDesiredRefusesBadInput(t *testing.T) {
	replicas := func(n int32) *int32 { return &n }
	cases := []struct {
		name string
		r    Request
		says string
	}{
		{"a downgrade by a patch", Request{Operation: "upgrade", Version: "v1.36.2"}, "downgrade"},
		{"a downgrade by a minor", Request{Operation: "upgrade", Version: "v1.35.9"}, "downgrade"},
		{"even replicas with stacked etcd", Request{Operation: "scale", Replicas: replicas(4)}, "odd"},
		{"surge 0 below three replicas", Request{Operation: "scale", Replicas: replicas(1), MaxSurge: 0}, "--max-surge 0 needs at least 3 replicas (this control plane has 1)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := world(machineSpec{}, machineSpec{}, machineSpec{})
			for _, m := range s.CP.Machines {
				m.Spec.Version = "v1.36.3"
			}
			_, err := Desired(context.Background(), s, tc.r)
			if exitcode.Of(err) != exitcode.Usage || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got exit %d %v; want exit 2 saying %q", exitcode.Of(err), err, tc.says)
			}
		})
	}
	t.Run("the next minor passes", func(t *testing.T) {
		s := world(machineSpec{}, machineSpec{}, machineSpec{})
		for _, m := range s.CP.Machines {
			m.Spec.Version = "v1.36.3"
		}
		s.CP.KCP.Spec.MachineTemplate.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
			APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "GenericInfrastructureMachineTemplate", Name: "demo"}
		want, err := Desired(context.Background(), s, Request{Operation: "upgrade", Version: "v1.37.0", MaxSurge: 1})
		if err != nil || want.Spec.Version != "v1.37.0" {
			t.Fatalf("got %v, %v", want, err)
		}
	})
}

func TestCheckKCPVersion(t *testing.T) {
	for version, ok := range map[string]bool{"v1.14.2": true, "v1.14.0-rc.1": true, "v1.13.2": true, "v1.13.6": true, "v1.12.4": false, "v1.15.0": false, "latest": false} {
		if err := CheckKCPVersion(version); (err == nil) != ok {
			t.Errorf("KCP controller %s: %v", version, err)
		} else if err != nil && exitcode.Of(err) != exitcode.Unsafe {
			t.Errorf("KCP controller %s: exit %d, want 3", version, exitcode.Of(err))
		}
	}
}

// TestStaleMembers: the members no machine owns, and KCP's holds — while any
// machine lacks a node, none; while a machine's node has no member of its own,
// no unnamed one (it may be that node's learner about to start); while a
// machine is deleting, none.
func TestStaleMembers(t *testing.T) {
	names := func(s *Snapshot) string {
		var out []string
		for _, m := range StaleMembers(s) {
			out = append(out, m.String())
		}
		return strings.Join(out, ", ")
	}
	cur := machineSpec{}
	cases := []struct {
		name string
		s    *Snapshot
		want string
	}{
		{"none", world(cur, cur, cur), ""},
		{"unnamed first, then by name", withMembers(world(cur, cur, cur), staleDown, staleLearner), "(not started) [63], gone-node [64]"},
		{"a machine without a node holds all", withMembers(world(cur, cur, machineSpec{noNode: true}), staleDown, staleLearner), ""},
		{"a node without its member holds the unnamed one only", withMembers(world(cur, cur, machineSpec{noMember: true}), staleDown, staleLearner), "gone-node [64]"},
		{"a deleting machine with its member holds none", withMembers(world(cur, cur, machineSpec{deleting: true}), staleDown, staleLearner), "(not started) [63], gone-node [64]"},
		{"a deleting machine without a node holds all", withMembers(world(cur, cur, machineSpec{deleting: true, noNode: true}), staleDown, staleLearner), ""},
		{"a deleting machine whose member is gone holds the unnamed one", withMembers(world(cur, cur, machineSpec{deleting: true, noMember: true}), staleDown, staleLearner), "gone-node [64]"},
		{"a machine's own learner is no stale member", world(cur, cur, machineSpec{learner: true}), ""},
		{"external etcd has none", external(withMembers(world(cur, cur, cur), staleDown)), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := names(tc.s); got != tc.want {
				t.Fatalf("stale members %q, want %q", got, tc.want)
			}
		})
	}
}

func TestBroken(t *testing.T) {
	upgrade := Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1}
	cases := []struct {
		name     string
		s        *Snapshot
		t        Target
		resuming bool
		want     string
	}{
		{name: "all healthy", s: world(machineSpec{}, machineSpec{}, machineSpec{}), t: upgrade},
		{name: "a stopped member", s: world(machineSpec{}, machineSpec{unhealthy: true}, machineSpec{}), t: upgrade, want: "m1"},
		{name: "a static pod down beside a promoted member", s: world(machineSpec{}, machineSpec{}, machineSpec{podDown: true}), t: upgrade, want: "m2"},
		{name: "a node down", s: world(machineSpec{nodeDown: true}, machineSpec{}, machineSpec{}), t: upgrade, want: "m0"},
		{name: "no node yet is a join, not broken", s: world(machineSpec{}, machineSpec{}, machineSpec{noNode: true}), t: upgrade},
		{name: "a learner is a join, not broken", s: world(machineSpec{}, machineSpec{}, machineSpec{learner: true}), t: upgrade},
		{name: "a deleting machine is going", s: world(machineSpec{}, machineSpec{deleting: true, unhealthy: true}, machineSpec{}), t: upgrade},
		{name: "the machine named for replacement is condemned, not broken",
			s: world(machineSpec{}, machineSpec{unhealthy: true}, machineSpec{}), t: Target{Replicas: 3, MaxSurge: 1, Replace: "m1"}},
		{name: "a machine a MachineHealthCheck condemned is to be replaced anyway",
			s: world(machineSpec{}, machineSpec{unhealthy: true, mhc: true}, machineSpec{}), t: upgrade},
		{name: "resuming, an up-to-date machine is the interrupted run's replacement",
			s: world(machineSpec{outdated: true}, machineSpec{outdated: true}, machineSpec{podDown: true}), t: upgrade, resuming: true},
		{name: "resuming, an outdated broken machine is broken",
			s: world(machineSpec{outdated: true, podDown: true}, machineSpec{outdated: true}, machineSpec{}), t: upgrade, resuming: true, want: "m0"},
		{name: "external etcd: a node down", s: external(world(machineSpec{}, machineSpec{nodeDown: true})), t: upgrade, want: "m1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(Broken(tc.s, tc.t, tc.resuming).Names(), ","); got != tc.want {
				t.Fatalf("broken %q, want %q", got, tc.want)
			}
		})
	}
}

// A restart's cut-off is its own record's start, so a resumed restart keeps
// it; to the second, as creation timestamps are, so that a replacement made
// in the cut-off's second is never counted as created before it.
func TestRestartCutoff(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 30, 700_000_000, time.UTC)
	started := time.Date(2026, 1, 1, 11, 0, 5, 400_000_000, time.UTC)
	for _, tc := range []struct {
		rec  *record.Record
		want time.Time
	}{
		{nil, now.Truncate(time.Second)},
		{&record.Record{Operation: "restart", Started: started}, started.Truncate(time.Second)},
		{&record.Record{Operation: record.PauseOperation, Started: started}, now.Truncate(time.Second)},
	} {
		if got := restartCutoff(tc.rec, now); !got.Equal(tc.want) {
			t.Errorf("%v: cut-off %s, want %s", tc.rec, got, tc.want)
		}
	}
}
