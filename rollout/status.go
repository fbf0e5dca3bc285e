package rollout

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// Status is where a control plane stands, as `status` shows it. Its JSON form
// is a documented, stable interface: fields are only ever added.
type Status struct {
	Cluster      string             `json:"cluster"`
	Namespace    string             `json:"namespace"`
	ControlPlane ControlPlaneStatus `json:"controlPlane"`
	Lock         *LockStatus        `json:"lock"`
	Machines     []MachineStatus    `json:"machines"`
	EtcdManaged  bool               `json:"etcdManaged"`
	EtcdMembers  []MemberStatus     `json:"etcdMembers"`
	Next         *NextStatus        `json:"next,omitempty"`
	Errors       []string           `json:"errors,omitempty"`
	Operation    *record.Record     `json:"operation"`
	// Topology is the ClusterClass topology that manages the cluster, if any.
	Topology *TopologyStatus `json:"topology,omitempty"`
	// LastOperation is the last operation this tool finished on the cluster
	// (its record, moved at hand-back), whoever ran it.
	LastOperation *record.Record `json:"lastOperation,omitempty"`
	// ManagementOnly is true when the workload cluster was not read (the
	// identity may not read its Secrets): machines are as the management
	// cluster has them, with no problem found on their nodes, no etcd
	// members and no next step, which depends on their health.
	ManagementOnly bool `json:"managementOnly,omitempty"`
	// KCPController is the KubeadmControlPlane controller as status found
	// it; nil when it was not looked for.
	KCPController *KCPControllerStatus `json:"kcpController,omitempty"`
	// KubeadmConfigsNotRead is true when the identity may not read the
	// machines' KubeadmConfigs (cp-rollout-view: they hold the node-join
	// token): a machine's upToDate is then KCP's own UpToDate condition on
	// it, or upToDateUnknown where KCP has not judged the current spec, and
	// there is no next step.
	KubeadmConfigsNotRead bool `json:"kubeadmConfigsNotRead,omitempty"`
	// Acting is who changes the control plane's machines now.
	Acting ActingStatus `json:"acting"`
}

// ActingStatus says who changes a control plane's machines now: a run of
// this tool, KCP's own controller, or nobody. Watching a rollout, this is
// the first question, whichever of the two rolls it.
type ActingStatus struct {
	// Who is "cp-rollout", "KCP" or "nobody".
	Who string `json:"who"`
	// What it does: the run's operation and holder; the conditions by which
	// KCP reports its work (RollingOut, ScalingUp, ScalingDown,
	// Remediating); for nobody, "KCP paused" when nothing will act until the
	// pause is lifted.
	What string `json:"what,omitempty"`
}

func (a ActingStatus) String() string {
	if a.What == "" {
		return a.Who
	}
	return a.Who + " (" + a.What + ")"
}

// kcpActivities are the KubeadmControlPlane conditions that are True while
// its controller creates, deletes or replaces machines.
var kcpActivities = []string{
	controlplanev1.KubeadmControlPlaneRollingOutCondition,
	controlplanev1.KubeadmControlPlaneScalingUpCondition,
	controlplanev1.KubeadmControlPlaneScalingDownCondition,
	controlplanev1.KubeadmControlPlaneRemediatingCondition,
}

// KCPActivity names the kcpActivities conditions that are True on kcp.
func KCPActivity(kcp *controlplanev1.KubeadmControlPlane) []string {
	var busy []string
	for _, c := range kcpActivities {
		if conditions.IsTrue(kcp, c) {
			busy = append(busy, c)
		}
	}
	return busy
}

// Acting says who changes the machines, from what status already reads: a
// live lock is a run of this tool (whatever the pause says: a run takes the
// lock before it pauses); otherwise a KCP that is not paused acts when its
// conditions say so (kcpBusy, from KCPActivity). A paused KCP with no run is
// nobody's: the pause holds KCP back until a run resumes or hands back.
func Acting(lock *LockStatus, rec *record.Record, paused bool, kcpBusy []string) ActingStatus {
	switch {
	case lock != nil && lock.Live && lock.Holder != "":
		what := lock.Holder
		if rec != nil && rec.Operation != record.PauseOperation {
			what = rec.Operation + " by " + lock.Holder
		}
		return ActingStatus{Who: "cp-rollout", What: what}
	case paused:
		return ActingStatus{Who: "nobody", What: "KCP paused"}
	case len(kcpBusy) > 0:
		return ActingStatus{Who: "KCP", What: strings.Join(kcpBusy, ", ")}
	}
	return ActingStatus{Who: "nobody"}
}

// KCPControllerStatus is the KubeadmControlPlane controller's version and
// whether this tool is proven with it: the verbs that roll machines refuse
// one it is not (CheckKCPVersion), and status says so before they do.
type KCPControllerStatus struct {
	// Version is the controller's image tag; "" when it could not be read.
	Version string `json:"version,omitempty"`
	Proven  bool   `json:"proven"`
	// Error says why Version could not be read: status shows the rest of
	// the control plane all the same.
	Error string `json:"error,omitempty"`
}

// ControlPlaneStatus describes the KubeadmControlPlane.
type ControlPlaneStatus struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	Replicas int32  `json:"replicas"`
	Paused   bool   `json:"paused"`
	// PausedByUs is true when the pause carries this tool's operation record.
	PausedByUs bool `json:"pausedByUs"`
	// State says in one line whether KCP is in charge, and if not, who
	// paused it, since when and how the last run under that pause ended:
	// "paused by cp-rollout since T, last run failed: REASON".
	State string `json:"state"`
}

// PauseState is a control plane's State: active, paused by someone else,
// paused by `pause` (who, since, why), or paused by this tool under rec, with
// its last failure if it has one.
func PauseState(paused bool, rec *record.Record) string {
	switch {
	case !paused:
		return "active"
	case rec == nil:
		return "paused by someone else"
	case rec.Operation == record.PauseOperation:
		return "paused by cp-rollout pause (" + rec.Detail() + ")"
	}
	state := "paused by cp-rollout since " + rec.Started.UTC().Format(time.RFC3339)
	if f := rec.LastFailure; f != nil {
		state += ", last run failed: " + f.Reason
	}
	return state
}

// TopologyStatus describes a Cluster's ClusterClass topology: where the
// control plane's version and replicas are set.
type TopologyStatus struct {
	Class    string `json:"class"`
	Version  string `json:"version"`
	Replicas *int32 `json:"replicas,omitempty"`
}

// LockStatus describes the cluster's Lease.
type LockStatus struct {
	Holder    string     `json:"holder"`
	RenewTime *time.Time `json:"renewTime"`
	Live      bool       `json:"live"`
}

// LockOf describes a cluster's lock, its Lease, as it stands at now.
func LockOf(lease *coordinationv1.Lease, now time.Time) *LockStatus {
	l := &LockStatus{Holder: ptr.Deref(lease.Spec.HolderIdentity, ""), Live: runlock.Live(lease, now)}
	if lease.Spec.RenewTime != nil {
		l.RenewTime = &lease.Spec.RenewTime.Time
	}
	return l
}

// MachineStatus describes one control-plane machine.
type MachineStatus struct {
	Name          string    `json:"name"`
	Version       string    `json:"version"`
	Node          string    `json:"node"`
	FailureDomain string    `json:"failureDomain"`
	Phase         string    `json:"phase"`
	UpToDate      bool      `json:"upToDate"`
	Deleting      bool      `json:"deleting"`
	Created       time.Time `json:"created"`
	// Problem is what keeps the machine from being healthy, from live reads; "" when healthy.
	Problem string `json:"problem,omitempty"`
	// HealthCheck is a MachineHealthCheck's verdict on the machine: healthy,
	// unhealthy (and why), or remediation wanted, which a run acts on first;
	// "" when no MachineHealthCheck watches it.
	HealthCheck string `json:"healthCheck,omitempty"`
	// UpToDateUnknown is true when whether the machine is up to date could
	// not be judged (see Status.KubeadmConfigsNotRead); UpToDate is then
	// false.
	UpToDateUnknown bool `json:"upToDateUnknown,omitempty"`
}

// MemberStatus describes one etcd member.
type MemberStatus struct {
	Name    string   `json:"name"`
	ID      string   `json:"id"`
	Leader  bool     `json:"leader"`
	Healthy bool     `json:"healthy"`
	Learner bool     `json:"learner"`
	DBSize  int64    `json:"dbSize"`
	Version string   `json:"version,omitempty"`
	Alarms  []string `json:"alarms"`
	Errors  []string `json:"errors,omitempty"`
}

// NextStatus is the step Next would take towards the
// KubeadmControlPlane's own spec.
type NextStatus struct {
	Action  string `json:"action"`
	Machine string `json:"machine,omitempty"`
	// Member is the etcd member remove-stale-member removes.
	Member string `json:"member,omitempty"`
	Reason string `json:"reason"`
}

// Status reads the control plane without changing anything and without the
// lock, so it works while a rollout runs. The management cluster must answer;
// what the workload cluster or etcd cannot tell is listed in Errors. An
// engine without a Workload shows the management cluster's half. connected,
// when not nil, is the control plane as read a moment ago (see SnapshotOf).
func (e *Engine) Status(ctx context.Context, connected *kcpstate.ControlPlane) (*Status, error) {
	cp := connected
	if cp == nil {
		var err error
		if cp, err = e.Reader.Read(ctx); err != nil {
			return nil, err
		}
	}
	rec, err := record.Of(cp.KCP)
	if err != nil {
		return nil, err
	}
	_, paused := cp.KCP.Annotations[clusterv1.PausedAnnotation]
	st := &Status{
		Cluster: cp.Cluster.Name, Namespace: cp.Cluster.Namespace, Operation: rec, LastOperation: record.LastOf(cp.KCP),
		ControlPlane: ControlPlaneStatus{Name: cp.KCP.Name, Version: cp.KCP.Spec.Version,
			Replicas: ptr.Deref(cp.KCP.Spec.Replicas, 1), Paused: paused, PausedByUs: paused && rec != nil,
			State: PauseState(paused, rec)},
		Machines: []MachineStatus{}, EtcdMembers: []MemberStatus{},
	}
	if t := cp.Cluster.Spec.Topology; t.IsDefined() {
		st.Topology = &TopologyStatus{Class: t.ClassRef.Name, Version: t.Version, Replicas: t.ControlPlane.Replicas}
	}

	lease, err := e.Lease.Lease(ctx)
	switch {
	case err != nil:
		st.Errors = append(st.Errors, "reading the lock: "+err.Error())
	case lease != nil:
		st.Lock = LockOf(lease, time.Now())
	}
	st.Acting = Acting(st.Lock, rec, paused, KCPActivity(cp.KCP))

	// live says whether s holds the workload cluster's nodes and etcd
	// members too, which a machine's problem and the next step depend on.
	s, live := NewSnapshot(cp), false
	if e.Workload == nil {
		st.ManagementOnly = true
	} else if read, err := e.SnapshotOf(ctx, cp); err != nil {
		st.Errors = append(st.Errors, err.Error())
	} else {
		s, live = read, true
	}
	st.EtcdManaged = s.EtcdManaged
	unjudged := collections.New()
	if e.Reader.KubeadmConfigsUnread() {
		st.KubeadmConfigsNotRead, unjudged = true, e.Reader.Unjudged(s.CP)
	}
	for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
		ms := MachineStatus{
			Name: m.Name, Version: m.Spec.Version, Node: nodeName(m), FailureDomain: m.Spec.FailureDomain,
			Phase: m.Status.Phase, UpToDate: !s.CP.MachinesNotUpToDate.Has(m) && !unjudged.Has(m), UpToDateUnknown: unjudged.Has(m),
			Deleting: !m.DeletionTimestamp.IsZero(), Created: m.CreationTimestamp.Time, HealthCheck: healthCheck(m),
		}
		if live && !ms.Deleting {
			if err := Problem(s, m); err != nil {
				ms.Problem = err.Error()
			}
		}
		st.Machines = append(st.Machines, ms)
	}
	for _, m := range s.Members {
		st.EtcdMembers = append(st.EtcdMembers, MemberStatus{
			Name: m.Name, ID: fmt.Sprintf("%x", m.ID), Leader: m.Leader, Healthy: m.Healthy, Learner: m.Learner,
			DBSize: m.DBSize, Version: m.Version, Alarms: append([]string{}, m.Alarms...), Errors: m.Errors,
		})
	}
	switch {
	case live && st.KubeadmConfigsNotRead:
		// Next compares the machines' KubeadmConfigs (MissingPieces, and
		// which machines need rolling out): without them it would decide on
		// guesses.
		st.Errors = append(st.Errors, "no next step: it depends on the machines' KubeadmConfigs, which this identity may not read")
	case live:
		t := Target{Replicas: Replicas(s), MaxSurge: KCPMaxSurge(s.CP.KCP)}
		step := Next(ctx, s, t)
		if step.Action == Refuse && step.Machine != nil && Broken(s, t, rec != nil).Has(step.Machine) {
			step.Reason += "; " + replaceHint(s, step.Machine)
		}
		st.Next = &NextStatus{Action: string(step.Action), Machine: machineName(step.Machine), Member: memberName(step), Reason: step.Reason}
	}
	return st, nil
}

// healthCheck words a MachineHealthCheck's verdict on m, from the conditions
// its controller writes (it runs while KCP is paused).
func healthCheck(m *clusterv1.Machine) string {
	c := conditions.Get(m, clusterv1.MachineHealthCheckSucceededCondition)
	why := ""
	if c != nil && c.Message != "" {
		why = ": " + strings.Join(strings.Fields(c.Message), " ")
	}
	switch {
	case MHCCondemned(m):
		return "remediation wanted" + why
	case c == nil:
		return ""
	case c.Status == metav1.ConditionTrue:
		return "healthy"
	default:
		return "unhealthy" + why
	}
}

// memberName names the member a step removes, "" for the steps that act on a
// machine.
func memberName(step Step) string {
	if step.Action != RemoveStaleMember {
		return ""
	}
	return step.Member.String()
}
