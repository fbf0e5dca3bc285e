package etcd_test

import (
	"strings"
	"testing"

	"github.com/cp-rollout/cp-rollout/etcd"
)

// cluster builds members from a compact description: "h" healthy voter, "u" unhealthy
// voter, "l" learner, "n" added but not started. IDs are 1, 2, 3 in order.
func cluster(shape string) []etcd.Member {
	var out []etcd.Member
	for i, kind := range shape {
		m := etcd.Member{ID: uint64(i + 1), Name: "node-" + string(rune('a'+i))}
		switch kind {
		case 'h':
			m.Healthy = true
		case 'l':
			m.Learner, m.Healthy = true, true
		case 'n':
			m.Name, m.Learner = "", true
		}
		out = append(out, m)
	}
	return out
}

func TestProject(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		shape  string
		change etcd.Change
		id     uint64
		safe   bool
		voting int
		health int
	}{
		{"h", etcd.Remove, 1, false, 0, 0},
		{"hhh", etcd.Remove, 1, true, 2, 2},
		{"hhh", etcd.Stop, 1, true, 3, 2},
		{"hhu", etcd.Remove, 1, false, 2, 1},
		{"hhu", etcd.Stop, 1, false, 3, 1},
		{"hhu", etcd.Remove, 3, true, 2, 2},
		{"hhhhu", etcd.Remove, 1, true, 4, 3},
		{"hhhuu", etcd.Remove, 1, false, 4, 2},
		{"hhhh", etcd.Stop, 1, true, 4, 3},
		{"hhhu", etcd.Stop, 1, false, 4, 2},
		{"hhhu", etcd.Remove, 1, true, 3, 2},
		// Learners and members not started do not vote, and block every other change.
		{"hhhl", etcd.Remove, 1, false, 2, 2},
		{"hhhn", etcd.Remove, 1, false, 2, 2},
		{"hhhl", etcd.Remove, 4, true, 3, 3},
		{"hhhn", etcd.Remove, 4, true, 3, 3},
		{"hhhn", etcd.Stop, 4, true, 3, 3},
		// A new member is assumed unhealthy, except when it makes one into two.
		{"h", etcd.Add, 0, true, 2, 2},
		{"hhh", etcd.Add, 0, true, 4, 3},
		{"hhu", etcd.Add, 0, false, 4, 2},
		{"hhl", etcd.Add, 0, false, 3, 2},
	} {
		p := etcd.Project(cluster(tt.shape), tt.change, tt.id)
		if p.Safe != tt.safe || p.Voting != tt.voting || p.Healthy != tt.health || p.Quorum != tt.voting/2+1 {
			t.Errorf("%s %s member %d: safe %v voting %d healthy %d quorum %d; want safe %v voting %d healthy %d",
				tt.change, tt.shape, tt.id, p.Safe, p.Voting, p.Healthy, p.Quorum, tt.safe, tt.voting, tt.health)
		}
		if !strings.Contains(p.Reason(), "quorum needs") {
			t.Errorf("reason %q", p.Reason())
		}
	}
}

func TestProjectionReasonNamesTheBlockers(t *testing.T) {
	t.Parallel()
	p := etcd.Project(cluster("hunl"), etcd.Remove, 1)
	reason := p.Reason()
	for _, want := range []string{"removing member node-a [1]", "unhealthy: node-b [2]", "(not started) [3]", "node-d [4]"} {
		if !strings.Contains(reason, want) {
			t.Errorf("reason %q lacks %q", reason, want)
		}
	}
}

// TestHealthyVoter: only a started, voting, healthy member is what a
// replacement must become; learners, members not started and unhealthy
// voters are not.
func TestHealthyVoter(t *testing.T) {
	t.Parallel()
	for i, want := range []bool{true, false, false, false} {
		if m := cluster("hunl")[i]; m.HealthyVoter() != want {
			t.Errorf("%+v: HealthyVoter %v, want %v", m, m.HealthyVoter(), want)
		}
	}
}
