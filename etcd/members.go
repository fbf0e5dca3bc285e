package etcd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Member is one etcd member as the rollout sees it: identity from the member list, health
// from asking the member itself, alarms from the cluster.
type Member struct {
	ID uint64
	// Name is the member name, which kubeadm sets to the node name. It is empty until the
	// member has started for the first time.
	Name string
	// Node is the node the member was probed on; empty when no node carries its name.
	Node       string
	PeerURLs   []string
	ClientURLs []string
	// Learner is true for a raft learner and for a member that has not started yet (no
	// name): neither votes, and neither may receive leadership.
	Learner bool
	// Leader is true for the member the cluster currently follows.
	Leader bool
	// Healthy is true when the member answered, sees a leader, and reports no alarms and no
	// errors. Healthy says nothing about voting; see Voting.
	Healthy bool

	Version          string
	DBSize           int64
	DBSizeInUse      int64
	RaftTerm         uint64
	RaftIndex        uint64
	RaftAppliedIndex uint64
	// Alarms are the alarms raised for this member, e.g. NOSPACE or CORRUPT.
	Alarms []string
	// Errors explain why the member is not healthy.
	Errors []string
}

// Started reports whether the member has ever run; until then etcd lists it without a name.
func (m Member) Started() bool { return m.Name != "" }

// Voting reports whether the member counts towards quorum.
func (m Member) Voting() bool { return m.Started() && !m.Learner }

// HealthyVoter reports what a replacement must reach before the rollout moves on (and
// what a leadership target must be): started, promoted, and healthy.
func (m Member) HealthyVoter() bool { return m.Voting() && m.Healthy }

// String names the member for messages.
func (m Member) String() string { return describeMember(m.Name, m.ID) }

// Members lists the cluster's members with their health and the current leader. It asks
// the members on nodes in order until a voting one answers, then probes each member on its
// own node. An error means no member could list the cluster; an unreachable member is not
// an error but an unhealthy Member.
func (c *Client) Members(ctx context.Context, nodes []Node) ([]Member, error) {
	members, _, err := c.members(ctx, nodes)
	return members, err
}

// members is Members that also returns the connection the list came through.
func (c *Client) members(ctx context.Context, nodes []Node) ([]Member, *memberConn, error) {
	if len(nodes) == 0 {
		return nil, nil, errors.New("etcd: no control-plane nodes to reach members on")
	}
	list, alarms, via, err := c.listThroughAny(ctx, nodes)
	if err != nil {
		return nil, nil, err
	}

	byName := map[string]Node{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	members := make([]Member, len(list.Members))
	statuses := make([]*clientv3.StatusResponse, len(list.Members))
	var wg sync.WaitGroup
	for i, pb := range list.Members {
		members[i] = memberFrom(pb)
		m := &members[i]
		for _, a := range alarms.Alarms {
			if a.MemberID == m.ID && a.Alarm != etcdserverpb.AlarmType_NONE {
				m.Alarms = append(m.Alarms, a.Alarm.String())
			}
		}
		if !m.Started() {
			m.Errors = append(m.Errors, "not started yet")
			continue
		}
		node, ok := byName[m.Name]
		if !ok {
			m.Errors = append(m.Errors, fmt.Sprintf("no control-plane node named %s to reach it on", m.Name))
			continue
		}
		m.Node = node.Name
		wg.Go(func() {
			mc, err := c.conn(node)
			if err == nil {
				statuses[i], err = mc.status(ctx)
			}
			if err != nil {
				m.Errors = append(m.Errors, err.Error())
			}
		})
	}
	wg.Wait()

	leader, leaderErr := leaderOf(members, statuses)
	for i := range members {
		m := &members[i]
		st := statuses[i]
		m.Leader = leaderErr == nil && m.ID == leader
		if leaderErr != nil && m.Started() {
			// Nothing may be removed or moved while nobody knows who leads: every
			// member is unhealthy until the members agree again (an election
			// settles within seconds; the loop waits, then refuses).
			m.Errors = append(m.Errors, "leader unknown: "+leaderErr.Error())
		}
		if st == nil {
			continue
		}
		if st.Header != nil && st.Header.MemberId != m.ID {
			// Whatever answered on this node is not the listed member (a stale pod, a
			// reused address): its numbers would be someone else's.
			m.Errors = append(m.Errors, fmt.Sprintf("node %s answers as member %x", m.Node, st.Header.MemberId))
			continue
		}
		m.Version = st.Version
		m.DBSize = st.DbSize
		m.DBSizeInUse = st.DbSizeInUse
		m.RaftTerm = st.RaftTerm
		m.RaftIndex = st.RaftIndex
		m.RaftAppliedIndex = st.RaftAppliedIndex
		m.Errors = append(m.Errors, st.Errors...)
		if st.Leader == 0 {
			m.Errors = append(m.Errors, "sees no leader")
		}
		m.Healthy = len(m.Errors) == 0 && len(m.Alarms) == 0
	}
	slices.SortFunc(members, func(a, b Member) int {
		// Started members by name, then the ones not started yet by ID.
		if a.Started() != b.Started() {
			if a.Started() {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
	})
	return members, via, nil
}

// listThroughAny lists members and alarms through the first member that answers, trying
// each node once per round so that a member that is down costs one dial timeout, not a
// round of retries. A learner refuses MemberList ("rpc not supported for learner"), which
// also just moves on to the next node.
func (c *Client) listThroughAny(ctx context.Context, nodes []Node) (*clientv3.MemberListResponse, *clientv3.AlarmResponse, *memberConn, error) {
	var (
		list   *clientv3.MemberListResponse
		alarms *clientv3.AlarmResponse
		via    *memberConn
	)
	err := retry(ctx, &c.cfg, func(ctx context.Context) error {
		var errs oneLine
		var distrusted error
		again := false
		for _, node := range nodes {
			mc, err := c.conn(node)
			if err == nil {
				err = mc.attempt(ctx, func(ctx context.Context) error {
					var err error
					if list, err = mc.api.MemberList(ctx); err != nil {
						return err
					}
					alarms, err = mc.api.AlarmList(ctx)
					return err
				})
				if err == nil {
					via = mc
					return nil
				}
				again = again || transient(ctx, err)
				err = mc.fail("list members", err)
				var u *UntrustedError
				if distrusted == nil && errors.As(err, &u) {
					distrusted = err
				}
			}
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
		if again {
			return &roundError{errs}
		}
		if distrusted != nil {
			// Say that, and only that: the other nodes' failures would bury it.
			return distrusted
		}
		return errs
	}, func(err error) error {
		var re *roundError
		if errors.As(err, &re) {
			err = re.err
		}
		return fmt.Errorf("no etcd member could list the cluster: %w", err)
	})
	return list, alarms, via, err
}

// oneLine is the failures of a round over all nodes, joined on one line (errors.Join
// would put each on a line of its own, and the tool's messages are one line).
type oneLine []error

func (e oneLine) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e oneLine) Unwrap() []error { return e }

// roundError marks a round over all nodes in which some node failed transiently.
type roundError struct{ err error }

func (e *roundError) Error() string { return e.err.Error() }

func memberFrom(pb *etcdserverpb.Member) Member {
	return Member{
		ID:         pb.ID,
		Name:       pb.Name,
		PeerURLs:   pb.PeerURLs,
		ClientURLs: pb.ClientURLs,
		Learner:    pb.IsLearner || pb.Name == "",
	}
}

// leaderOf identifies the leader as KCP does, from the leader ID the members report:
// among the members that answered (each as itself), those in the highest raft term
// must all name the same leader, and it must be a known, started, voting member. A
// member cut off from the others may still believe in an older term's leader, which is
// why only the highest term counts. Anything else is an error: "unknown" is never
// "none", or a member would be removed without its leadership being moved first.
func leaderOf(members []Member, statuses []*clientv3.StatusResponse) (uint64, error) {
	var term, leader uint64
	disagree := false
	for i, st := range statuses {
		if st == nil || st.Header == nil || st.Header.MemberId != members[i].ID || st.Leader == 0 {
			continue
		}
		switch {
		case st.RaftTerm > term:
			term, leader, disagree = st.RaftTerm, st.Leader, false
		case st.RaftTerm == term && st.Leader != leader:
			disagree = true
		}
	}
	switch {
	case leader == 0:
		return 0, errors.New("no member names a leader")
	case disagree:
		return 0, fmt.Errorf("members in raft term %d name different leaders", term)
	}
	m, ok := MemberByID(members, leader)
	if !ok || !m.Voting() {
		return 0, fmt.Errorf("the leader members name, %x, is not a voting member", leader)
	}
	return leader, nil
}

// Leader returns the leader among members, if one is known.
func Leader(members []Member) (Member, bool) {
	for _, m := range members {
		if m.Leader {
			return m, true
		}
	}
	return Member{}, false
}

// MemberByID finds a member by ID.
func MemberByID(members []Member, id uint64) (Member, bool) {
	for _, m := range members {
		if m.ID == id {
			return m, true
		}
	}
	return Member{}, false
}

// MemberByName finds a started member by name (kubeadm: the node name).
func MemberByName(members []Member, name string) (Member, bool) {
	for _, m := range members {
		if name != "" && m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}
