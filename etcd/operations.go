package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Refusals; errors.Is finds them inside a *MemberError.
var (
	ErrMemberNotFound = errors.New("no such member in the cluster")
	ErrNotVoting      = errors.New("member is a learner or has not started; it cannot lead")
	ErrUnhealthy      = errors.New("member is not healthy")
	ErrNoLeader       = errors.New("the cluster has no leader")
	ErrLastMember     = errors.New("refusing to remove the last member of the cluster")
	ErrIsLeader       = errors.New("member is the leader; move leadership away first")
	ErrNoOtherMember  = errors.New("no healthy voting member other than this one to act through")
)

// MoveLeader makes member to the leader, if it is not already. The request goes to the
// current leader (etcd refuses it elsewhere); the target must be a healthy voting member.
// It returns once the target reports itself leader.
func (c *Client) MoveLeader(ctx context.Context, nodes []Node, to uint64) error {
	return c.moveLeader(ctx, nodes, 0, to)
}

// ForwardLeadership moves leadership from member from to member to, and does nothing when
// from is not the leader (any more), as KCP does before it removes a member: leadership
// only moves when the member leaving holds it.
func (c *Client) ForwardLeadership(ctx context.Context, nodes []Node, from, to uint64) error {
	if from == 0 {
		return errors.New("etcd: forward leadership: no member to forward from")
	}
	return c.moveLeader(ctx, nodes, from, to)
}

func (c *Client) moveLeader(ctx context.Context, nodes []Node, from, to uint64) error {
	var err error
	for attempt := 0; attempt < c.cfg.Attempts; attempt++ {
		if attempt > 0 {
			if werr := sleep(ctx, c.cfg.Backoff<<(attempt-1)); werr != nil {
				return errors.Join(werr, err)
			}
		}
		var again bool
		again, err = c.moveLeaderOnce(ctx, nodes, from, to)
		if err == nil || !again {
			return err
		}
	}
	return err
}

// moveLeaderOnce resolves the leader afresh and asks it to step aside, if it is from (or
// whoever it is, when from is 0); again reports that leadership changed underneath and a
// new attempt may succeed.
func (c *Client) moveLeaderOnce(ctx context.Context, nodes []Node, from, to uint64) (again bool, err error) {
	members, _, err := c.members(ctx, nodes)
	if err != nil {
		return false, err
	}
	leader, hasLeader := Leader(members)
	if hasLeader && (leader.ID == to || from != 0 && leader.ID != from) {
		return false, nil
	}
	target, ok := MemberByID(members, to)
	switch {
	case !ok:
		return false, &MemberError{Op: "move leadership", ID: to, Err: ErrMemberNotFound}
	case !target.Voting():
		return false, &MemberError{Op: "move leadership", Member: target.Name, ID: to, Node: target.Node, Err: ErrNotVoting}
	case !target.Healthy:
		return false, &MemberError{Op: "move leadership", Member: target.Name, ID: to, Node: target.Node, Err: fmt.Errorf("%w: %v", ErrUnhealthy, target.Errors)}
	}
	if !hasLeader {
		return true, &MemberError{Op: "move leadership", Member: target.Name, ID: to, Node: target.Node, Err: ErrNoLeader}
	}
	if leader.Node == "" {
		return false, &MemberError{Op: "move leadership", Member: leader.Name, ID: leader.ID, Err: fmt.Errorf("leader cannot be reached: %v", leader.Errors)}
	}
	mc, err := c.conn(nodeNamed(nodes, leader.Node))
	if err != nil {
		return false, err
	}
	what := "move leadership to " + target.String()
	err = mc.call(ctx, what, func(ctx context.Context) error {
		_, err := mc.api.MoveLeader(ctx, to)
		return err
	})
	if err != nil {
		var me *MemberError
		if errors.As(err, &me) {
			me.Member, me.ID = leader.Name, leader.ID
		}
		// The leader changed between listing and asking (etcd: "not leader"); ask the new one.
		return errors.Is(err, rpctypes.ErrNotLeader), err
	}
	return false, c.awaitLeader(ctx, nodes, target)
}

// awaitLeader confirms the transfer from the target's own point of view: etcd answers
// MoveLeader once the old leader has stepped down, and a caller acting next must find the
// new leader in place.
func (c *Client) awaitLeader(ctx context.Context, nodes []Node, target Member) error {
	mc, err := c.conn(nodeNamed(nodes, target.Node))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	for {
		st, err := mc.status(ctx)
		if err == nil && st.Leader == target.ID {
			return nil
		}
		if werr := sleep(ctx, 20*time.Millisecond); werr != nil {
			if err == nil {
				err = fmt.Errorf("leader is still %x", st.Leader)
			}
			return &MemberError{Op: "confirm leadership", Member: target.Name, ID: target.ID, Node: target.Node, Err: errors.Join(werr, err)}
		}
	}
}

// RemoveMember removes member id from the cluster. It lists the members afresh and refuses
// to remove the last member, the leader (move leadership first) or a member whose removal
// the quorum projection rejects (a *QuorumError). A member that is already gone is not an
// error, so a rollout can resume.
//
// The request goes to a healthy voting member other than the one removed, in the order of
// nodes. etcd judges a membership change on the member that receives it, counting only the
// peers it has been connected to for five seconds (HealthInterval; mayRemoveMember in
// etcd's server.go), so a member that has just joined — every replacement — refuses it
// ("unhealthy cluster") while the members that were there before accept it. That refusal,
// or any other transient failure, moves on to the next member at once; only when every
// member has refused does the call wait, polling, for the refusal to lift. held is how
// long etcd kept the change back that way, from the first round of refusals to the
// last: time the cluster imposed, which the caller reports apart from its own.
func (c *Client) RemoveMember(ctx context.Context, nodes []Node, id uint64) (held time.Duration, err error) {
	members, _, err := c.members(ctx, nodes)
	if err != nil {
		return 0, err
	}
	target, ok := MemberByID(members, id)
	if !ok {
		return 0, nil
	}
	describe := func(err error) error {
		return &MemberError{Op: "remove member", Member: target.Name, ID: id, Node: target.Node, Err: err}
	}
	if len(members) == 1 {
		return 0, describe(ErrLastMember)
	}
	if p := Project(members, Remove, id); !p.Safe {
		return 0, describe(&QuorumError{Projection: p})
	}
	if target.Leader {
		return 0, describe(ErrIsLeader)
	}
	var through []Node
	for _, n := range nodes {
		if m, ok := memberOn(members, n.Name); ok && m.ID != id && m.Voting() && m.Healthy {
			through = append(through, n)
		}
	}
	if len(through) == 0 {
		return 0, describe(ErrNoOtherMember)
	}
	what := "remove member " + target.String()
	var last *memberConn
	var firstHeld, lastHeld time.Time
	err = retry(ctx, &c.cfg, func(ctx context.Context) error {
		var err error
		for _, n := range through {
			if last, err = c.conn(n); err != nil {
				return err
			}
			err = last.attempt(ctx, func(ctx context.Context) error {
				_, err := last.api.MemberRemove(ctx, id)
				return err
			})
			if err == nil || errors.Is(err, rpctypes.ErrMemberNotFound) {
				// ErrMemberNotFound: an earlier attempt got through before its answer was
				// lost, or someone else removed it meanwhile; either way it is gone.
				return nil
			}
			if !transient(ctx, err) {
				return err
			}
		}
		if rpctypes.Error(err) == rpctypes.ErrUnhealthy {
			if firstHeld.IsZero() {
				firstHeld = time.Now()
			}
			lastHeld = time.Now()
		}
		return err // each member refused or failed for now: retry waits, then tries them again
	}, func(err error) error {
		if last == nil {
			return err
		}
		return last.fail(what, err)
	})
	if err == nil {
		c.forget(target.Node)
	}
	return lastHeld.Sub(firstHeld), err
}

// memberOn is the started member on node name.
func memberOn(members []Member, name string) (Member, bool) {
	for _, m := range members {
		if m.Node == name {
			return m, true
		}
	}
	return Member{}, false
}

func nodeNamed(nodes []Node, name string) Node {
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	return Node{Name: name}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
