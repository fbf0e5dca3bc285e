package rollout

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/etcd"
)

// TestModelCheck checks the decision core exhaustively over a small abstract
// control plane (DESIGN.md, "Compound faults"): every initial state with at
// most two faults, every step Next takes from there, applied by a small world
// model, until the run ends. Each step is checked for safety (quorum, one
// healthy machine, never the last machine, the right victim), each refusal
// against what KCP's own rules would do (no dead end), and each run for
// convergence within a bound.
//
// The model is deterministic — faults are permanent, joins and deletions
// always progress — so each state has one successor, and a run is a path;
// the visited set (memo) shares the paths' common tails.
func TestModelCheck(t *testing.T) {
	start := time.Now()
	c := &mcChecker{memo: map[mcState]mcOutcome{}, violations: map[string]*mcViolation{}, runs: map[string]int{}}
	initial := mcInitialStates()
	for _, st := range initial {
		c.run(st)
	}
	elapsed := time.Since(start)
	t.Logf("model check: %d initial states, %d states explored, %d transitions, in %s",
		len(initial), len(c.memo), c.transitions, elapsed.Round(time.Millisecond))
	t.Logf("runs: %s", mcCounts(c.runs))
	c.logRefusals(t)
	c.report(t)
}

// The abstract state. Everything here is a small value type, so a state is
// comparable and serves as the visited set's key.

// mcFault is the one permanent thing wrong with a machine.
type mcFault uint8

const (
	fNone          mcFault = iota
	fMemberStopped         // etcd member present, not healthy (a dead member stays dead)
	fMemberMissing         // node, but no etcd member named after it
	fLearner               // member started, never promoted
	fAPIDown               // kube-apiserver static pod not Ready
	fNodeDown              // node not Ready
	fNoNode                // never provisioned: no node, no member
	fMHC                   // a MachineHealthCheck condemned it (components healthy)
	fAlarm                 // an alarm (NOSPACE) on its member
	// fNoNodeRef: a node and a healthy voting member, but no nodeRef, and
	// no node found by its providerID either (the engine looks, as KCP's
	// tryGetEtcdMemberName does). KCP would then delete and release it
	// without removing its member — no progress the yardstick counts; the
	// tool takes the one member named after no machine's node for its own
	// when that is unambiguous (OwnedMember), and refuses otherwise.
	fNoNodeRef
	mcFaults // the number of faults, for the enumeration
)

var mcFaultNames = [...]string{"", "memberStopped", "memberMissing", "learner", "apiDown", "nodeDown", "noNode", "mhc", "alarm", "noNodeRef"}

// mcJoin is how far a machine the run created has come; a machine that is
// there from the start has joined (its faults, if any, are permanent).
type mcJoin uint8

const (
	joinDone    mcJoin = iota
	joinNoNode         // created, not provisioned yet
	joinUnnamed        // node up, etcd member added as a learner, not started
	joinLearner        // member started (named), not yet promoted
)

var mcJoinNames = [...]string{"", "joining:noNode", "joining:unnamed", "joining:learner"}

// mcNextJoin is the stage a join reaches on each AwaitJoin.
var mcNextJoin = [...]mcJoin{joinNoNode: joinUnnamed, joinUnnamed: joinLearner, joinLearner: joinDone}

// mcDel is a machine's deletion stage. Every machine carries the kcp-cleanup
// hook, so a deletion always stops at it.
type mcDel uint8

const (
	delNone     mcDel = iota
	delDraining       // deleting, being drained
	delAtHook         // Deleting=True, WaitingForPreTerminateHook, only kcp-cleanup left
)

var mcDelNames = [...]string{"", "draining", "atHook"}

type mcMachine struct {
	outdated bool
	fault    mcFault
	join     mcJoin
	del      mcDel
	// named is the machine `replace` names, or one --replace-unhealthy
	// condemned (Target.Condemned): a flag, not a name, because names follow
	// the machines' positions, which shift as machines go.
	named bool
	// broken is a machine the run found broken before it took over and
	// does not replace (Target.Broken, set by Admit): it is never waited on
	// as a join.
	broken bool
	// mark is the cluster.x-k8s.io/delete-machine annotation.
	mark bool
}

// mcExtra is an etcd member no machine owns.
type mcExtra uint8

const (
	extraNone    mcExtra = iota
	extraStarted         // named after a node that is gone: never reachable, never healthy
	extraUnnamed         // a learner that never started
)

var mcExtraNames = [...]string{"none", "started", "unnamed"}

type mcVerb uint8

const (
	verbUpgrade          mcVerb = iota // machines outdated
	verbScale                          // to another replica count
	verbReplace                        // replace the named machine
	verbReplaceUnhealthy               // upgrade --replace-unhealthy
)

var mcVerbNames = [...]string{"upgrade", "scale", "replace", "upgrade+replace-unhealthy"}

// mcMaxMachines bounds the machines: scale 7 → 5 is the most there are.
const mcMaxMachines = 8

type mcState struct {
	replicas, surge int8
	verb            mcVerb
	n               int8
	m               [mcMaxMachines]mcMachine // in creation order: m[i] is machine "m<i>"
	extra           mcExtra
	// remediation is KCP's remediation-in-progress annotation, which the run
	// sets when it deletes a broken or MachineHealthCheck-condemned machine
	// to replace it, and clears when it creates the next machine.
	remediation bool
}

func (st mcState) machines() []mcMachine { return st.m[:st.n] }

// hasNode: the machine has a nodeRef, the one way the tool sees its node.
func (m mcMachine) hasNode() bool {
	return m.join != joinNoNode && m.fault != fNoNode && m.fault != fNoNodeRef
}

// ownsMember: the machine has an etcd member KCP would find for it (by its
// nodeRef, or by its node's providerID: tryGetEtcdMemberName).
func (m mcMachine) ownsMember() bool {
	return m.voting() || m.fault == fLearner || m.join == joinLearner
}

// voting: a started, promoted member.
func (m mcMachine) voting() bool {
	return m.join == joinDone && m.fault != fNoNode && m.fault != fMemberMissing && m.fault != fLearner
}

func (m mcMachine) healthyVoter() bool {
	return m.voting() && m.fault != fMemberStopped && m.fault != fAlarm
}

// allHealthy: node Ready, static pods Ready, a healthy voting member. A
// MachineHealthCheck's verdict is not a component's health.
func (m mcMachine) allHealthy() bool {
	return m.healthyVoter() && m.hasNode() && m.fault != fNodeDown && m.fault != fAPIDown
}

// condemned: to be replaced before anything else (Condemned's abstract twin).
func (m mcMachine) condemned() bool { return m.del == delNone && (m.named || m.fault == fMHC) }

// remediating: condemned and broken or condemned by a MachineHealthCheck
// (Remediating's abstract twin): its deletion is a remediation.
func (m mcMachine) remediating() bool {
	return m.condemned() && (m.fault != fNone || m.join != joinDone)
}

func (st mcState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "r%d s%d %s |", st.replicas, st.surge, mcVerbNames[st.verb])
	for i, m := range st.machines() {
		parts := []string{"cur"}
		if m.outdated {
			parts[0] = "out"
		}
		for _, p := range []string{mcFaultNames[m.fault], mcJoinNames[m.join], mcDelNames[m.del]} {
			if p != "" {
				parts = append(parts, p)
			}
		}
		if m.named && st.verb == verbReplace {
			parts = append(parts, "replace")
		} else if m.named {
			parts = append(parts, "condemned")
		}
		if m.broken {
			parts = append(parts, "known-broken")
		}
		if m.mark {
			parts = append(parts, "delete-annotation")
		}
		fmt.Fprintf(&b, " m%d:%s", i, strings.Join(parts, ","))
	}
	fmt.Fprintf(&b, " | extra:%s", mcExtraNames[st.extra])
	if st.remediation {
		b.WriteString(" | remediation-in-progress")
	}
	return b.String()
}

// Initial states.

// mcInitialStates enumerates every control plane with at most two faults —
// a machine's fault, the delete-machine annotation and an extra member each
// count as one — at most one machine deleting and at least one not, for each
// replica count, surge and verb. Machines are interchangeable but for their
// creation order, which Next only uses to break ties, so each multiset of
// machine descriptors is enumerated once, in descriptor order.
func mcInitialStates() []mcState {
	var out []mcState
	for _, replicas := range []int8{1, 3, 5} {
		for _, surge := range []int8{0, 1} {
			if surge == 0 && replicas < 3 {
				continue
			}
			for verb := verbUpgrade; verb <= verbReplaceUnhealthy; verb++ {
				counts := []int8{replicas}
				if verb == verbScale {
					counts = []int8{replicas + 2}
					if replicas > 2 {
						counts = append(counts, replicas-2)
					}
				}
				alphabet := mcAlphabet(verb)
				for _, n := range counts {
					for extra := extraNone; extra <= extraUnnamed; extra++ {
						st := mcState{replicas: replicas, surge: surge, verb: verb, n: n, extra: extra}
						budget := 2
						if extra != extraNone {
							budget--
						}
						mcMultisets(alphabet, int(n), 0, budget, 1, st, 0, &out)
					}
				}
			}
		}
	}
	return out
}

// mcAlphabet is every machine descriptor a verb starts with: upgrades start
// with machines outdated or up to date (some replaced already); a scale and a
// replace with machines up to date; a replace names one machine.
func mcAlphabet(verb mcVerb) []mcMachine {
	var alphabet []mcMachine
	for _, outdated := range []bool{true, false} {
		if !outdated || verb == verbUpgrade || verb == verbReplaceUnhealthy {
			for f := fNone; f < mcFaults; f++ {
				for d := delNone; d <= delAtHook; d++ {
					for _, mark := range []bool{false, true} {
						for _, named := range []bool{false, true} {
							if named && verb != verbReplace {
								continue
							}
							alphabet = append(alphabet, mcMachine{outdated: outdated, fault: f, del: d, mark: mark, named: named})
						}
					}
				}
			}
		}
	}
	return alphabet
}

// mcMultisets fills st.m[i:] with descriptors from alphabet[from:] in
// nondecreasing order (one ordering per multiset), within the fault budget,
// with at most deleting machines deleting; it appends each complete state.
func mcMultisets(alphabet []mcMachine, n, i, budget, deleting int, st mcState, from int, out *[]mcState) {
	if i == n {
		named, alive, learners := 0, 0, 0
		for _, m := range st.machines() {
			if m.named {
				named++
			}
			if m.del == delNone {
				alive++
			}
			if m.fault == fLearner {
				learners++
			}
		}
		if st.extra == extraUnnamed {
			learners++
		}
		// A replace names exactly one machine; a control plane whose every
		// machine is deleting is being torn down, not rolled; etcd admits
		// one learner at a time, and a running etcd has a voting member.
		voters, _ := st.etcdWithout(-1)
		if alive > 0 && (st.verb != verbReplace || named == 1) && learners <= 1 && voters > 0 {
			*out = append(*out, st)
		}
		return
	}
	for j := from; j < len(alphabet); j++ {
		m := alphabet[j]
		cost := 0
		if m.fault != fNone {
			cost++
		}
		if m.mark {
			cost++
		}
		d := 0
		if m.del != delNone {
			d = 1
		}
		if cost > budget || d > deleting {
			continue
		}
		st.m[i] = m
		mcMultisets(alphabet, n, i+1, budget-cost, deleting-d, st, j, out)
	}
}

// The snapshot builder.

// snapshot builds the real Snapshot and Target the abstract state stands for,
// with world (next_test.go): machine m<i> on node n<i>, member id i+1.
func (st mcState) snapshot() (*Snapshot, Target) {
	specs := make([]machineSpec, st.n)
	for i, m := range st.machines() {
		sp := machineSpec{outdated: m.outdated, deleting: m.del != delNone, preTermOK: m.del == delAtHook, deleteMark: m.mark}
		switch m.join {
		case joinNoNode:
			sp.noNode = true
		case joinUnnamed:
			sp.unnamed = true
		case joinLearner:
			sp.learner = true
		}
		switch m.fault {
		case fMemberStopped:
			sp.unhealthy = true
		case fMemberMissing:
			sp.noMember = true
		case fLearner:
			sp.learner = true
		case fAPIDown:
			sp.apiDown = true
		case fNodeDown:
			sp.nodeDown = true
		case fNoNode, fNoNodeRef:
			sp.noNode = true
		case fMHC:
			sp.mhc = true
		case fAlarm:
			sp.alarm = true
		}
		specs[i] = sp
	}
	s := world(specs...)
	s.CP.KCP.Spec.Replicas = ptr.To(int32(st.replicas))
	t := Target{Operation: Operation(strings.TrimSuffix(mcVerbNames[st.verb], "+replace-unhealthy")), Replicas: int32(st.replicas), MaxSurge: int32(st.surge)}
	for i, m := range st.machines() {
		name := fmt.Sprintf("m%d", i)
		if m.fault == fNoNodeRef {
			// Its member, named after its node, which no nodeRef names yet;
			// its provider ID, which names no node the engine could find.
			s.Members = append(s.Members, etcd.Member{ID: uint64(i + 1), Name: fmt.Sprintf("n%d", i), Healthy: true})
			s.CP.Machines[name].Spec.ProviderID = fmt.Sprintf("sim://n%d", i)
		}
		if m.named {
			if st.verb == verbReplace {
				t.Replace = name
			} else {
				t.Condemned = append(t.Condemned, name)
			}
		}
		if m.broken {
			t.Broken = append(t.Broken, name)
		}
	}
	if st.remediation {
		// KCP's RemediationData, begun now: after every machine's creation,
		// so no machine is taken for its replacement.
		if s.CP.KCP.Annotations == nil {
			s.CP.KCP.Annotations = map[string]string{}
		}
		s.CP.KCP.Annotations[controlplanev1.RemediationInProgressAnnotation] = Remediation{Machine: "m-remediated", Timestamp: metav1.NewTime(s.Now)}.Marshal()
	}
	switch st.extra {
	case extraStarted:
		s.Members = append(s.Members, etcd.Member{ID: 99, Name: "gone-node"})
	case extraUnnamed:
		s.Members = append(s.Members, etcd.Member{ID: 98, Learner: true})
	}
	// As etcd.Client.Members reads them: a member with alarms or not started
	// is not healthy, and exactly one healthy voter leads when there is one.
	// The model does not track leadership: the oldest leads (the one a
	// rollout deletes first, so the hook's leadership move is exercised).
	leader := false
	for i := range s.Members {
		member := &s.Members[i]
		member.Healthy = member.Healthy && len(member.Alarms) == 0 && member.Started()
		member.Leader = !leader && member.HealthyVoter()
		leader = leader || member.Leader
	}
	return s, t
}

func (st mcState) index(m *clusterv1.Machine) int {
	if m == nil {
		return -1
	}
	i, err := strconv.Atoi(strings.TrimPrefix(m.Name, "m"))
	if err != nil || i >= int(st.n) {
		return -1
	}
	return i
}

// The world model.

// Ends of a run.
const (
	endDone    = "done"
	endRefused = "refused"
	// endStuck: a wait that never ends (a join with a permanent fault); the
	// run gives up when its timeout expires, as a refusal.
	endStuck = "stuck"
	endLoop  = "loop"
	// endOdd: a step this model does not expect (SyncMachines: machines are
	// always in sync here).
	endOdd = "unexpected"
)

// apply is the step's effect on the world, or the run's end; recorded says
// that a Delete records KCP's remediation-in-progress, as the executor does.
func (st mcState) apply(step Step, recorded bool) (mcState, string) {
	i := st.index(step.Machine)
	switch step.Action {
	case Done:
		return st, endDone
	case Refuse:
		// Faults do not heal here, so a Transient refusal ends the run too.
		return st, endRefused
	case Create:
		if st.n == mcMaxMachines {
			return st, endOdd
		}
		st.m[st.n] = mcMachine{join: joinNoNode}
		st.n++
		st.remediation = false
		return st, ""
	case AwaitJoin:
		if i < 0 || st.m[i].join == joinDone {
			return st, endStuck // a permanent fault: the join never completes
		}
		st.m[i].join = mcNextJoin[st.m[i].join]
		return st, ""
	case Delete:
		if i < 0 {
			return st, endOdd
		}
		// As the executor records it (recordRemediation, RemediationRecord):
		// a remediation whose replacement is still to come.
		st.remediation = st.remediation || recorded
		st.m[i].del, st.m[i].named = delDraining, false
		return st, ""
	case AwaitDeletion:
		if i < 0 || st.m[i].del != delDraining {
			return st, endStuck
		}
		st.m[i].del = delAtHook
		return st, ""
	case ServeCleanupHook:
		// Its member is removed, the hook released, and the machine goes
		// with its node.
		if i < 0 {
			return st, endOdd
		}
		copy(st.m[i:], st.m[i+1:st.n])
		st.n--
		st.m[st.n] = mcMachine{}
		return st, ""
	case RemoveStaleMember:
		st.extra = extraNone
		return st, ""
	}
	return st, endOdd
}

// brokenBesides reports whether a machine other than skip, not deleting, not
// condemned and joined, has a fault: KCP's preflight checks then hold every
// add and delete but a remediation's.
func (st mcState) brokenBesides(skip int) bool {
	for i, m := range st.machines() {
		if i != skip && m.del == delNone && !m.condemned() && m.join == joinDone && m.fault != fNone {
			return true
		}
	}
	return false
}

// The checks' abstract etcd: quorum of voting members, counted here
// independently of etcd.Project.

// etcdWithout counts the voting members and the healthy ones, skip's left out
// (-1 for none). The extra started member votes and is never healthy.
func (st mcState) etcdWithout(skip int) (voters, healthy int) {
	for i, m := range st.machines() {
		if i == skip || !m.voting() {
			continue
		}
		voters++
		if m.healthyVoter() {
			healthy++
		}
	}
	if st.extra == extraStarted {
		voters++
	}
	return voters, healthy
}

func mcQuorum(voters, healthy int) bool { return voters > 0 && healthy >= voters/2+1 }

// healthyBesides reports whether a machine other than skip, not deleting, has
// all its components healthy.
func (st mcState) healthyBesides(skip int) bool {
	for i, m := range st.machines() {
		if i != skip && m.del == delNone && m.allHealthy() {
			return true
		}
	}
	return false
}

// pendingBesides reports whether a member other than skip's is not yet
// voting: a learner, or a member not started (KCP counts both as learners).
func (st mcState) pendingBesides(skip int) bool {
	for i, m := range st.machines() {
		if i != skip && (m.join == joinUnnamed || m.join == joinLearner || m.fault == fLearner) {
			return true
		}
	}
	return st.extra == extraUnnamed
}

// kcpEtcdHealthy is KCP's targetEtcdClusterHealthy without skip's member:
// quorum of the voting members left, and no learner (KCP waits for a learner
// to be promoted before any change). Unlike KCP, a member no machine owns
// counts as unhealthy (KCP assumes it healthy without alarms): it is
// unreachable, and the model's etcd is the real one.
func (st mcState) kcpEtcdHealthy(skip int) bool {
	return !st.pendingBesides(skip) && mcQuorum(st.etcdWithout(skip))
}

// kcpProgress says whether KCP v1.14.2's own rules (DESIGN.md, "Compound
// faults") would make progress from st, and how: the yardstick a refusal is
// judged by. A refusal where KCP would also stand still is acceptable.
func (st mcState) kcpProgress() (bool, string) {
	// reconcileEtcdMembers: a member no machine owns goes once every machine
	// has a node; a named one only with KCP's etcd check passing without it.
	// An unnamed one waits while a node is young (KCP's 20 s grace); the tool
	// holds instead while a node has no member (StaleMembers), and the model
	// cannot tell a member that never starts from one starting, so that hold
	// is taken as KCP's.
	if st.extra != extraNone && !slices.ContainsFunc(st.machines(), func(m mcMachine) bool { return !m.hasNode() }) {
		nodeStarting := slices.ContainsFunc(st.machines(), func(m mcMachine) bool { return m.fault == fMemberMissing })
		voters, healthy := st.etcdWithout(-1)
		switch {
		case st.extra == extraUnnamed && !nodeStarting && mcQuorum(voters, healthy):
			return true, "KCP would remove the unnamed etcd member no machine owns"
		case st.extra == extraStarted && !st.pendingBesides(-1) && mcQuorum(voters-1, healthy):
			return true, "KCP would remove the etcd member no machine owns: etcd keeps quorum without it"
		}
	}
	for i, m := range st.machines() {
		switch m.del {
		case delDraining:
			return true, fmt.Sprintf("the Machine controller would drain m%d", i)
		case delAtHook:
			// reconcilePreTerminateHook: the target set is every machine but
			// the deleting one; one with all components healthy, and, when
			// the deleting machine has a node (a member name), KCP's etcd
			// check without its member.
			if m.ownsMember() && !m.hasNode() {
				// KCP finds no member for it and would release it with its member
				// left in the cluster (fNoNodeRef): not progress to count.
				return false, ""
			}
			if st.healthyBesides(i) && (!m.ownsMember() || st.kcpEtcdHealthy(i)) {
				return true, fmt.Sprintf("KCP would serve m%d's pre-terminate hook: another machine is healthy and etcd keeps quorum without its member", i)
			}
			return false, ""
		}
	}
	// A machine to create (scale up, or the replacement of a remediated
	// machine), none joining or provisioning: KCP's preflight checks want
	// every machine healthy, or while a remediation is in progress
	// (checkHealthinessWhileRemediationInProgress) one machine with working
	// components and etcd's quorum with the new member counted unhealthy.
	//
	// Stricter than KCP: no add beside an etcd alarm. NOSPACE stops etcd's
	// writes cluster-wide, so the new machine's node could not even register;
	// clearing the alarm is the operator's (etcdctl alarm disarm).
	// Stricter than KCP too: a machine without a nodeRef is a join still
	// under way, waited on (for --provision-timeout), where KCP's relaxed
	// check under a remediation would add beside it.
	alarm := slices.ContainsFunc(st.machines(), func(m mcMachine) bool { return m.fault == fAlarm })
	if int(st.n) < int(st.replicas) && !alarm && !slices.ContainsFunc(st.machines(), func(m mcMachine) bool { return m.join != joinDone || !m.hasNode() }) {
		all := !slices.ContainsFunc(st.machines(), func(m mcMachine) bool { return !m.allHealthy() || m.fault == fMHC })
		voters, healthy := st.etcdWithout(-1)
		if voters == 1 {
			healthy++
		}
		if (all || st.remediation && st.healthyBesides(-1)) && !st.pendingBesides(-1) && mcQuorum(voters+1, healthy) {
			return true, "KCP would create a machine"
		}
	}
	// Remediation (remediation.go): no other remediation in progress, more
	// than one machine, none provisioning but the condemned
	// (HasHealthyMachineStillProvisioning), and canSafelyRemediateMachine.
	// The machines the run was asked to replace count as a
	// MachineHealthCheck's.
	if st.remediation || st.n <= 1 || slices.ContainsFunc(st.machines(), func(m mcMachine) bool { return !m.hasNode() && !m.condemned() }) {
		return false, ""
	}
	if i := st.kcpPick(); i >= 0 && !(st.m[i].ownsMember() && !st.m[i].hasNode()) && st.healthyBesides(i) && (!st.m[i].ownsMember() || st.kcpEtcdHealthy(i)) {
		return true, fmt.Sprintf("KCP would remediate m%d: another machine is healthy and etcd keeps quorum without its member", i)
	}
	return false, ""
}

// kcpPick is the condemned machine KCP remediates first
// (getMachineToBeRemediated): one without a node, then one whose etcd member
// is not healthy, then one with a component down, then the oldest; -1 for
// none. KCP tries that one only.
func (st mcState) kcpPick() int {
	rank := func(m mcMachine) int {
		switch {
		case !m.hasNode():
			return 0
		case !m.healthyVoter():
			return 1
		case !m.allHealthy():
			return 2
		}
		return 3
	}
	pick := -1
	for i, m := range st.machines() {
		if m.condemned() && (pick < 0 || rank(m) < rank(st.m[pick])) {
			pick = i
		}
	}
	return pick
}

// The checker.

type mcOutcome struct {
	end   string
	steps int // transitions from this state to the run's end
}

type mcViolation struct {
	kind, state, step string
	count             int
}

type mcRefusal struct {
	state   mcState
	message string
	// before: refused before the run took over (Admit): nothing was
	// changed, and the message names the command to run instead.
	before bool
}

type mcChecker struct {
	memo        map[mcState]mcOutcome
	transitions int
	// runs counts the runs from the initial states by how they end.
	runs       map[string]int
	violations map[string]*mcViolation
	refusals   []mcRefusal
}

// mcRefusalChecks judge each refused state (a run's end without Done, or a
// wait that never ends). Each returns a violation kind and detail, or ""
// when the refusal passes. (A function, not a variable: mcForward walks runs
// that refuse in turn.)
func mcRefusalChecks() []func(c *mcChecker, r mcRefusal) (kind, detail string) {
	return []func(c *mcChecker, r mcRefusal) (kind, detail string){mcDeadEnd, mcForward}
}

// mcReplaceHint finds the machine a refusal's replace command names.
var mcReplaceHint = regexp.MustCompile(`kubectl cp-rollout replace demo m([0-9]+)`)

// mcForward: a refusal before the run took over changes nothing and names
// the commands that move forward — `replace` of the machine at fault, and
// for upgrade and scale the same run with --replace-unhealthy. Each,
// decided on the same control plane, must be admitted in turn, and its run
// is walked and checked as any other.
func mcForward(c *mcChecker, r mcRefusal) (string, string) {
	st := r.state
	if !r.before {
		return "", ""
	}
	var forward []mcState
	if m := mcReplaceHint.FindStringSubmatch(r.message); m != nil {
		i, _ := strconv.Atoi(m[1])
		forward = append(forward, r.state.replacing(i))
	}
	if strings.Contains(r.message, "--replace-unhealthy") {
		st := r.state
		st.verb = verbReplaceUnhealthy
		forward = append(forward, st)
	}
	if len(forward) == 0 {
		// With no machine keeping its components working no command can
		// add or remove one (KCP's rule too): the refusal says what to do
		// by hand instead.
		if !st.healthyBesides(-1) && strings.Contains(r.message, "by hand") {
			return "", ""
		}
		return "dead end", "the refusal names no command that moves forward"
	}
	for _, st := range forward {
		st, _, err := c.admit(st)
		if err != nil {
			return "dead end", fmt.Sprintf("its command (%s) is refused in turn: %v", st, err)
		}
		c.walk(st)
	}
	return "", ""
}

// replacing is the control plane of st as `replace` of machine i finds it
// after a refusal that changed nothing: the spec as it was (every machine up
// to date, KCP's replicas the machines there), machine i named.
func (st mcState) replacing(i int) mcState {
	st.verb, st.replicas = verbReplace, 0
	for j := range st.machines() {
		st.m[j].outdated, st.m[j].named, st.m[j].broken = false, j == i, false
		if st.m[j].del == delNone {
			st.replicas++
		}
	}
	return st
}

// mcDeadEnd: a run that stops where KCP's rules would make progress. A refusal
// before the run took over names the command to run instead; whether that
// one gets anywhere is for a check of its own.
func mcDeadEnd(_ *mcChecker, r mcRefusal) (string, string) {
	if r.before {
		return "", ""
	}
	if ok, how := r.state.kcpProgress(); ok {
		return "dead end", how
	}
	return "", ""
}

func (c *mcChecker) violate(kind string, st mcState, step string, detail string) {
	// Deduplicated by kind and step (machine names and numbers aside) within
	// a verb: the same step may be right for one verb and wrong for another.
	key := kind + "|" + mcVerbNames[st.verb] + "|" + mcDigits.ReplaceAllString(step, "#")
	if v, ok := c.violations[key]; ok {
		v.count++
		return
	}
	if detail != "" {
		step += " — " + detail
	}
	c.violations[key] = &mcViolation{kind: kind, state: st.String(), step: step, count: 1}
}

var mcDigits = regexp.MustCompile(`[0-9]+`)

func mcDescribe(step Step) string {
	s := string(step.Action)
	if step.Machine != nil {
		s += " " + step.Machine.Name
	}
	return s + ": " + step.Reason
}

// run checks one run from an initial state: the run's own admission before
// it takes over (Admit, as Prepare decides), then its steps.
func (c *mcChecker) run(st mcState) {
	st, admitted, err := c.admit(st)
	if err != nil {
		c.runs["refused before taking over"]++
		c.refused(mcRefusal{state: st, message: err.Error(), before: true})
		return
	}
	if !admitted {
		return // nothing broken: the same run as the upgrade's
	}
	steps, end := c.walk(st)
	c.runs[end]++
	switch {
	case end == endLoop:
		c.violate("loop", st, "the run comes back to a state it was in", "")
	case steps > mcBound(st):
		c.violate("no convergence", st, fmt.Sprintf("%d steps to %s, bound %d", steps, end, mcBound(st)), "")
	}
}

// admit is the run's admission (Admit) of st: st with what it condemned and
// what it found broken marked, or Admit's refusal. admitted is false for an
// --replace-unhealthy run that finds nothing broken (the upgrade's run).
func (c *mcChecker) admit(st mcState) (_ mcState, admitted bool, err error) {
	s, t := st.snapshot()
	r := Request{Operation: t.Operation, Replace: t.Replace, ReplaceUnhealthy: st.verb == verbReplaceUnhealthy}
	target, err := Admit(s, r, t, false)
	if err != nil {
		return st, false, err
	}
	if st.verb == verbReplaceUnhealthy && len(target.Condemned) == 0 {
		return st, false, nil
	}
	for i := range st.machines() {
		name := fmt.Sprintf("m%d", i)
		st.m[i].named = st.m[i].named || slices.Contains(target.Condemned, name)
		st.m[i].broken = slices.Contains(target.Broken, name)
	}
	return st, true, nil
}

// mcBound is the convergence bound: every step counted, waits included.
func mcBound(st mcState) int { return 6*int(max(st.replicas, st.n)) + 10 }

// walk follows the run from st to its end, deciding and checking each state
// not yet visited, and returns the steps to the end and how it ended.
func (c *mcChecker) walk(st mcState) (int, string) {
	var path []mcState
	onPath := map[mcState]bool{}
	var end mcOutcome
	for {
		if o, ok := c.memo[st]; ok {
			end = o
			break
		}
		if onPath[st] {
			end = mcOutcome{end: endLoop}
			break
		}
		onPath[st] = true
		path = append(path, st)
		next, ending := c.decide(st)
		if ending != "" {
			end = mcOutcome{end: ending}
			path = path[:len(path)-1]
			c.memo[st] = end
			break
		}
		c.transitions++
		st = next
	}
	for i := len(path) - 1; i >= 0; i-- {
		end.steps++
		c.memo[path[i]] = end
	}
	return end.steps, end.end
}

// decide takes Next's step in st, checks it, and applies it.
func (c *mcChecker) decide(st mcState) (mcState, string) {
	s, t := st.snapshot()
	step := Next(context.Background(), s, t)
	c.checkStep(st, s, step)
	recorded := false
	if step.Action == Delete {
		_, recorded = RemediationRecord(s, t, step.Machine)
	}
	next, end := st.apply(step, recorded)
	switch end {
	case endRefused, endStuck:
		msg := step.Reason
		if end == endStuck {
			msg = "never ends: " + mcDescribe(step)
		}
		c.refused(mcRefusal{state: st, message: msg})
	case endOdd:
		c.violate("unexpected step", st, mcDescribe(step), "")
	}
	return next, end
}

func (c *mcChecker) refused(r mcRefusal) {
	c.refusals = append(c.refusals, r)
	for _, check := range mcRefusalChecks() {
		if kind, detail := check(c, r); kind != "" {
			c.violate(kind, r.state, "refuse: "+r.message, detail)
		}
	}
}

// mcCounts renders counts by key, in key order.
func mcCounts(counts map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%d %s", counts[k], k))
	}
	return strings.Join(parts, ", ")
}

// checkStep is the safety of one step, judged on the abstract state. Only a
// machine with a voting member changes etcd's quorum as it goes: one without
// leaves etcd as it was, quorum or not.
func (c *mcChecker) checkStep(st mcState, s *Snapshot, step Step) {
	i := st.index(step.Machine)
	what := mcDescribe(step)
	switch step.Action {
	case Delete:
		if i < 0 {
			return
		}
		if st.n <= 1 {
			c.violate("deletes the last machine", st, what, "")
		}
		if st.m[i].voting() && !mcQuorum(st.etcdWithout(i)) {
			c.violate("quorum", st, what, "etcd would be left without quorum once its member is removed")
		}
		if !st.healthyBesides(i) {
			c.violate("no healthy machine left", st, what, "no other machine would have all components healthy")
		}
		// KCP's rules: no second remediation until the first one's
		// replacement exists; a delete beside a broken machine only of a
		// broken or condemned one (preflightChecks exclude the victim alone).
		if st.remediation && st.n < st.replicas {
			c.violate("against KCP's rules", st, what, "a remediation is in progress: its replacement comes first")
		}
		if !st.m[i].remediating() && st.brokenBesides(i) {
			c.violate("against KCP's rules", st, what, "another machine is broken: only a remediation may delete now")
		}
		c.checkVictim(st, i, what)
	case ServeCleanupHook:
		if i < 0 {
			return
		}
		if st.m[i].voting() && !mcQuorum(st.etcdWithout(i)) {
			c.violate("quorum", st, what, "etcd would be left without quorum once its member is removed")
		}
		if !st.healthyBesides(i) {
			c.violate("no healthy machine left", st, what, "no other machine would have all components healthy")
		}
		// The executor (serveCleanupHook) must be able to do what Next chose.
		m := step.Machine
		if _, ok, _ := OwnedMember(s, m); ok && !IsLast(s, m) {
			if err := SafeToRemove(s, m); err != nil {
				c.violate("hook the executor refuses", st, what, err.Error())
			} else if Leads(s, m) && len(LeaderCandidates(s, m)) == 0 {
				c.violate("hook the executor refuses", st, what, "its member leads and no healthy voting member can take over")
			}
		}
	case Create:
		for _, m := range st.machines() {
			if m.join != joinDone || m.fault == fLearner {
				c.violate("create during a join", st, what, "a machine is still joining, or a member not yet voting holds etcd's learner slot")
				break
			}
		}
		if st.extra == extraUnnamed {
			c.violate("create during a join", st, what, "an unnamed learner holds etcd's learner slot")
		}
		// As KCP assumes: the new member is unhealthy until it is — but for
		// one member, which could never grow to two otherwise.
		voters, healthy := st.etcdWithout(-1)
		if voters == 1 {
			healthy++
		}
		if !mcQuorum(voters+1, healthy) {
			c.violate("quorum", st, what, "etcd would lose quorum while the new member joins")
		}
		if !st.healthyBesides(-1) {
			c.violate("no healthy machine left", st, what, "no machine has all components healthy")
		}
		if st.brokenBesides(-1) && !(st.remediation && st.n < st.replicas) {
			c.violate("against KCP's rules", st, what, "a machine is broken: only a remediated machine's replacement may be added now")
		}
	case RemoveStaleMember:
		voters, healthy := st.etcdWithout(-1)
		if st.extra == extraStarted {
			voters--
		}
		if !mcQuorum(voters, healthy) {
			c.violate("quorum", st, what, "etcd would be left without quorum")
		}
	case Done:
		// A machine broken before the run that the run does not replace
		// (replace X beside a broken Y) is the next run's: Done names it.
		ok := int(st.n) == int(st.replicas) && st.extra == extraNone
		for _, m := range st.machines() {
			ok = ok && !m.outdated && (m.allHealthy() || m.broken) && !m.condemned() && m.del == delNone
		}
		if !ok {
			c.violate("false done", st, what, "the control plane does not match the target")
		}
	}
}

// checkVictim: the machine deleted is one to be replaced — a condemned one
// while there is one (KCP remediates before it rolls out; the user named
// it), else an outdated one or one marked for deletion (KCP's order) — or,
// with nothing to replace, any (a scale down).
func (c *mcChecker) checkVictim(st mcState, victim int, what string) {
	v := st.m[victim]
	condemned, outdated := false, false
	for _, m := range st.machines() {
		condemned = condemned || m.condemned()
		outdated = outdated || m.del == delNone && m.outdated
	}
	switch {
	case condemned && !v.condemned():
		c.violate("wrong victim", st, what, "a machine not to be replaced goes while another is condemned")
	case !condemned && outdated && !v.outdated && !v.mark:
		c.violate("wrong victim", st, what, "an up-to-date machine goes while outdated ones remain")
	}
}

// logRefusals summarises the refusals met, most frequent first: what a run
// answers in states it cannot (or should not) roll.
func (c *mcChecker) logRefusals(t *testing.T) {
	counts := map[string]int{}
	example := map[string]mcRefusal{}
	for _, r := range c.refusals {
		key := mcDigits.ReplaceAllString(r.message, "#")
		if len(key) > 160 {
			key = key[:160] + "…"
		}
		if counts[key] == 0 {
			example[key] = r
		}
		counts[key]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b)) })
	t.Logf("%d refusals, %d kinds; the most frequent:", len(c.refusals), len(keys))
	for _, k := range keys[:min(len(keys), 8)] {
		t.Logf("  %5d× %s  (e.g. %s)", counts[k], k, example[k].state)
	}
}

// report fails the test with the violations, up to 20 — the most frequent
// of each kind first, so that no kind crowds the others out — and their
// counts per kind.
func (c *mcChecker) report(t *testing.T) {
	if len(c.violations) == 0 {
		return
	}
	byKind := map[string][]*mcViolation{}
	perKind := map[string]int{}
	for _, v := range c.violations {
		byKind[v.kind] = append(byKind[v.kind], v)
		perKind[v.kind] += v.count
	}
	kinds := slices.Sorted(maps.Keys(byKind))
	for _, k := range kinds {
		slices.SortFunc(byKind[k], func(a, b *mcViolation) int {
			return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.step, b.step))
		})
	}
	var shown []*mcViolation
	for round := 0; len(shown) < min(20, len(c.violations)); round++ {
		for _, k := range kinds {
			if round < len(byKind[k]) && len(shown) < 20 {
				shown = append(shown, byKind[k][round])
			}
		}
	}
	slices.SortStableFunc(shown, func(a, b *mcViolation) int { return cmp.Compare(a.kind, b.kind) })
	t.Errorf("model check: %d distinct violations (%s)", len(c.violations), mcCounts(perKind))
	for _, v := range shown {
		t.Errorf("[%s] %d×\n    state: %s\n    step:  %s", v.kind, v.count, v.state, v.step)
	}
}
