package etcd

import (
	"fmt"
	"strings"
)

// Change is what a quorum projection assumes happens to a member.
type Change int

const (
	// Remove: the member leaves the cluster (MemberRemove); quorum shrinks with it.
	Remove Change = iota
	// Stop: the member stays in the cluster but does not answer (its machine is drained,
	// rebooted or deleted before its member is removed); quorum stays the same.
	Stop
	// Add: a new voting member joins. Like KCP, assume the worst, that it never becomes
	// healthy, unless the cluster has a single member (1 to 2 could never happen otherwise).
	Add
)

func (c Change) String() string {
	switch c {
	case Remove:
		return "removing"
	case Stop:
		return "stopping"
	case Add:
		return "adding"
	}
	return fmt.Sprintf("Change(%d)", int(c))
}

// Projection is the answer to "after this change, does etcd keep quorum given the health
// of the other members?", counted over voting members only.
type Projection struct {
	Change Change
	// Member is the member changed; zero for Add.
	Member Member
	// Voting is the number of voting members after the change, Healthy how many of them
	// are expected healthy, Quorum how many must be.
	Voting, Healthy, Quorum int
	// Unhealthy and Pending name the voting members that are not healthy and the members
	// not yet voting (learners, members not started), the change's member excluded.
	Unhealthy, Pending []string
	// Safe is the verdict.
	Safe bool
}

// Project projects the change to member id over members (as returned by Client.Members).
// Like KCP, it refuses while any other member is a learner or has not started yet: such a
// member is a join in progress, and it is wiser to let it finish before the next change.
// It does no I/O, so guards can call it on a snapshot.
func Project(members []Member, change Change, id uint64) Projection {
	p := Projection{Change: change}
	if change == Add {
		p.Voting++
		if countVoting(members) > 1 {
			p.Unhealthy = append(p.Unhealthy, "the new member (assumed unhealthy until it is)")
		} else {
			p.Healthy++
		}
	}
	for _, m := range members {
		if change != Add && m.ID == id {
			p.Member = m
			if change == Stop && m.Voting() {
				p.Voting++
				p.Unhealthy = append(p.Unhealthy, m.String()+" (stopped)")
			}
			continue
		}
		switch {
		case !m.Voting():
			p.Pending = append(p.Pending, m.String())
		case m.Healthy:
			p.Voting++
			p.Healthy++
		default:
			p.Voting++
			p.Unhealthy = append(p.Unhealthy, m.String())
		}
	}
	p.Quorum = p.Voting/2 + 1
	p.Safe = p.Voting > 0 && p.Healthy >= p.Quorum && len(p.Pending) == 0
	return p
}

func countVoting(members []Member) int {
	n := 0
	for _, m := range members {
		if m.Voting() {
			n++
		}
	}
	return n
}

// Reason explains the verdict in a sentence, for progress output and refusals.
func (p Projection) Reason() string {
	subject := "a new member"
	if p.Change != Add {
		subject = "member " + p.Member.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s leaves %d of %d voting members healthy, quorum needs %d", p.Change, subject, p.Healthy, p.Voting, p.Quorum)
	if len(p.Unhealthy) > 0 {
		fmt.Fprintf(&b, "; unhealthy: %s", strings.Join(p.Unhealthy, ", "))
	}
	if len(p.Pending) > 0 {
		fmt.Fprintf(&b, "; not yet voting: %s (wait for promotion)", strings.Join(p.Pending, ", "))
	}
	return b.String()
}

// QuorumError is a change refused because the projection says etcd would lose quorum.
type QuorumError struct {
	Projection Projection
}

func (e *QuorumError) Error() string {
	return "etcd quorum at risk: " + e.Projection.Reason()
}
