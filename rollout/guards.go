package rollout

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/blang/semver/v4"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// The guards: pure functions of one Snapshot. Everything that decides — Next,
// the loop, the hand-over, plan and status — goes through these.
//
// They come in one of two shapes. A check is func(*Snapshot[, *Machine or
// etcd.Member]) error: nil passes, an error refuses, carries its exit code and
// names the machine or member at fault. A selection is a collections.Func
// filter or a query that returns machines (or members), as in CAPI's
// util/collections.

// Deleting returns the control-plane machines being deleted. While there is
// one, no other step starts: its deletion is finished first.
func Deleting(s *Snapshot) collections.Machines {
	return s.CP.Machines.Filter(collections.HasDeletionTimestamp)
}

// NeedingRollout returns the machines to replace: those KCP's own UpToDate
// calls outdated, plus the condemned ones and those the target's own rollout
// criteria make due (Due) — never a deleting machine, which is already going
// (counting it again is what made KCP create a second replacement in CAPI
// issue 2915).
func NeedingRollout(s *Snapshot, t Target) collections.Machines {
	outdated, _ := s.CP.MachinesNeedingRollout()
	extra := Condemned(s, t)
	if due := Due(s, t); due.Len() > 0 {
		extra = extra.DeepCopy()
		extra.Insert(due.UnsortedList()...)
	}
	if extra.Len() > 0 {
		outdated = outdated.DeepCopy()
		outdated.Insert(extra.UnsortedList()...)
	}
	return outdated
}

// Due returns the machines the target's rollout criteria make due, with
// KCP's own filters and the snapshot's fixed now: a restart's cut-off
// (created before it, as spec.rollout.after) and certificates expiring within
// the target's days (as spec.rollout.before). Those live in the target, not
// in the KubeadmControlPlane's spec, which Git owns; so KCP's UpToDate does
// not see them, and after the hand-back it finds the replacements up to
// date. Never a deleting machine: it is already going.
func Due(s *Snapshot, t Target) collections.Machines {
	if t.RolloutAfter.IsZero() && t.CertificatesExpiryDays <= 0 {
		return collections.New()
	}
	now := metav1.NewTime(s.Now)
	return s.CP.Machines.Filter(collections.Not(collections.HasDeletionTimestamp), collections.Or(
		collections.ShouldRolloutAfter(&now, metav1.NewTime(t.RolloutAfter)),
		collections.ShouldRolloutBefore(&now, controlplanev1.KubeadmControlPlaneRolloutBeforeSpec{CertificatesExpiryDays: t.CertificatesExpiryDays}),
	))
}

// Condemned returns the machines to replace before anything else, healthy or
// not: the machine named for replacement, those the run was asked to replace
// because it found them broken (--replace-unhealthy), and those a
// MachineHealthCheck condemned whose remediation KCP's spec.remediation allows
// now (Remediable), which KCP too replaces before any rollout step. A
// condemned machine's ill health holds nothing up: it is about to go, and the
// guards judge the control plane without it. Never a deleting machine: it is
// already going.
func Condemned(s *Snapshot, t Target) collections.Machines {
	named := sets.New(t.Condemned...)
	if t.Replace != "" {
		named.Insert(t.Replace)
	}
	return s.CP.Machines.Filter(collections.Not(collections.HasDeletionTimestamp), func(m *clusterv1.Machine) bool {
		return m != nil && (named.Has(m.Name) || Remediable(s, m))
	})
}

// MHCCondemned reports whether a MachineHealthCheck has condemned m for its
// owner (KCP, or this tool in its stead) to replace, as KCP reads it
// (collections.IsUnhealthyAndOwnerRemediated): HealthCheckSucceeded=False and
// OwnerRemediated=False. A machine the check flagged and then found healthy
// again (HealthCheckSucceeded=True) is not, whatever OwnerRemediated still
// says. The MachineHealthCheck controller keeps writing both while KCP is
// paused.
func MHCCondemned(m *clusterv1.Machine) bool {
	return collections.IsUnhealthyAndOwnerRemediated(m)
}

// Remediable reports whether m is condemned by a MachineHealthCheck
// (MHCCondemned) and KCP's spec.remediation allows its replacement now
// (RemediationFor holds nothing back).
func Remediable(s *Snapshot, m *clusterv1.Machine) bool {
	if !MHCCondemned(m) {
		return false
	}
	_, held := RemediationFor(s, m)
	return held == ""
}

// Remediation is what KCP records of a remediation, in the KubeadmControlPlane's
// remediation-in-progress annotation while the replacement is to come, and
// then in the replacement's remediation-for annotation (KCP's
// RemediationData, whose package, the KCP controller's, would link the
// whole controller into the plugin; TestRemediationIsKCPs holds the two
// together).
type Remediation struct {
	// Machine is the machine remediated.
	Machine string `json:"machine"`
	// Timestamp is when its remediation began.
	Timestamp metav1.Time `json:"timestamp"`
	// RetryCount counts the replacements of replacements that failed
	// within spec.remediation.minHealthyPeriodSeconds.
	RetryCount int `json:"retryCount"`
}

// RemediationFor is the remediation to record when m is deleted to be
// replaced, and why KCP's spec.remediation holds it back now ("" when it
// does not): KCP's checkRetryLimits (CAPI v1.14.2, controlplane/kubeadm/
// reconcilers/kubeadmcontrolplane/remediation.go). A machine that is itself
// the replacement of one remediated less than minHealthyPeriodSeconds ago
// (default 3600) is a retry: it waits out retryPeriodSeconds since that
// remediation, and is not replaced once maxRetry retries are spent.
func RemediationFor(s *Snapshot, m *clusterv1.Machine) (Remediation, string) {
	now := s.Now.UTC()
	next := Remediation{Machine: m.Name, Timestamp: metav1.NewTime(now)}
	last, err := remediationOf(m.Annotations[controlplanev1.RemediationForAnnotation])
	if err != nil || last == nil {
		return next, ""
	}
	spec := s.CP.KCP.Spec.Remediation
	minHealthy := time.Duration(ptr.Deref(spec.MinHealthyPeriodSeconds, controlplanev1.DefaultMinHealthyPeriodSeconds)) * time.Second
	retryPeriod := time.Duration(ptr.Deref(spec.RetryPeriodSeconds, 0)) * time.Second
	lastTime := last.Timestamp.Time
	if lastTime.IsZero() {
		lastTime = now.Add(-2 * max(minHealthy, retryPeriod))
	}
	if !lastTime.Add(minHealthy).After(now) {
		return next, "" // healthy long enough: a new sequence
	}
	next.RetryCount = last.RetryCount
	if lastTime.Add(retryPeriod).After(now) {
		return next, fmt.Sprintf("machine %s replaced a machine remediated at %s, and spec.remediation.retryPeriodSeconds (%s) has not passed since",
			m.Name, lastTime.Format(time.RFC3339), retryPeriod)
	}
	if spec.MaxRetry != nil && next.RetryCount >= int(*spec.MaxRetry) {
		return next, fmt.Sprintf("machine %s replaced a machine remediated at %s, after %d replacements in a row that failed within spec.remediation.minHealthyPeriodSeconds (%s), and spec.remediation.maxRetry is %d",
			m.Name, lastTime.Format(time.RFC3339), next.RetryCount, minHealthy, *spec.MaxRetry)
	}
	next.RetryCount++
	return next, ""
}

// RemediationRecord is KCP's bookkeeping for m, deleted towards t, when m is
// broken or condemned by a MachineHealthCheck (Remediating) and its
// replacement is still to come (no surge machine made it already): the
// KubeadmControlPlane's remediation-in-progress annotation (what, when, which
// retry), which lets the replacement join beside other broken machines
// (RemediationInProgress), passes to the replacement as its remediation-for
// annotation, and tells KCP after the hand-back that a remediation happened
// (its status.lastRemediation, its retry limits). The run writes it as it
// deletes m, and a plan projects it.
func RemediationRecord(s *Snapshot, t Target, m *clusterv1.Machine) (Remediation, bool) {
	if !Remediating(s, Condemned(s, t)).Has(m) || int32(s.CP.Machines.Len()) > t.Replicas {
		return Remediation{}, false
	}
	r, _ := RemediationFor(s, m)
	return r, true
}

// remediationOf parses a remediation annotation's value; nil for none.
func remediationOf(value string) (*Remediation, error) {
	if value == "" {
		return nil, nil
	}
	r := &Remediation{}
	if err := json.Unmarshal([]byte(value), r); err != nil {
		return nil, fmt.Errorf("remediation record %q: %w", value, err)
	}
	return r, nil
}

// Marshal is the annotation value of r.
func (r Remediation) Marshal() string {
	b, _ := json.Marshal(r) // a struct of a string, a time and an int always marshals
	return string(b)
}

// RemediationInProgress reports whether the KubeadmControlPlane records a
// remediation whose replacement is still to come (KCP's
// remediation-in-progress annotation, which KCP, and this tool in its
// stead, sets when it deletes a broken machine to replace it and removes
// when it creates the next machine). While it is there a replacement may
// join a control plane that is not wholly healthy, under KCP's
// checkHealthinessWhileRemediationInProgress (SafeToAdd).
//
// A machine created after the remediation began is its replacement: then the
// annotation is stale (a run stopped between the create and the annotation's
// removal), as KCP's reconcileUnhealthyMachines judges it too.
func RemediationInProgress(s *Snapshot) bool {
	r, err := remediationOf(s.CP.KCP.Annotations[controlplanev1.RemediationInProgressAnnotation])
	if err != nil || r == nil {
		// Unreadable, it relaxes nothing: a replacement then waits for a
		// healthy control plane, as it would without a remediation.
		return false
	}
	for _, m := range s.CP.Machines {
		if m.CreationTimestamp.After(r.Timestamp.Time) {
			return false
		}
	}
	return true
}

// Remediating returns the condemned machines that are broken or condemned by
// a MachineHealthCheck: they are replaced under KCP's remediation rules,
// which other machines' ill health does not hold up as long as one machine
// keeps its components healthy and etcd keeps quorum (SafeToRemediate).
// A condemned machine that is healthy (replace of a sound machine) is
// replaced as any rollout replaces one, with every other machine healthy.
func Remediating(s *Snapshot, condemned collections.Machines) collections.Machines {
	return condemned.Filter(func(m *clusterv1.Machine) bool {
		return m != nil && (MHCCondemned(m) || Problem(s, m) != nil)
	})
}

// Broken returns the machines that came up once (CameUp) and then went bad:
// a Problem now. A rollout that met such a machine would stall on it (it is neither
// joining nor healthy), so a run refuses it before it takes over, naming the
// replace command — or condemns it when asked to. Not broken: a deleting
// machine (it is going), a condemned one (it is to be replaced anyway), a
// machine still coming up (no node, no promoted member: waited on as a join),
// and, when mine is the record of an operation of this tool's in progress, an
// up-to-date machine — the interrupted run's replacement, which the resumed
// run waits on as a join.
func Broken(s *Snapshot, t Target, resuming bool) collections.Machines {
	condemned := Condemned(s, t)
	return s.CP.Machines.Filter(collections.Not(collections.HasDeletionTimestamp), func(m *clusterv1.Machine) bool {
		if m == nil || condemned.Has(m) || Problem(s, m) == nil {
			return false
		}
		return CameUp(s, m) && !(resuming && !s.CP.MachinesNotUpToDate.Has(m))
	})
}

// MissingPieces names a machine whose InfraMachine or KubeadmConfig cannot be
// found. KCP's UpToDate silently counts such a machine as up to date, so the
// rollout refuses instead of trusting that verdict.
func MissingPieces(s *Snapshot) error {
	for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
		if m.DeletionTimestamp != nil {
			continue
		}
		if _, ok := s.CP.InfraResources[m.Name]; !ok {
			return exitcode.Unsafef("machine %s: its %s %s is missing", m.Name, m.Spec.InfrastructureRef.Kind, m.Spec.InfrastructureRef.Name)
		}
		if _, ok := s.CP.KubeadmConfigs[m.Name]; !ok {
			return exitcode.Unsafef("machine %s: its KubeadmConfig %s is missing", m.Name, m.Spec.Bootstrap.ConfigRef.Name)
		}
	}
	return nil
}

// InPlaceUpdate refuses while a machine is being updated in place (CAPI's
// InPlaceUpdates feature): KCP does nothing else until such an update
// completes, and neither may a rollout.
func InPlaceUpdate(s *Snapshot) error {
	updating := s.CP.MachinesToCompleteInPlaceUpdate()
	if updating.Len() == 0 {
		return nil
	}
	m := updating.Oldest()
	return exitcode.Unsafef("machine %s is being updated in place (annotation %s or a pending UpdateMachine hook in %s): wait until the update completes and both are gone",
		m.Name, clusterv1.UpdateInProgressAnnotation, runtimev1.PendingHooksAnnotation)
}

// IsLast reports whether m is the only control-plane machine left.
func IsLast(s *Snapshot, m *clusterv1.Machine) bool {
	return s.CP.Machines.Len() <= 1 && s.CP.Machines.Has(m)
}

// MemberOf returns the etcd member of m (kubeadm names members after nodes).
func MemberOf(s *Snapshot, m *clusterv1.Machine) (etcd.Member, bool) {
	name := nodeName(m)
	if name == "" {
		return etcd.Member{}, false
	}
	for _, member := range s.Members {
		if member.Name == name {
			return member, true
		}
	}
	return etcd.Member{}, false
}

// OwnedMember is the etcd member that goes with m: the one named after its
// node (MemberOf) or, while the Machine controller has not set its nodeRef
// yet, one named after no machine's node — kubeadm's join registers the node
// and joins etcd before the nodeRef is set, and KCP finds that member through
// the node's providerID (tryGetEtcdMemberName). Such a member is m's only
// when m is the one machine without a nodeRef and it the one member named
// after no machine's node; two or more make it unknowable, an error that
// names them. None (false) for a machine that has no member.
func OwnedMember(s *Snapshot, m *clusterv1.Machine) (etcd.Member, bool, error) {
	if nodeName(m) != "" {
		member, ok := MemberOf(s, m)
		return member, ok, nil
	}
	nodes := machineNodes(s)
	var unowned []etcd.Member
	for _, member := range s.Members {
		if member.Started() && !nodes[member.Name] {
			unowned = append(unowned, member)
		}
	}
	// A machine without a provider ID has no infrastructure yet, let alone
	// a node: it owns no member, and no member may be its.
	unregistered := s.CP.Machines.Filter(collections.Not(collections.HasNode()), func(other *clusterv1.Machine) bool { return providerID(s.CP, other) != "" })
	switch {
	case len(unowned) == 0 || !unregistered.Has(m):
		return etcd.Member{}, false, nil
	case len(unowned) == 1 && unregistered.Len() == 1:
		return unowned[0], true, nil
	}
	var names []string
	for _, member := range unowned {
		names = append(names, member.String())
	}
	return etcd.Member{}, false, exitcode.Unsafef("machine %s has no node yet, and etcd members %s are named after no machine's node: one may be its, and which cannot be told; wait for the Machine controller to set the nodeRefs, or remove the member that is nobody's (etcdctl member remove)",
		m.Name, strings.Join(names, ", "))
}

// machineNodes names the nodes of the control-plane machines: an etcd member
// named after none of them is no machine's by its nodeRef.
func machineNodes(s *Snapshot) map[string]bool {
	nodes := map[string]bool{}
	for _, m := range s.CP.Machines {
		nodes[nodeName(m)] = true
	}
	return nodes
}

// providerID is m's provider ID, from the Machine or, before the Machine
// controller copies it there, from its InfraMachine.
func providerID(cp *kcpstate.ControlPlane, m *clusterv1.Machine) string {
	if m.Spec.ProviderID != "" {
		return m.Spec.ProviderID
	}
	if infra := cp.InfraResources[m.Name]; infra != nil {
		id, _, _ := unstructured.NestedString(infra.Object, "spec", "providerID")
		return id
	}
	return ""
}

// components are the static pods every control-plane node must run.
func components(s *Snapshot) []string {
	if s.EtcdManaged {
		return append([]string{workload.EtcdComponent}, workload.Components...)
	}
	return workload.Components
}

// Problem says what keeps machine m from being a healthy control-plane
// machine, from the tool's own live reads: a node that is Ready, its static
// pods Ready, and one named, voting, healthy etcd member without alarms. nil
// means healthy; the error is marked Unsafe and names the machine.
func Problem(s *Snapshot, m *clusterv1.Machine) error {
	name := nodeName(m)
	if name == "" {
		return exitcode.Unsafef("machine %s has no node yet%s", m.Name, provisioning(m))
	}
	if p := s.Nodes[name].Problem(components(s)); p != "" {
		return exitcode.Unsafef("machine %s: %s", m.Name, p)
	}
	if !s.EtcdManaged {
		return nil
	}
	member, ok := MemberOf(s, m)
	switch {
	case !ok:
		return exitcode.Unsafef("machine %s: no etcd member named %s%s", m.Name, name, pendingMembers(s))
	case member.Learner:
		return exitcode.Unsafef("machine %s: etcd member %s is a learner, not yet promoted", m.Name, member)
	case len(member.Alarms) > 0:
		return exitcode.Unsafef("machine %s: etcd member %s has alarms %s", m.Name, member, strings.Join(member.Alarms, ", "))
	case !member.Healthy:
		return exitcode.Unsafef("machine %s: etcd member %s is unhealthy: %s", m.Name, member, strings.Join(member.Errors, "; "))
	}
	return nil
}

// Joining reports whether m is still coming up — no node yet, node or static
// pods not Ready yet, or its etcd member not yet named or promoted — as opposed
// to a machine that was up and went bad. The first is waited on, the second
// refused after a grace. A machine the run has seen healthy is never joining.
func Joining(s *Snapshot, m *clusterv1.Machine) bool {
	if s.SeenHealthy[m.Name] {
		return false
	}
	name := nodeName(m)
	if name == "" || s.Nodes[name].Problem(components(s)) != "" {
		return true
	}
	if !s.EtcdManaged {
		return false
	}
	member, ok := MemberOf(s, m)
	return !ok || member.Learner
}

// provisioning explains why a machine has no node yet, from the Machine's
// own status written by the Machine controller (which keeps running while KCP
// is paused).
func provisioning(m *clusterv1.Machine) string {
	if !ptr.Deref(m.Status.Initialization.InfrastructureProvisioned, false) {
		return "; infrastructure not provisioned"
	}
	if !ptr.Deref(m.Status.Initialization.BootstrapDataSecretCreated, false) {
		return "; bootstrap data not ready"
	}
	return "; waiting for the node to register"
}

func pendingMembers(s *Snapshot) string {
	var pending []string
	for _, m := range s.Members {
		if !m.Voting() {
			pending = append(pending, m.String())
		}
	}
	if len(pending) == 0 {
		return ""
	}
	return " (joining: " + strings.Join(pending, ", ") + ")"
}

// Healthy checks the whole control plane, except the machines in skip: every
// machine healthy (Problem), no etcd member without a machine, no alarms but
// on the members of skipped machines (a condemned machine's alarm is why it
// goes; KCP's targetEtcdClusterHealthy leaves the member to remove out too).
// The error is marked Unsafe and names the machine or member at fault.
func Healthy(s *Snapshot, skip ...*clusterv1.Machine) error {
	skipped := collections.FromMachines(skip...)
	for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
		if skipped.Has(m) {
			continue
		}
		if err := Problem(s, m); err != nil {
			return err
		}
	}
	if !s.EtcdManaged {
		return nil
	}
	nodes := machineNodes(s)
	// While a machine has no node, a member named after no node may yet be
	// its (StaleMembers holds too): the quorum projections count it, and it
	// is removed once every machine has a node.
	unregistered := s.CP.Machines.Filter(collections.Not(collections.HasNode())).Len() > 0
	skippedNodes := map[string]bool{}
	for _, m := range skip {
		skippedNodes[nodeName(m)] = nodeName(m) != ""
	}
	for _, member := range s.Members {
		if member.Started() && !nodes[member.Name] && !unregistered {
			return exitcode.Unsafef("etcd member %s has no control-plane machine: remove it (etcdctl member remove %x) or find its machine", member, member.ID)
		}
		if len(member.Alarms) > 0 && !skippedNodes[member.Name] {
			return exitcode.Unsafef("etcd member %s has alarms %s", member, strings.Join(member.Alarms, ", "))
		}
	}
	return nil
}

// ComponentsHealthy reports whether m's control-plane components all work:
// its node is Ready, every static pod on it is Ready and, with stacked etcd,
// its own member is a healthy voter — kubeadm points each API server at its
// local member alone, so without one the machine serves nothing. It is
// KCP's per-machine test in targetKubernetesControlPlaneComponentsHealthy
// made stricter by the member, which KCP judges only by its pod.
func ComponentsHealthy(s *Snapshot, m *clusterv1.Machine) bool {
	name := nodeName(m)
	if name == "" || s.Nodes[name].Problem(components(s)) != "" {
		return false
	}
	if !s.EtcdManaged {
		return true
	}
	member, ok := MemberOf(s, m)
	return ok && member.HealthyVoter()
}

// KeepsWorkingComponents refuses a change that would leave no machine with
// all its control-plane components working: the machines but leaving (none
// for an add) must include one, not deleting, that ComponentsHealthy
// passes. A machine joins through a working API server, and the cluster is
// served by one: KCP checks the same before it deletes a machine to
// remediate it, before it releases a deleting machine's pre-terminate hook,
// and before it adds a replacement while a remediation is in progress
// (targetKubernetesControlPlaneComponentsHealthy). what names the change
// for the message.
func KeepsWorkingComponents(s *Snapshot, what string, leaving *clusterv1.Machine) error {
	for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
		if (leaving == nil || m.Name != leaving.Name) && m.DeletionTimestamp.IsZero() && ComponentsHealthy(s, m) {
			return nil
		}
	}
	var why []string
	for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
		if leaving != nil && m.Name == leaving.Name {
			continue
		}
		// A machine not deleting whose components do not work has a
		// Problem: ComponentsHealthy asks less than Problem.
		if !m.DeletionTimestamp.IsZero() {
			why = append(why, m.Name+" is deleting")
		} else {
			why = append(why, strings.TrimPrefix(Problem(s, m).Error(), "machine "))
		}
	}
	return exitcode.Unsafef("%s would leave no control-plane machine with all its components working (%s): no machine could join, and the cluster would have no API server; bring one machine's node and static pods back by hand (kubectl get pods -n kube-system on the workload cluster), then re-run",
		what, strings.Join(why, "; "))
}

// SafeToRemediate checks what KCP's canSafelyRemediateMachine and
// reconcilePreTerminateHook check before a machine is deleted to be
// replaced, or its deleting member removed: one other machine keeps its
// components working (KeepsWorkingComponents) and etcd keeps quorum without
// its member (SafeToRemove). Other machines may be broken: "every other
// machine healthy" would stall a control plane with two faults half-way
// through the first one's replacement, which KCP finishes.
func SafeToRemediate(s *Snapshot, m *clusterv1.Machine, what string) error {
	if err := KeepsWorkingComponents(s, what, m); err != nil {
		return err
	}
	return SafeToRemove(s, m)
}

// MostBroken is the machine KCP remediates first among machines, "the most
// broken" (pickMachineToBeRemediated): one annotated
// cluster.x-k8s.io/remediate-machine; then one without a node; then, with
// stacked etcd, one whose member is not a healthy voter, then one whose etcd
// pod is not Ready; then one whose API server, controller manager or
// scheduler is not Ready (a node not Ready counting as its pods not
// Ready); then the oldest. Its removal costs the least:
// what stays keeps the best chance of quorum and of working components. The
// health is the tool's live reads, where KCP reads its Machine conditions
// (frozen while it is paused).
func MostBroken(s *Snapshot, machines collections.Machines) *clusterv1.Machine {
	rank := func(m *clusterv1.Machine) []bool {
		name := nodeName(m)
		node := s.Nodes[name]
		member, ok := MemberOf(s, m)
		// A node not Ready leaves its pods' health unknown, which KCP
		// counts as not healthy.
		down := func(pod string) bool { return !node.Ready || !node.Pods[pod] }
		ranks := []bool{annotations.HasRemediateMachine(m), name == ""}
		if s.EtcdManaged {
			ranks = append(ranks, !ok || !member.HealthyVoter(), down(workload.EtcdComponent))
		}
		for _, c := range workload.Components {
			ranks = append(ranks, down(c))
		}
		return ranks
	}
	return slices.MinFunc(machines.SortedByCreationTimestamp(), func(a, b *clusterv1.Machine) int {
		ra, rb := rank(a), rank(b)
		for i := range ra {
			if ra[i] != rb[i] {
				if ra[i] {
					return -1
				}
				return 1
			}
		}
		return 0 // slices.MinFunc keeps the first, the oldest
	})
}

// SafeToRelease checks what KCP's reconcilePreTerminateHook checks before it
// removes a deleting machine's etcd member and releases its pre-terminate
// hook: nothing for the last machine, which goes whatever is left; else
// SafeToRemediate.
func SafeToRelease(s *Snapshot, m *clusterv1.Machine) error {
	if IsLast(s, m) {
		return nil
	}
	return SafeToRemediate(s, m, "removing its etcd member")
}

// SafeToAdd checks that etcd keeps quorum while a new member joins and has not
// yet become healthy.
//
// An alarm anywhere refuses too: NOSPACE and CORRUPT stop etcd's writes
// cluster-wide, so a member could not join; KCP leaves a member with alarms
// out only of the removal of that member itself.
func SafeToAdd(s *Snapshot) error {
	if !s.EtcdManaged {
		return nil
	}
	for _, member := range s.Members {
		if len(member.Alarms) > 0 {
			return exitcode.Unsafef("cannot add a control-plane machine while etcd member %s has alarms %s (etcd takes no writes): replace its machine first, or clear the alarm (etcdctl alarm disarm)",
				member, strings.Join(member.Alarms, ", "))
		}
	}
	if p := etcd.Project(s.Members, etcd.Add, 0); !p.Safe {
		return exitcode.Unsafef("cannot add a control-plane machine: %s", p.Reason())
	}
	return nil
}

// SafeToRemove checks that removing m's etcd member (OwnedMember) keeps
// quorum given the health of the others (voting members only; a learner or an
// unnamed member anywhere blocks, as in KCP). A machine without a member is
// safe to remove.
func SafeToRemove(s *Snapshot, m *clusterv1.Machine) error {
	if !s.EtcdManaged {
		return nil
	}
	member, ok, err := OwnedMember(s, m)
	if err != nil || !ok {
		return err
	}
	if p := etcd.Project(s.Members, etcd.Remove, member.ID); !p.Safe {
		return exitcode.Unsafef("cannot remove machine %s: %s", m.Name, p.Reason())
	}
	return nil
}

// StaleMembers returns the etcd members that no control-plane machine owns —
// an unnamed member (kubeadm's learner that never started) or a named one
// whose name is no machine's node — in the order KCP removes them: unnamed
// first, then by name (KCP sorts by name, and "" sorts first). They are left
// behind by a replacement that failed mid-join and was deleted; an unnamed
// one holds etcd's single learner slot, so no machine could join after it.
//
// It re-implements the selection of KCP's reconcileEtcdMembers (CAPI v1.14.2,
// controlplane/kubeadm/reconcilers/kubeadmcontrolplane/kubeadmcontrolplane_controller.go,
// ~1296–1360; unexported, so it cannot be called), with KCP's holds:
//   - none while a machine has no nodeRef (~1348): the member may be that
//     machine's, whose node has not registered yet;
//   - no unnamed member while a machine's node may still be starting its
//     member (~1355). KCP's evidence is the node's age (20 s since it
//     registered, etcdMemberStartupGracePeriod); this tool sees the members
//     by name, so it holds while any machine's node has no member named after
//     it — the one case where an unnamed member can be that node's learner —
//     and needs no timer. A node that never starts its member is a join that
//     times out (AwaitJoin), not a member to remove behind its back.
//
// The holds cover deleting machines too: one deleted before its node
// registered may own a member by a name nothing here knows yet (no nodeRef),
// and one whose node has no member named after it may own the unnamed one.
// Otherwise a member named after no node is nobody's, deleting or not, and
// it must go before a deletion's pre-terminate hook is served: it fails the
// health check of what stays, and would hold that deletion up for good.
//
// KCP acts only while its EtcdClusterHealthy condition is not True, which it
// recomputes in the same reconcile: a live "members and machines disagree",
// not a time to wait. While KCP is paused that condition is frozen, so the
// live membership is the test here, and no grace is added.
func StaleMembers(s *Snapshot) []etcd.Member {
	if !s.EtcdManaged || s.CP.Machines.Len() == 0 {
		return nil
	}
	if s.CP.Machines.Filter(collections.Not(collections.HasNode())).Len() > 0 {
		return nil
	}
	owned := map[string]bool{}
	nodeStarting := false
	for _, m := range s.CP.Machines {
		owned[nodeName(m)] = true
		if _, ok := MemberOf(s, m); !ok {
			nodeStarting = true
		}
	}
	var stale []etcd.Member
	for _, member := range s.Members {
		switch {
		case !member.Started() && nodeStarting:
		case !member.Started() || !owned[member.Name]:
			stale = append(stale, member)
		}
	}
	slices.SortStableFunc(stale, func(a, b etcd.Member) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.ID, b.ID))
	})
	return stale
}

// SafeToRemoveMember checks that removing member keeps etcd's quorum given
// the health of the others, as SafeToRemove does for a machine's member. A
// learner or an unnamed member does not vote, so its removal never costs
// quorum; a voting member that is down may go only if the voting members left
// keep quorum — the projection counts both that way. (KCP skips the check for
// an unnamed member, ~1384–1391; here it still asks that the voters left be
// able to commit the removal, which etcd needs anyway.)
func SafeToRemoveMember(s *Snapshot, member etcd.Member) error {
	if !s.EtcdManaged {
		return nil
	}
	if p := etcd.Project(s.Members, etcd.Remove, member.ID); !p.Safe {
		return exitcode.Unsafef("etcd member %s has no control-plane machine, and removing it would put quorum at risk: %s; check etcd's health (etcdctl member list, endpoint status)",
			member, p.Reason())
	}
	return nil
}

// Leads reports whether m's etcd member is the leader.
func Leads(s *Snapshot, m *clusterv1.Machine) bool {
	member, ok := MemberOf(s, m)
	return ok && member.Leader
}

// LeaderCandidates returns the members leadership may move to when it leaves
// m (nil for a member no machine owns), best first: healthy voting members of
// machines that stay — one a MachineHealthCheck has condemned for
// remediation last, as KCP ranks it (it is about to go, but with two faults
// it may be the only healthy member left) — up-to-date machines before
// outdated ones, newest first (the machine that will stay the longest). KCP orders by
// its Machine conditions (getCandidatesForEtcdLeadership); its own freeze
// while KCP is paused, so etcd health is read live here, while the
// remediation verdict is written by the MachineHealthCheck controller, which
// a paused KCP does not stop. KCP also ranks a machine whose health check has
// not succeeded yet after one whose has; that would rank a replacement the
// check has not looked at yet below the outdated machines about to go, and
// make leadership move once more for each of them.
func LeaderCandidates(s *Snapshot, m *clusterv1.Machine) []etcd.Member {
	outdated, _ := s.CP.NotUpToDateMachines()
	type candidate struct {
		member    etcd.Member
		condemned bool
		upToDate  bool
		machine   *clusterv1.Machine
	}
	var cands []candidate
	for _, other := range s.CP.Machines.Filter(collections.Not(collections.HasDeletionTimestamp)) {
		if m != nil && other.Name == m.Name {
			continue
		}
		member, ok := MemberOf(s, other)
		if !ok || !member.Voting() || !member.Healthy {
			continue
		}
		cands = append(cands, candidate{member: member, condemned: MHCCondemned(other), upToDate: !outdated.Has(other), machine: other})
	}
	sort.SliceStable(cands, func(i, j int) bool {
		if cands[i].condemned != cands[j].condemned {
			return !cands[i].condemned
		}
		if cands[i].upToDate != cands[j].upToDate {
			return cands[i].upToDate
		}
		ti, tj := cands[i].machine.CreationTimestamp, cands[j].machine.CreationTimestamp
		if !ti.Equal(&tj) {
			return tj.Before(&ti)
		}
		return cands[i].machine.Name < cands[j].machine.Name
	})
	out := make([]etcd.Member, len(cands))
	for i, c := range cands {
		out[i] = c.member
	}
	return out
}

// WaitingForCleanup reports whether a deleting machine has reached the point
// where KCP's kcp-cleanup pre-terminate hook is served: the Machine controller
// waits on pre-terminate hooks, and kcp-cleanup is the only one left (it must
// run last, while the kubelet still works for the others).
func WaitingForCleanup(m *clusterv1.Machine) bool {
	if _, ok := m.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]; !ok {
		return false
	}
	for k := range m.Annotations {
		if strings.HasPrefix(k, clusterv1.PreTerminateDeleteHookAnnotationPrefix) && k != controlplanev1.PreTerminateHookCleanupAnnotation {
			return false
		}
	}
	c := conditions.Get(m, clusterv1.MachineDeletingCondition)
	return c != nil && c.Status == "True" && c.Reason == clusterv1.MachineDeletingWaitingForPreTerminateHookReason
}

// HasCleanupHook reports whether m still carries the kcp-cleanup hook.
func HasCleanupHook(m *clusterv1.Machine) bool {
	_, ok := m.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]
	return ok
}

// The hand-over guards: may this tool take the control plane over from KCP,
// and is it still in its hands?

// CheckTakeover refuses a control plane this tool must not pause: a deleting
// or paused Cluster, a KubeadmControlPlane paused by someone else or with a
// remediation in progress.
func CheckTakeover(s *Snapshot) error {
	cluster, kcp := s.CP.Cluster, s.CP.KCP
	if !cluster.DeletionTimestamp.IsZero() {
		return exitcode.Unsafef("cluster %s is being deleted", cluster.Name)
	}
	if ptr.Deref(cluster.Spec.Paused, false) {
		return exitcode.Unsafef("cluster %s is paused (spec.paused): the Machine controller is frozen too, so no machine could join or leave; unpause it first",
			cluster.Name)
	}
	if err := PausedBySomeoneElse(s); err != nil {
		return err
	}
	// A remediation this tool began under its record, after the record's
	// start, is the resumed run's to finish (RemediationInProgress); KCP's
	// own, begun before the pause, is KCP's.
	if v, ok := kcp.Annotations[controlplanev1.RemediationInProgressAnnotation]; ok && !remediationOurs(kcp, v) {
		return exitcode.Unsafef("KubeadmControlPlane %s has a remediation in progress (%s): let KCP finish it first",
			kcp.Name, controlplanev1.RemediationInProgressAnnotation)
	}
	return nil
}

// remediationOurs reports whether the remediation recorded as value on kcp
// began under this tool's operation record: after the record's start.
func remediationOurs(kcp *controlplanev1.KubeadmControlPlane, value string) bool {
	rec, err := record.Of(kcp)
	if err != nil || rec == nil {
		return false
	}
	r, err := remediationOf(value)
	return err == nil && r != nil && !r.Timestamp.Time.Before(rec.Started)
}

// takeoverCheck is CheckTakeover for what HandOver.Pause reads on each
// attempt.
func takeoverCheck(cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane) error {
	return CheckTakeover(NewSnapshot(&kcpstate.ControlPlane{Cluster: cluster, KCP: kcp}))
}

// PausedBySomeoneElse refuses a KubeadmControlPlane whose pause carries no
// record of this tool: someone paused it for a reason of their own, and this
// tool never takes over, nor removes, a pause it did not set.
func PausedBySomeoneElse(s *Snapshot) error {
	kcp := s.CP.KCP
	_, paused := kcp.Annotations[clusterv1.PausedAnnotation]
	_, ours := kcp.Annotations[record.Annotation]
	if paused && !ours {
		return exitcode.Unsafef("KubeadmControlPlane %s is paused by someone else (annotation %s without a %s record): this tool never takes over or removes a pause it did not set; find who paused it and why",
			kcp.Name, clusterv1.PausedAnnotation, record.Annotation)
	}
	return nil
}

// StillOurs stops a run whose KubeadmControlPlane is no longer paused with
// this tool's record — someone ran handback, or a GitOps sync reverted it:
// acting on would race KCP itself — or whose Cluster was paused meanwhile
// (clusterctl move does that): the Machine controller is then frozen, so no
// machine would join or leave.
func StillOurs(s *Snapshot) error {
	if ptr.Deref(s.CP.Cluster.Spec.Paused, false) {
		return exitcode.Unsafef("cluster %s was paused (spec.paused) during the run: the Machine controller is frozen, so no machine can join or leave; unpause it and re-run to continue",
			s.CP.Cluster.Name)
	}
	if err := PausedBySomeoneElse(s); err != nil {
		return err
	}
	if _, paused := s.CP.KCP.Annotations[clusterv1.PausedAnnotation]; !paused {
		return exitcode.Unsafef("KubeadmControlPlane %s was unpaused or lost this tool's record during the run (someone ran handback, or a GitOps sync reverted it): stopping so as not to race KCP",
			s.CP.KCP.Name)
	}
	return nil
}

// TargetUnchanged stops a run whose KubeadmControlPlane, or on a topology
// cluster whose Cluster topology, asks for another version (or machine
// template) than the run set:
// a run never finishes on a spec someone else changed. (While the KCP is
// paused mid-rollout the topology controller holds a new topology version
// back from the KCP, so the Cluster is where that change shows.)
func TargetUnchanged(s *Snapshot, t Target) error {
	if t.Version == "" {
		return nil
	}
	if s.CP.KCP.Spec.Version != t.Version {
		return exitcode.Unsafef("KubeadmControlPlane %s asks for %s, not %s: someone changed it during the run",
			s.CP.KCP.Name, s.CP.KCP.Spec.Version, t.Version)
	}
	if ref := s.CP.KCP.Spec.MachineTemplate.Spec.InfrastructureRef; t.Template != "" && ref.Name != t.Template {
		return exitcode.Unsafef("KubeadmControlPlane %s's machines are made from %s %s, not %s: someone changed it during the run",
			s.CP.KCP.Name, ref.Kind, ref.Name, t.Template)
	}
	if cluster := s.CP.Cluster; cluster.Spec.Topology.IsDefined() && cluster.Spec.Topology.Version != t.Version {
		return exitcode.Unsafef("Cluster %s's topology asks for %s, not %s: someone changed it during the run",
			cluster.Name, cluster.Spec.Topology.Version, t.Version)
	}
	return nil
}

// CheckState refuses a request on a control plane this tool must not take
// over (CheckTakeover), that holds an unfinished operation of ours for a
// different target, or, for a rollout, whose KCP is rolling out by itself
// (KCPRollingOut). A KubeadmControlPlane held by `pause` is any verb's to
// take over: that is what the pause was for.
func CheckState(s *Snapshot, r Request) error {
	if err := CheckTakeover(s); err != nil {
		return err
	}
	rec, err := record.Of(s.CP.KCP)
	if err != nil {
		return err
	}
	if rec != nil && rec.Operation != record.PauseOperation && (rec.Operation != string(r.Operation) || rec.Target != r.TargetString()) {
		return exitcode.Unsafef("KubeadmControlPlane %s holds an unfinished operation: %s; re-run that command to finish it, or `kubectl cp-rollout handback %s` to give control back to KCP",
			s.CP.KCP.Name, rec, s.CP.Cluster.Name)
	}
	if r.Operation == RolloutOperation && rec == nil {
		return KCPRollingOut(s)
	}
	return nil
}

// KCPRollingOut refuses a rollout of a KubeadmControlPlane that this tool has
// not paused while KCP finds machines outdated: KCP has started (or is about
// to start) its own rollout of that change, and taking over now would only
// race it. The change should have been applied under `pause`.
func KCPRollingOut(s *Snapshot) error {
	outdated, _ := s.CP.MachinesNeedingRollout()
	if outdated.Len() == 0 {
		return nil
	}
	kcp := s.CP.KCP
	says := "its RollingOut condition is not set yet"
	if c := conditions.Get(kcp, controlplanev1.KubeadmControlPlaneRollingOutCondition); c != nil {
		says = fmt.Sprintf("RollingOut=%s (%s)", c.Status, c.Reason)
		if msg := strings.Join(strings.Fields(c.Message), " "); msg != "" {
			says += ": " + msg
		}
	}
	return exitcode.Unsafef("KCP's own rollout of KubeadmControlPlane %s is in progress (%s; outdated: %s): let it finish, or `kubectl cp-rollout pause %s` before changing the spec next time, then `kubectl cp-rollout rollout %s`",
		kcp.Name, says, strings.Join(machineNames(outdated.SortedByCreationTimestamp()), ", "), s.CP.Cluster.Name, s.CP.Cluster.Name)
}

// ProvenKCPMinors are the KCP controller minors this tool was proven with:
// each release's own controller binaries, handed a control plane the tool
// rolled, found every machine up to date and did nothing (make test-capi).
// The tool computes desired state with v1.14.2's packages; a minor that
// computes it differently would roll every machine again after hand-back.
var ProvenKCPMinors = []semver.Version{{Major: 1, Minor: 13}, {Major: 1, Minor: 14}}

// ProvenKCPRange names ProvenKCPMinors for messages: "v1.13.x–v1.14.x".
func ProvenKCPRange() string {
	first, last := ProvenKCPMinors[0], ProvenKCPMinors[len(ProvenKCPMinors)-1]
	return fmt.Sprintf("v%d.%d.x–v%d.%d.x", first.Major, first.Minor, last.Major, last.Minor)
}

// KCPVersionProven reports whether a KCP controller of this version is of a
// proven minor.
func KCPVersionProven(version string) bool {
	v, err := semver.ParseTolerant(version)
	return err == nil && slices.ContainsFunc(ProvenKCPMinors, func(p semver.Version) bool {
		return v.Major == p.Major && v.Minor == p.Minor
	})
}

// CheckKCPVersion refuses a KCP controller of a minor the tool was not
// proven with. Its input is the controller's image tag, which no snapshot
// holds: it is read once per run, from the controller's Deployment, or
// given with --kcp-version.
func CheckKCPVersion(version string) error {
	if _, err := semver.ParseTolerant(version); err != nil {
		return exitcode.Unsafef("KCP controller version %q is not a version: pass --kcp-version", version)
	}
	if !KCPVersionProven(version) {
		return exitcode.Unsafef("KCP controller is %s; this tool is proven with KCP %s, whose desired state it reproduces (another minor may roll every machine again after hand-back); to run anyway at your own risk, name a proven version with --kcp-version",
			version, ProvenKCPRange())
	}
	return nil
}

// InFlight returns the control-plane machines a stopped run leaves in the
// middle of a join: a replacement that has not come up yet (Replacing, not
// CameUp). Handing back to KCP with one would leave KCP a join it did not
// start, with an etcd learner it did not plan for; with none, a failed run
// may hand back (--on-failure handback). A deleting machine is not in
// flight: KCP serves any machine's kcp-cleanup hook by its own rules
// (reconcilePreTerminateHook, which SafeToRelease mirrors) and then
// replaces it, so a run stopped half-way through a deletion hands it over.
func InFlight(s *Snapshot) collections.Machines {
	return s.CP.Machines.Filter(collections.Not(collections.HasDeletionTimestamp), Replacing(s), func(m *clusterv1.Machine) bool {
		return !CameUp(s, m)
	})
}

// Replacing selects the machines still joining: an up-to-date replacement
// (this tool's or KCP's) not yet healthy, or an outdated machine that KCP
// was still creating when it was paused and that has not come up yet —
// both are waited on, never refused as broken.
func Replacing(s *Snapshot) collections.Func {
	return func(m *clusterv1.Machine) bool {
		return m != nil && Joining(s, m) && (!s.CP.MachinesNotUpToDate.Has(m) || !CameUp(s, m))
	}
}

// CameUp reports whether m came up once: it has a node and, with stacked
// etcd, a member that was promoted to voter — or none at all while no member
// waits to start (kubeadm adds a joining node's member right after the node
// registers, so a node without one and without a learner in the making lost
// it).
func CameUp(s *Snapshot, m *clusterv1.Machine) bool {
	if nodeName(m) == "" {
		return false
	}
	if !s.EtcdManaged {
		return true
	}
	member, ok := MemberOf(s, m)
	learning := slices.ContainsFunc(s.Members, func(other etcd.Member) bool { return !other.Started() })
	return (ok && member.Voting()) || (!ok && !learning)
}

// machineNames names machines in their order, for messages that must read
// the same each time (a collection's Names follow map order).
func machineNames(ms []*clusterv1.Machine) []string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	return names
}
