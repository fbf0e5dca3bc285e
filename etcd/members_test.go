package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

// strictReconfig keeps etcd's default refusal of membership changes while members it
// counts on have been connected for less than five seconds, as in production.
func strictReconfig(c *member.Config) { c.RelaxedReconfigCheck = false }

func TestMembersOfOneThreeAndFiveMemberClusters(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 3, 5} {
		t.Run(fmt.Sprintf("%d members", size), func(t *testing.T) {
			ctx := testContext(t)
			tc := newTestCluster(t, size)
			members := mustMembers(t, ctx, tc.client(), tc.nodes)
			if len(members) != size {
				t.Fatalf("listed %d members, want %d: %v", len(members), size, members)
			}
			leaders := 0
			for _, m := range members {
				if !m.Voting() || !m.Healthy || m.Node != m.Name {
					t.Errorf("member %s: voting %v healthy %v node %q errors %v", m, m.Voting(), m.Healthy, m.Node, m.Errors)
				}
				if m.Version != "3.6.14" || m.DBSize <= 0 || m.RaftTerm == 0 || m.RaftIndex == 0 || len(m.PeerURLs) != 1 || len(m.ClientURLs) != 1 {
					t.Errorf("member %s: status not filled in: %+v", m, m)
				}
				if m.Leader {
					leaders++
				}
			}
			if leaders != 1 {
				t.Errorf("%d leaders among %v", leaders, members)
			}
			if p := etcd.Project(members, etcd.Remove, members[0].ID); p.Safe != (size > 1) {
				t.Errorf("removing one of %d healthy members: %s; safe %v", size, p.Reason(), p.Safe)
			}
			if size == 5 {
				fiveTolerateOneMoreFailure(t, tc, members)
			}
		})
	}
}

func TestMoveLeaderToChosenMember(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 3)
	c := tc.client()
	members := mustMembers(t, ctx, c, tc.nodes)
	leader, ok := etcd.Leader(members)
	if !ok {
		t.Fatal("no leader")
	}
	candidates := followers(members)
	if len(candidates) != 2 {
		t.Fatalf("candidates %v", candidates)
	}
	for _, target := range append(candidates, candidates[0]) {
		if err := c.MoveLeader(ctx, tc.nodes, target.ID); err != nil {
			t.Fatal(err)
		}
		now, ok := etcd.Leader(mustMembers(t, ctx, c, tc.nodes))
		if !ok || now.ID != target.ID {
			t.Fatalf("leader after moving to %s is %s", target, now)
		}
	}
	// Asking for the current leader is a no-op, not an error.
	if err := c.MoveLeader(ctx, tc.nodes, candidates[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := c.MoveLeader(ctx, tc.nodes, 0xdead); !errors.Is(err, etcd.ErrMemberNotFound) {
		t.Fatalf("moving to an unknown member: %v", err)
	}

	// Forwarding leaves leadership alone unless the member leaving holds it.
	first := leader
	leader, follower := candidates[0], candidates[1]
	if err := c.ForwardLeadership(ctx, tc.nodes, follower.ID, first.ID); err != nil {
		t.Fatal(err)
	}
	if now, _ := etcd.Leader(mustMembers(t, ctx, c, tc.nodes)); now.ID != leader.ID {
		t.Fatalf("forwarding from follower %s moved leadership to %s", follower, now)
	}
	if err := c.ForwardLeadership(ctx, tc.nodes, leader.ID, follower.ID); err != nil {
		t.Fatal(err)
	}
	if now, _ := etcd.Leader(mustMembers(t, ctx, c, tc.nodes)); now.ID != follower.ID {
		t.Fatalf("forwarding from leader %s to %s: leader is %s", leader, follower, now)
	}
}

// countingDialer counts the dials to each node.
type countingDialer struct {
	etcd.Dialer
	mu    sync.Mutex
	dials map[string]int
}

func (d *countingDialer) DialContext(ctx context.Context, node etcd.Node) (net.Conn, error) {
	d.mu.Lock()
	d.dials[node.Name]++
	d.mu.Unlock()
	return d.Dialer.DialContext(ctx, node)
}

func (d *countingDialer) count(node string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials[node]
}

// TestRemoveMemberGoneFromEveryList: a removed member is gone from every
// member's list, and its connection closed: nothing dials it again.
func TestRemoveMemberGoneFromEveryList(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 3, strictReconfig)
	dialer := &countingDialer{dials: map[string]int{}}
	c := tc.client(func(cfg *etcd.Config) { dialer.Dialer, cfg.Dialer = cfg.Dialer, dialer })
	members := mustMembers(t, ctx, c, tc.nodes)
	leader, _ := etcd.Leader(members)
	if _, err := c.RemoveMember(ctx, tc.nodes, leader.ID); !errors.Is(err, etcd.ErrIsLeader) {
		t.Fatalf("removing the leader: %v", err)
	}
	victim := followers(members)[0]
	if _, err := c.RemoveMember(ctx, tc.nodes, victim.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-tc.members[victim.Name].Stopped():
	case <-time.After(10 * time.Second):
		t.Error("removed member still running")
	}
	// gRPC redials a lost connection within a second or two.
	dials := dialer.count(victim.Name)
	time.Sleep(3 * time.Second)
	if n := dialer.count(victim.Name) - dials; n > 0 {
		t.Errorf("the removed member was dialled %d times after its removal", n)
	}
	// Every remaining member, asked on its own, no longer lists the victim.
	for _, n := range tc.nodes {
		if n.Name == victim.Name {
			continue
		}
		list, err := c.Members(ctx, []etcd.Node{n})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := etcd.MemberByID(list, victim.ID); ok || len(list) != 2 {
			t.Errorf("node %s still lists %s: %v", n.Name, victim, list)
		}
	}
	// Resuming after an interruption removes nothing twice and fails on nothing.
	if _, err := c.RemoveMember(ctx, tc.nodes, victim.ID); err != nil {
		t.Fatalf("removing again: %v", err)
	}
}

// TestRemoveMemberRightAfterAJoin: a member that has just joined refuses membership
// changes for five seconds (etcd's strict reconfiguration check counts only peers it has
// been connected to that long), while the members that were there before accept them.
// A removal listed through the newcomer — the rollout's order, newest node first — goes to
// another member instead of waiting out the newcomer's five seconds.
func TestRemoveMemberRightAfterAJoin(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 3, strictReconfig)
	tc.start("node-d", strictReconfig)
	newcomer := tc.node("node-d")
	nodes := append([]etcd.Node{newcomer}, tc.nodes[:3]...)

	var mu sync.Mutex
	removals := map[string]int{} // MemberRemove calls by the node they went to
	c := tc.client(func(cfg *etcd.Config) {
		cfg.DialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if strings.HasSuffix(method, "/MemberRemove") {
					mu.Lock()
					removals[cc.Target()[strings.LastIndex(cc.Target(), "etcd-")+len("etcd-"):]]++
					mu.Unlock()
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			})}
	})
	members := mustMembers(t, ctx, c, nodes)
	victim := followers(members)[0]
	if victim.Name == newcomer.Name {
		victim = followers(members)[1]
	}

	// The newcomer refuses, as on every replacement's join.
	_, err := tc.raw(tc.members[newcomer.Name].ClientURL()).MemberRemove(ctx, victim.ID)
	if err == nil {
		t.Skipf("%s accepted a membership change already: its start took five seconds on this machine, and nothing is left to route around", newcomer.Name)
	}
	if !errors.Is(err, rpctypes.ErrUnhealthy) {
		t.Fatalf("the newcomer answered the removal with %v, want etcd's strict reconfiguration refusal", err)
	}

	held, err := c.RemoveMember(ctx, nodes, victim.ID)
	if err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("the removal reports etcd held it %s, but a member that was there before accepts it at once", held)
	}
	mu.Lock()
	defer mu.Unlock()
	if removals[newcomer.Name] > 1 {
		t.Errorf("the removal waited on the newcomer, which refuses for five seconds: MemberRemove calls by node %v", removals)
	}
	if _, still := etcd.MemberByID(mustMembers(t, ctx, c, nodes), victim.ID); still {
		t.Errorf("%s is still a member", victim)
	}
}

// TestRemoveMemberHeldByEtcd: when every member that stays counts the
// newcomer among them, each refuses the removal until the newcomer has been
// connected for five seconds; the removal waits that out and reports how long
// etcd held it, the time a rollout with surge 0 spends on etcd's rule.
func TestRemoveMemberHeldByEtcd(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 2, strictReconfig)
	tc.start("node-c", strictReconfig)
	nodes := append([]etcd.Node{tc.node("node-c")}, tc.nodes[:2]...)
	c := tc.client()
	members := mustMembers(t, ctx, c, nodes)
	leader, _ := etcd.Leader(members)
	var victim etcd.Member
	for _, m := range members {
		if m.ID != leader.ID && m.Node != "node-c" {
			victim = m
		}
	}
	if victim.ID == 0 {
		t.Skip("the newcomer leads already; nothing old to remove but the leader")
	}
	// The leader stays with the newcomer: two members, quorum two, and the
	// newcomer has not been connected for five seconds.
	if _, err := tc.raw(tc.members[leader.Node].ClientURL()).MemberRemove(ctx, victim.ID); !errors.Is(err, rpctypes.ErrUnhealthy) {
		t.Skipf("the leader answered the removal with %v, not etcd's strict reconfiguration refusal: the newcomer's start took five seconds on this machine", err)
	}
	began := time.Now()
	held, err := c.RemoveMember(ctx, nodes, victim.ID)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); held <= 0 || held > took {
		t.Errorf("the removal took %s and reports etcd held it %s, want more than nothing and no more than it took", took, held)
	}
	if _, still := etcd.MemberByID(mustMembers(t, ctx, c, nodes), victim.ID); still {
		t.Errorf("%s is still a member", victim)
	}
}

func TestRemoveLastMemberRefused(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 1)
	c := tc.client()
	only := mustMembers(t, ctx, c, tc.nodes)[0]
	if _, err := c.RemoveMember(ctx, tc.nodes, only.ID); !errors.Is(err, etcd.ErrLastMember) || !strings.Contains(err.Error(), "node-a") {
		t.Fatalf("removing the last member: %v", err)
	}
	if len(mustMembers(t, ctx, c, tc.nodes)) != 1 {
		t.Fatal("last member removed")
	}
}

func TestStoppedMemberUnhealthyAndSecondRemovalRefused(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 3, strictReconfig)
	c := tc.client()
	members := mustMembers(t, ctx, c, tc.nodes)
	stopped := followers(members)[0]
	tc.members[stopped.Name].Stop()

	members = mustMembers(t, ctx, c, tc.nodes)
	got := named(t, members, stopped.Name)
	if got.Healthy || len(got.Errors) == 0 || !strings.Contains(strings.Join(got.Errors, " "), stopped.Name) {
		t.Fatalf("stopped member reported healthy %v, errors %v", got.Healthy, got.Errors)
	}
	var healthy []etcd.Member
	for _, m := range members {
		if m.ID == stopped.ID {
			continue
		}
		if !m.HealthyVoter() {
			t.Fatalf("member %s beside the stopped one: voting %v healthy %v errors %v", m, m.Voting(), m.Healthy, m.Errors)
		}
		healthy = append(healthy, m)
	}
	for _, other := range healthy {
		for _, change := range []etcd.Change{etcd.Remove, etcd.Stop} {
			if p := etcd.Project(members, change, other.ID); p.Safe {
				t.Errorf("%s %s with %s stopped projected safe: %s", change, other, stopped, p.Reason())
			}
		}
		var qe *etcd.QuorumError
		if _, err := c.RemoveMember(ctx, tc.nodes, other.ID); !errors.As(err, &qe) {
			t.Fatalf("removing a second member: %v", err)
		}
	}
	if len(mustMembers(t, ctx, c, tc.nodes)) != 3 {
		t.Fatal("a member was removed")
	}
	// Removing the stopped member itself keeps quorum among the two healthy ones.
	if p := etcd.Project(members, etcd.Remove, stopped.ID); !p.Safe {
		t.Fatalf("removing the stopped member: %s", p.Reason())
	}
	if _, err := c.RemoveMember(ctx, tc.nodes, stopped.ID); err != nil {
		t.Fatal(err)
	}
}

func TestLearnerAndUnstartedMemberNeverLead(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 2)
	c := tc.client()
	learner := tc.start("node-c", func(cfg *member.Config) { cfg.StayLearner = true })

	members := mustMembers(t, ctx, c, tc.nodes)
	got := named(t, members, "node-c")
	if !got.Learner || got.Voting() || !got.Started() || got.ID != learner.ID() {
		t.Fatalf("learner reported as %+v", got)
	}
	if err := c.MoveLeader(ctx, tc.nodes, got.ID); !errors.Is(err, etcd.ErrNotVoting) || !strings.Contains(err.Error(), "node-c") {
		t.Fatalf("moving leadership to a learner: %v", err)
	}
	leader, _ := etcd.Leader(members)
	if p := etcd.Project(members, etcd.Remove, leader.ID); p.Safe || len(p.Pending) != 1 {
		t.Fatalf("removal with a learner pending projected as %s", p.Reason())
	}
	// The learner itself may go: it does not count towards quorum.
	if _, err := c.RemoveMember(ctx, tc.nodes, got.ID); err != nil {
		t.Fatal(err)
	}

	// A member added but never started, as a join that died before etcd came up.
	added, err := tc.raw(tc.members["node-a"].ClientURL()).MemberAddAsLearner(ctx, []string{"https://" + tc.ip("node-d") + ":2380"})
	if err != nil {
		t.Fatal(err)
	}
	members = mustMembers(t, ctx, c, tc.nodes)
	unstarted, ok := etcd.MemberByID(members, added.Member.ID)
	if !ok || unstarted.Started() || !unstarted.Learner || unstarted.Healthy || unstarted.Name != "" {
		t.Fatalf("unstarted member reported as %+v", unstarted)
	}
	if members[len(members)-1].ID != unstarted.ID {
		t.Errorf("unstarted member not listed last: %v", members)
	}
	if err := c.MoveLeader(ctx, tc.nodes, unstarted.ID); !errors.Is(err, etcd.ErrNotVoting) {
		t.Fatalf("moving leadership to an unstarted member: %v", err)
	}
	if p := etcd.Project(members, etcd.Add, 0); p.Safe {
		t.Fatalf("adding while a member has not started projected safe: %s", p.Reason())
	}
}

func TestAlarmReported(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 2)
	// A member whose backend quota is already exceeded raises NOSPACE on the next write
	// it receives, as a member whose disk fills up does.
	full := tc.start("node-c", func(cfg *member.Config) { cfg.QuotaBackendBytes = 1 })
	if _, err := tc.raw(full.ClientURL()).Put(ctx, "key", strings.Repeat("x", 1024)); err == nil {
		t.Fatal("write over quota accepted")
	}
	c := tc.client()
	members := mustMembers(t, ctx, c, tc.nodes)
	got := named(t, members, "node-c")
	if got.Healthy || len(got.Alarms) != 1 || got.Alarms[0] != "NOSPACE" {
		t.Fatalf("member over quota: healthy %v alarms %v", got.Healthy, got.Alarms)
	}
	for _, m := range members {
		if m.Name != "node-c" && len(m.Alarms) != 0 {
			t.Errorf("alarm attributed to %s: %v", m, m.Alarms)
		}
	}
}

// fiveTolerateOneMoreFailure: with one member of five down, healthy members can be
// removed while the rest keeps quorum: five to four (three of four healthy) and four to
// three (two of three), but not three to two (one of two).
func fiveTolerateOneMoreFailure(t *testing.T, tc *testCluster, members []etcd.Member) {
	ctx := testContext(t)
	c := tc.client()
	others := followers(members)
	down := others[0]
	tc.members[down.Name].Stop()
	for i, victim := range others[1:] {
		members = mustMembers(t, ctx, c, tc.nodes)
		p := etcd.Project(members, etcd.Remove, victim.ID)
		_, err := c.RemoveMember(ctx, tc.nodes, victim.ID)
		var qe *etcd.QuorumError
		if last := i == len(others)-2; last {
			if p.Safe || !errors.As(err, &qe) || p.Voting != 2 || p.Healthy != 1 {
				t.Fatalf("removing %s with %s down and %d members: %s; removal error %v", victim, down, len(members), p.Reason(), err)
			}
			continue
		}
		if !p.Safe || err != nil || p.Voting != len(members)-1 || p.Healthy != len(members)-2 {
			t.Fatalf("removing %s with %s down and %d members: %s; removal error %v", victim, down, len(members), p.Reason(), err)
		}
	}
	if n := len(mustMembers(t, ctx, c, tc.nodes)); n != 3 {
		t.Fatalf("%d members left, want 3", n)
	}
}
