package rollout

import (
	"context"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// Action is the kind of the one next step.
type Action string

const (
	// Done: the control plane matches the target.
	Done Action = "done"
	// Refuse: the control plane is in a state no step may be taken in.
	Refuse Action = "refuse"
	// AwaitDeletion: a machine is deleting; wait for its pre-terminate stage
	// or for it to be gone.
	AwaitDeletion Action = "await-deletion"
	// ServeCleanupHook: a deleting machine waits on the kcp-cleanup hook; move
	// leadership off its member if needed, remove the member, remove the hook.
	ServeCleanupHook Action = "serve-cleanup-hook"
	// AwaitJoin: a new machine is coming up; wait until it is healthy.
	AwaitJoin Action = "await-join"
	// Create: create one new control-plane machine.
	Create Action = "create"
	// Delete: delete one control-plane machine (the victim).
	Delete Action = "delete"
	// RemoveStaleMember: remove an etcd member that no machine owns (left by
	// a replacement that failed mid-join and was deleted), as KCP's
	// reconcileEtcdMembers does.
	RemoveStaleMember Action = "remove-stale-member"
	// SyncMachines: push the KubeadmControlPlane's in-place-mutable fields
	// (deletion timeouts, labels, annotations, ...) to machines that differ,
	// as KCP's syncMachines would were it not paused.
	SyncMachines Action = "sync-machines"
)

// The steps a run reports besides Next's: each is an event's action name
// (docs/output.md lists them as a contract), never a decision of Next's.
const (
	AwaitLock       Action = "await-lock"
	Pause           Action = "pause"
	Resume          Action = "resume"
	RemoveOrphan    Action = "remove-orphan"
	Uncordon        Action = "uncordon"
	PrepareWorkload Action = "prepare-workload"
	// The gates between machines (gates.go): a new machine's DaemonSets,
	// one pass of the operator's --gate, the --soak after them.
	AwaitDaemonSets Action = "await-daemonsets"
	Gate            Action = "gate"
	Soak            Action = "soak"
	Drain           Action = "drain"
	MoveLeader      Action = "move-leader"
	RemoveMember    Action = "remove-member"
	Release         Action = "release"
	// Unhealthy waits for a machine that was healthy to recover (a Refuse
	// that may pass).
	Unhealthy    Action = "unhealthy"
	HandBack     Action = "handback"
	AwaitKCP     Action = "await-kcp"
	AwaitWorkers Action = "await-workers"
	// Read only waits: it is reported while the clusters cannot be read.
	Read          Action = "read"
	RecordFailure Action = "record-failure"
)

// Waits reports whether a step of action a only waits, changing nothing:
// the steps named await-<what>, a pass of the operator's gate (a check, as
// far as the run knows), and the soak after a machine joined.
func (a Action) Waits() bool {
	return strings.HasPrefix(string(a), "await-") || a == Gate || a == Soak
}

// Step is Next's answer: one action and why.
type Step struct {
	Action Action
	// Machine is the machine acted on or waited for.
	Machine *clusterv1.Machine
	// Member is the etcd member RemoveStaleMember removes.
	Member etcd.Member
	// FailureDomain is where Create places the new machine.
	FailureDomain string
	// Reason is a sentence for people: what and why.
	Reason string
	// Err explains a Refuse, marked with its exit code.
	Err error
	// Transient marks a Refuse caused by a machine's health, which may
	// recover by itself: the loop waits on it a while before it gives up.
	Transient bool
	// Warning, on Done, names what the run leaves that is not its to
	// mend: machines broken beside the ones it replaced.
	Warning string
}

// Next decides the one next step for s towards t. It is pure: it reads only s
// and t, so plan, dry runs, status and the loop agree by construction.
//
// The order is the safety argument: first refuse broken states, then push
// the paused KCP's in-place-mutable fields to machines that differ (a
// deleting machine's drain timeout most of all), then finish any deletion in
// progress, then wait for any machine still joining, then remove an etcd
// member no machine owns, and only then create or delete exactly one
// machine — with every machine but the condemned healthy, or, for a
// remediation (a broken or MachineHealthCheck-condemned machine replaced, as
// KCP remediates), with what KCP's remediation checks ask: one machine with
// working components and etcd quorum after the step (SafeToRemediate,
// SafeToAdd), and no other step until a remediated machine's replacement
// exists.
//
// A member no machine owns comes before any create or delete: while it is
// there the quorum projection refuses both (it counts as a join in progress),
// and an unnamed one holds etcd's only learner slot, which the next join
// needs. It comes after joins and waits for deletions: until a machine has
// a node and a member, a member without a machine may yet be its
// (StaleMembers holds), and KCP too removes such members only once no machine
// is provisioning. It comes before a pre-terminate hook is served, whose
// health check of what stays such a member would fail for good.
func Next(ctx context.Context, s *Snapshot, t Target) Step {
	if err := MissingPieces(s); err != nil {
		return refuse(err)
	}
	if err := InPlaceUpdate(s); err != nil {
		return refuse(err)
	}
	// Before any wait on a deletion: a drain timeout raised on the paused
	// KCP to unstick a drain reaches the deleting machine only this way.
	if step, ok := syncStep(s); ok {
		return step
	}
	if deleting := Deleting(s); deleting.Len() > 0 {
		// As KCP does: a deleting machine without the kcp-cleanup hook goes
		// first — its member may stop without being removed, so no other
		// member may be removed until it is gone.
		if unhooked := deleting.Filter(collections.Not(HasCleanupHook)); unhooked.Len() > 0 {
			m := unhooked.OldestDeletionTimestamp()
			return Step{Action: AwaitDeletion, Machine: m, Reason: deletionReason(m)}
		}
		m := deleting.OldestDeletionTimestamp()
		if WaitingForCleanup(m) {
			// A member no machine owns would fail the health check below for
			// good, and would wait for this deletion to end: it goes first —
			// unless its removal must wait (for this machine's own learner,
			// say), when the deletion goes on.
			if step, ok := removeStale(s); ok && step.Action == RemoveStaleMember {
				return step
			}
			// What stays must keep quorum and one machine with working
			// components before m's member goes, as KCP's
			// reconcilePreTerminateHook checks — not every other machine
			// healthy, which two faults at once never are. A blip there (a
			// member restarting, a probe failing) is waited on like any
			// machine that went bad, not refused at once.
			if err := SafeToRelease(s, m); err != nil {
				step := refuse(exitcode.Unsafef("not releasing machine %s: %w", m.Name, err))
				step.Machine, step.Transient = m, true
				return step
			}
			return Step{Action: ServeCleanupHook, Machine: m,
				Reason: fmt.Sprintf("machine %s waits on its pre-terminate hook: remove its etcd member, then release it", m.Name)}
		}
		return Step{Action: AwaitDeletion, Machine: m, Reason: deletionReason(m)}
	}

	machines := s.CP.Machines
	if machines.Len() == 0 {
		// KCP would create the first machine with an init configuration; a
		// rollout only ever joins machines to a running control plane.
		return refuse(exitcode.Unsafef("cluster %s has no control-plane machine to roll", s.CP.Cluster.Name))
	}
	if err := TargetUnchanged(s, t); err != nil {
		return refuse(err)
	}
	condemned := Condemned(s, t)
	remediating := Remediating(s, condemned)
	count := int32(machines.Len())
	// From the delete of a broken machine until its replacement exists, that
	// replacement is the one step (KCP's remediation-in-progress: "another
	// remediation is already in progress"), and it may join beside broken
	// machines (checkHealthinessWhileRemediationInProgress).
	inProgress := RemediationInProgress(s) && count < t.Replicas
	// KCP remediates a condemned machine before it waits on any join
	// (reconcileUnhealthyMachines comes first): with stacked etcd, one that
	// owns no member (no node, or a node whose member is gone) goes at once
	// — its deletion touches no member, so no join need finish first.
	memberless := remediating.Filter(func(m *clusterv1.Machine) bool {
		_, ok, err := OwnedMember(s, m)
		return s.EtcdManaged && err == nil && !ok
	})
	if memberless.Len() > 0 && !inProgress {
		if step := remove(ctx, s, t, memberless, "machine(s) that own no etcd member to replace: delete first, as KCP remediates"); step.Action == Delete {
			return step
		}
	}
	remediation := remediating.Len() > 0 || inProgress
	var bad []*clusterv1.Machine
	var wentBad *clusterv1.Machine // the first that went bad during the run
	for _, m := range machines.SortedByCreationTimestamp() {
		err := Problem(s, m)
		if err == nil || condemned.Has(m) {
			continue
		}
		known := slices.Contains(t.Broken, m.Name)
		if Replacing(s)(m) && !known {
			if wentBad != nil && !remediation {
				// An older machine went bad: that is what stops the run
				// (after its grace), not a join that may wait on it.
				return wentBadStep(s, wentBad)
			}
			return Step{Action: AwaitJoin, Machine: m, Reason: err.Error()}
		}
		bad = append(bad, m)
		if !known && wentBad == nil {
			wentBad = m
		}
	}
	// A remediation goes on while a member no machine owns must wait (for
	// a learner about to go, say): the quorum projections count that member
	// as down, as KCP's targetEtcdClusterHealthy does.
	if step, ok := removeStale(s); ok && (step.Action == RemoveStaleMember || !remediation) {
		return step
	}
	outdated := NeedingRollout(s, t)
	if count == t.Replicas && outdated.Len() == 0 {
		return Step{Action: Done, Reason: fmt.Sprintf("%d control-plane machines, all up to date", count), Warning: stillBroken(s, bad)}
	}
	// Any step but a remediation's needs every machine but the condemned
	// healthy, as KCP's preflight checks do.
	var unhealthy *Step
	if len(bad) > 0 {
		step := wentBadStep(s, bad[0])
		unhealthy = &step
	} else if err := Healthy(s, condemned.UnsortedList()...); err != nil {
		step := refuse(err)
		unhealthy = &step
	}
	if unhealthy != nil && !remediation {
		return *unhealthy
	}

	lostOnes := lost(s, condemned)
	addable := SafeToAdd(s) == nil
	switch {
	case inProgress:
		return create(ctx, s, t, fmt.Sprintf("%d of %d control-plane machines: the replacement of a remediated machine", count, t.Replicas))
	case unhealthy != nil:
		// Beside a broken machine KCP adds only a remediated machine's
		// replacement: the broken machine to replace goes first.
		return remove(ctx, s, t, remediating, fmt.Sprintf("%d machine(s) to replace while %s: delete first, as KCP remediates",
			outdated.Len(), strings.TrimPrefix(unhealthy.Reason, "machine ")))
	case count < t.Replicas && (addable || lostOnes.Len() == 0):
		return create(ctx, s, t, fmt.Sprintf("%d of %d control-plane machines", count, t.Replicas))
	case count > t.Replicas:
		return remove(ctx, s, t, outdated, fmt.Sprintf("%d control-plane machines, %d wanted", count, t.Replicas))
	case t.MaxSurge > 0 && (addable || lostOnes.Len() == 0):
		return create(ctx, s, t, fmt.Sprintf("%d machine(s) to replace, surge first", outdated.Len()))
	case lostOnes.Len() > 0:
		// As KCP's remediation does: a machine whose etcd member is lost goes
		// before its replacement comes. Its removal lowers the quorum the
		// new member would otherwise have to help reach.
		return remove(ctx, s, t, lostOnes, fmt.Sprintf("%d machine(s) to replace; machine(s) %s lost their etcd member: delete first",
			outdated.Len(), strings.Join(machineNames(lostOnes.SortedByCreationTimestamp()), ", ")))
	default:
		return remove(ctx, s, t, outdated, fmt.Sprintf("%d machine(s) to replace, no spare capacity: delete first", outdated.Len()))
	}
}

// wentBadStep refuses m, a machine that was up and went bad, as Transient:
// it may recover (a failed probe, a restarting pod), and the loop waits a
// little before it gives up.
func wentBadStep(s *Snapshot, m *clusterv1.Machine) Step {
	step := refuse(Problem(s, m))
	step.Machine, step.Transient = m, true
	return step
}

// stillBroken names, for a Done step, the machines that are broken and were
// not this run's to replace, with the command that replaces the one to go
// first (MostBroken); "" for none.
func stillBroken(s *Snapshot, bad []*clusterv1.Machine) string {
	if len(bad) == 0 {
		return ""
	}
	first := MostBroken(s, collections.FromMachines(bad...))
	return fmt.Sprintf("machine(s) %s still broken (%v): %s", strings.Join(machineNames(bad), ", "), Problem(s, first), replaceHint(s, first))
}

// lost selects the machines among condemned whose etcd member is not a
// healthy voter — or that have none, or no node yet: the quorum projection
// counts such a member against every add, and KCP remediates a machine
// without a node first (pickMachineToBeRemediated).
func lost(s *Snapshot, condemned collections.Machines) collections.Machines {
	return condemned.Filter(func(m *clusterv1.Machine) bool {
		if !s.EtcdManaged {
			return nodeName(m) == ""
		}
		member, ok := MemberOf(s, m)
		return !ok || !member.HealthyVoter()
	})
}

// removeStale is the step that removes the first member no machine owns
// (StaleMembers), or its refusal when that would cost quorum; false when
// there is none.
func removeStale(s *Snapshot) (Step, bool) {
	stale := StaleMembers(s)
	if len(stale) == 0 {
		return Step{}, false
	}
	member := stale[0]
	if err := SafeToRemoveMember(s, member); err != nil {
		return refuse(err), true
	}
	why := "no machine's node is named " + member.Name
	if !member.Started() {
		why = "a learner that never started, and no machine is joining"
	}
	return Step{Action: RemoveStaleMember, Member: member,
		Reason: fmt.Sprintf("remove etcd member %s, which no control-plane machine owns (%s)", member, why)}, true
}

func refuse(err error) Step {
	return Step{Action: Refuse, Reason: err.Error(), Err: err}
}

func deletionReason(m *clusterv1.Machine) string {
	reason := fmt.Sprintf("machine %s is deleting: waiting until it is gone", m.Name)
	if HasCleanupHook(m) {
		reason = fmt.Sprintf("machine %s is deleting: waiting for its pre-terminate stage (drain, other hooks)", m.Name)
	}
	// The Machine controller says which stage it is in: that is what an
	// operator needs when the wait does not end.
	if c := conditions.Get(m, clusterv1.MachineDeletingCondition); c != nil && c.Status == metav1.ConditionTrue {
		reason += "; the Machine controller reports " + c.Reason
		if msg := strings.Join(strings.Fields(c.Message), " "); msg != "" {
			reason += ": " + msg
		}
	}
	return reason
}

// create places one new machine in the failure domain KCP would pick: the one
// with the fewest up-to-date machines. A machine named for replacement counts
// as outdated there too, so its replacement lands in its domain when the
// domains are otherwise balanced (KCP never rebalances afterwards).
func create(ctx context.Context, s *Snapshot, t Target, why string) Step {
	if err := KeepsWorkingComponents(s, "adding a control-plane machine", nil); err != nil {
		return refuse(err)
	}
	if err := SafeToAdd(s); err != nil {
		return refuse(err)
	}
	view := *s.CP
	view.MachinesNotUpToDate = s.CP.MachinesNotUpToDate.Filter() // a copy to add to
	view.MachinesNotUpToDate.Insert(NeedingRollout(s, t).UnsortedList()...)
	fd, err := view.NextFailureDomainForScaleUp(ctx)
	if err != nil {
		return refuse(err)
	}
	reason := "create a control-plane machine at " + s.CP.KCP.Spec.Version + ": " + why
	if fd != "" {
		reason += " (failure domain " + fd + ")"
	}
	return Step{Action: Create, FailureDomain: fd, Reason: reason}
}

// remove picks the victim among candidates — a condemned machine first, as
// KCP remediates before it rolls out: the most broken of them (MostBroken)
// when they are all broken, else in KCP's scale-down order (Victim) — and
// checks it may go: one other machine keeps working components and etcd
// keeps quorum without its member (SafeToRemediate). Next calls it for a
// victim that is not broken only once every other machine is healthy.
func remove(ctx context.Context, s *Snapshot, t Target, candidates collections.Machines, why string) Step {
	// pool is what the delete-machine annotation may pick from: every
	// machine, unless the step is narrowed to the machines it replaces — a
	// `replace X` never deletes a healthy Y that someone marked.
	pool := s.CP.Machines
	condemned := Condemned(s, t)
	if narrowed := candidates.Filter(inSet(condemned)); narrowed.Len() > 0 {
		candidates, pool = narrowed, narrowed
	}
	var victim *clusterv1.Machine
	if broken := Remediating(s, condemned).Filter(inSet(candidates)); broken.Len() > 0 && broken.Len() == candidates.Len() {
		victim = MostBroken(s, broken)
	} else {
		var err error
		if victim, err = Victim(ctx, s, candidates, pool); err != nil {
			return refuse(err)
		}
	}
	if IsLast(s, victim) {
		return refuse(exitcode.Unsafef("machine %s is the last control-plane machine: it is never deleted", victim.Name))
	}
	if err := SafeToRemediate(s, victim, "deleting machine "+victim.Name); err != nil {
		return refuse(withFirst(s, victim, err))
	}
	return Step{Action: Delete, Machine: victim,
		Reason: fmt.Sprintf("delete machine %s: %s", victim.Name, why)}
}

// withFirst adds to err, a victim's refused removal, the machine to replace
// first when another is broken: the most broken of them (MostBroken), when
// its removal would be allowed — replace X refused because Y's member is
// down names replace Y.
func withFirst(s *Snapshot, victim *clusterv1.Machine, err error) error {
	others := s.CP.Machines.Filter(collections.Not(collections.HasDeletionTimestamp), func(m *clusterv1.Machine) bool {
		return m != nil && m.Name != victim.Name && Problem(s, m) != nil
	})
	if others.Len() == 0 {
		return err
	}
	first := MostBroken(s, others)
	if SafeToRemediate(s, first, "") != nil {
		return err // its removal is refused too: naming it would send the user round in a circle
	}
	return exitcode.Unsafef("%w; machine %s is broken too (%v): %s", err, first.Name, strings.TrimPrefix(Problem(s, first).Error(), "machine "+first.Name+": "), replaceHint(s, first))
}

// Victim picks the machine to delete in KCP's order (scale.go): outdated
// machines marked with the delete-machine annotation; any machine of pool so
// marked; outdated machines with unhealthy components; outdated machines;
// all of pool. Then, among those, the failure domain with the most machines
// (machines outside the current failure domains first), and there the oldest
// machine. "Unhealthy components" is the tool's live Problem: KCP's own
// Machine conditions are frozen while it is paused.
func Victim(ctx context.Context, s *Snapshot, outdated, pool collections.Machines) (*clusterv1.Machine, error) {
	unhealthy := func(m *clusterv1.Machine) bool { return m != nil && Problem(s, m) != nil }
	var eligible collections.Machines
	switch {
	case s.CP.MachineWithDeleteAnnotation(outdated).Len() > 0:
		eligible = s.CP.MachineWithDeleteAnnotation(outdated)
	case s.CP.MachineWithDeleteAnnotation(pool).Len() > 0:
		eligible = s.CP.MachineWithDeleteAnnotation(pool)
	case outdated.Filter(unhealthy).Len() > 0:
		eligible = outdated.Filter(unhealthy)
	case outdated.Len() > 0:
		eligible = outdated
	default:
		eligible = pool
	}
	return s.CP.MachineInFailureDomainWithMostMachines(ctx, eligible)
}

// Replicas returns the KubeadmControlPlane's desired replicas.
func Replicas(s *Snapshot) int32 {
	return ptr.Deref(s.CP.KCP.Spec.Replicas, 1)
}

// inSet selects the machines in set.
func inSet(set collections.Machines) collections.Func {
	return func(m *clusterv1.Machine) bool { return m != nil && set.Has(m) }
}
