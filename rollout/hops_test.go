package rollout

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

func TestHops(t *testing.T) {
	for _, tc := range []struct {
		name, lowest string
		via          []string
		target       string
		want         string // the chain, or the refusal's words
		bad          bool
	}{
		{"one minor", "v1.35.2", nil, "v1.36.3", "v1.36.3", false},
		{"a patch", "v1.36.1", nil, "v1.36.3", "v1.36.3", false},
		{"two minors through one", "v1.34.3", []string{"v1.35.2"}, "v1.36.3", "v1.35.2 v1.36.3", false},
		{"three minors through two", "v1.33.9", []string{"v1.34.3", "v1.35.2"}, "v1.36.3", "v1.34.3 v1.35.2 v1.36.3", false},
		{"a patch hop first", "v1.35.1", []string{"v1.35.2"}, "v1.36.3", "v1.35.2 v1.36.3", false},
		{"no machines to measure from", "", []string{"v1.35.2"}, "v1.36.3", "v1.35.2 v1.36.3", false},
		{"a skip without --via", "v1.34.3", nil, "v1.36.3", "v1.36.3 skips a minor version: from v1.34.3, pass through a v1.35.x first", true},
		{"a skip of two", "v1.33.0", nil, "v1.36.3", "pass through a v1.34.x, then a v1.35.x first", true},
		{"a via that skips", "v1.33.0", []string{"v1.35.2"}, "v1.36.3", "--via v1.35.2 skips a minor version: from v1.33.0, pass through a v1.34.x first", true},
		{"the target skips after the via", "v1.34.3", []string{"v1.35.2"}, "v1.37.0", "v1.37.0 skips a minor version: from v1.35.2", true},
		{"a via out of order", "v1.34.3", []string{"v1.35.2", "v1.35.1"}, "v1.36.3", "--via v1.35.1 is not newer than v1.35.2", true},
		{"a via the machines have reached (a resumed run)", "v1.35.2", []string{"v1.35.2"}, "v1.36.3", "v1.35.2 v1.36.3", false},
		{"a via below the machines' version", "v1.35.4", []string{"v1.35.2"}, "v1.36.3", "v1.35.2 v1.36.3", false},
		{"a target not newer than the via", "v1.34.3", []string{"v1.35.2"}, "v1.35.2", "--version v1.35.2 is not newer than v1.35.2", true},
		{"a via without its v", "v1.34.3", []string{"1.35.2"}, "v1.36.3", "--via 1.35.2 is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example v1.35.2", true},
		// The chain's own rules need no machines: Validate checks them
		// before any cluster is read (lowest "").
		{"a via on the target's minor", "", []string{"v1.36.1"}, "v1.36.3", "--via v1.36.1 and --version v1.36.3 are both v1.36.x: --via names one version of each minor below --version's", true},
		{"two vias on one minor", "", []string{"v1.35.1", "v1.35.2"}, "v1.36.3", "--via v1.35.1 and --via v1.35.2 are both v1.35.x", true},
		{"a skip between via and target, no machines", "", []string{"v1.35.2"}, "v1.37.0", "v1.37.0 skips a minor version: from v1.35.2, pass through a v1.36.x first", true},
		{"a skip between vias, no machines", "", []string{"v1.33.2", "v1.35.2"}, "v1.36.0", "--via v1.35.2 skips a minor version: from v1.33.2, pass through a v1.34.x first", true},
		{"a via out of order, no machines", "", []string{"v1.36.2"}, "v1.35.0", "--version v1.35.0 is not newer than v1.36.2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hops, err := Hops(tc.lowest, tc.via, tc.target)
			if tc.bad {
				if exitcode.Of(err) != exitcode.Usage || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v (exit %d), want exit 2 saying %q", err, exitcode.Of(err), tc.want)
				}
				return
			}
			if err != nil || strings.Join(hops, " ") != tc.want {
				t.Fatalf("got %v, %v; want %s", hops, err, tc.want)
			}
		})
	}
}

// A run resumes at the first hop the control plane has not completed.
func TestFirstRemainingHop(t *testing.T) {
	hops := []string{"v1.35.2", "v1.36.3"}
	at := func(kcp string, machines ...string) *Snapshot {
		var specs []machineSpec
		for range machines {
			specs = append(specs, machineSpec{})
		}
		s := world(specs...)
		s.CP.KCP.Spec.Version = kcp
		for i, m := range s.CP.Machines.SortedByCreationTimestamp() {
			m.Spec.Version = machines[i]
		}
		return s
	}
	deleting := func(s *Snapshot) *Snapshot {
		oldest := s.CP.Machines.Oldest()
		oldest.DeletionTimestamp = &metav1.Time{Time: s.Now}
		return s
	}
	for _, tc := range []struct {
		name string
		s    *Snapshot
		want int
	}{
		{"nothing done", at("v1.34.3", "v1.34.3", "v1.34.3", "v1.34.3"), 0},
		{"stopped in the first hop", at("v1.35.2", "v1.34.3", "v1.35.2", "v1.35.2"), 0},
		{"stopped in the first hop, its last old machine deleting", deleting(at("v1.35.2", "v1.34.3", "v1.35.2", "v1.35.2", "v1.35.2")), 0},
		{"between the hops", at("v1.35.2", "v1.35.2", "v1.35.2", "v1.35.2"), 1},
		{"stopped in the second hop, before any machine", at("v1.36.3", "v1.35.2", "v1.35.2", "v1.35.2"), 1},
		{"stopped in the second hop", at("v1.36.3", "v1.35.2", "v1.36.3", "v1.36.3"), 1},
		{"all done", at("v1.36.3", "v1.36.3", "v1.36.3", "v1.36.3"), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := firstRemainingHop(tc.s, hops); got != tc.want {
				t.Fatalf("first remaining hop %d, want %d", got, tc.want)
			}
		})
	}
}

// plan lists every hop up front: the second hop replaces the machines the
// first one made.
func TestPlanHops(t *testing.T) {
	s := world(machineSpec{outdated: true}, machineSpec{outdated: true}, machineSpec{outdated: true})
	s.CP.KCP.Spec.Version = "v1.35.2"
	p := &Prepared{Snapshot: s, Target: Target{Operation: "upgrade", Replicas: 3, MaxSurge: 1, Version: "v1.35.2"},
		Hops: []string{"v1.35.2", "v1.36.3"}}
	hops := PlanHops(context.Background(), p)
	if len(hops) != 2 {
		t.Fatalf("%d hops planned, want 2", len(hops))
	}
	for i, steps := range hops {
		var deleted []string
		for _, st := range steps {
			if st.Action == Refuse {
				t.Fatalf("hop %d refused: %v", i+1, st.Err)
			}
			if st.Action == Delete {
				deleted = append(deleted, st.Machine.Name)
			}
		}
		want := []string{"m0 m1 m2", "new-1 new-2 new-3"}[i]
		if got := strings.Join(deleted, " "); got != want {
			t.Errorf("hop %d deletes %s, want %s", i+1, got, want)
		}
	}
}

// classPlan is the Topology role: it answers ClassUpgradePlan as a
// ClusterClass declaring versions would; every other method is the nil
// interface's.
type classPlan struct {
	Topology
	plan []string
	err  error
}

func (c classPlan) ClassUpgradePlan(context.Context, *clusterv1.Cluster, string, string) ([]string, error) {
	return c.plan, c.err
}

// Without --via, a topology cluster whose class declares its versions passes
// through the class's plan; --via, or a cluster without a topology, keeps
// what the request says.
func TestViaFollowsTheClassPlan(t *testing.T) {
	class := classPlan{plan: []string{"v1.35.2", "v1.36.3"}}
	s := world(machineSpec{}, machineSpec{})
	for _, m := range s.CP.Machines {
		m.Spec.Version = "v1.34.3"
	}
	plain := Request{Operation: "upgrade", Version: "v1.36.3"}
	if via, err := viaOf(context.Background(), class, s, plain); err != nil || via != nil {
		t.Fatalf("no topology: via %v, %v; want none", via, err)
	}
	s.CP.Cluster.Spec.Topology = clusterv1.Topology{ClassRef: clusterv1.ClusterClassRef{Name: "c"}, Version: "v1.34.3"}
	if via, err := viaOf(context.Background(), class, s, plain); err != nil || strings.Join(via, " ") != "v1.35.2" {
		t.Fatalf("class plan: via %v, %v; want v1.35.2", via, err)
	}
	oneMinor := classPlan{err: errors.New("the class was read")}
	s2 := world(machineSpec{})
	for _, m := range s2.CP.Machines {
		m.Spec.Version = "v1.35.2"
	}
	s2.CP.Cluster.Spec.Topology = s.CP.Cluster.Spec.Topology
	if via, err := viaOf(context.Background(), oneMinor, s2, plain); err != nil || via != nil {
		t.Fatalf("one minor up: via %v, %v; want none, the class not consulted", via, err)
	}
	given := plain
	given.Via = []string{"v1.35.0"}
	if via, err := viaOf(context.Background(), class, s, given); err != nil || strings.Join(via, " ") != "v1.35.0" {
		t.Fatalf("--via given: via %v, %v; want v1.35.0", via, err)
	}
}
