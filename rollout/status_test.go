package rollout

import (
	"context"
	"slices"
	"testing"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// TestStatusWithoutTheWorkloadCluster: an engine with no workload client (the
// identity may not read the cluster's Secrets) shows the machines as the
// management cluster has them and says that it read no more: no etcd member,
// no next step, which would need their health, and no error. The engine has
// only the roles status reads, the Reader and the Lease: a call to any other
// role, the Workload or Etcd included, panics.
func TestStatusWithoutTheWorkloadCluster(t *testing.T) {
	w := world(machineSpec{outdated: true}, machineSpec{}, machineSpec{deleting: true})
	f := newScripted(w)
	st, err := (&Engine{Reader: f, Lease: f}).Status(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !st.ManagementOnly || len(st.EtcdMembers) != 0 || st.Next != nil || len(st.Errors) != 0 {
		t.Errorf("managementOnly %v, %d members, next %v, errors %v: want true, none, none, none",
			st.ManagementOnly, len(st.EtcdMembers), st.Next, st.Errors)
	}
	if len(st.Machines) != 3 || st.Machines[0].UpToDate || !st.Machines[1].UpToDate || !st.Machines[2].Deleting {
		t.Errorf("machines %+v: want m0 outdated, m1 up to date, m2 deleting", st.Machines)
	}

	// With the workload cluster, the same control plane has members and a
	// next step.
	st, err = (&Engine{Reader: f, Lease: f, Workload: f, Etcd: f}).Status(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.ManagementOnly || len(st.EtcdMembers) == 0 || st.Next == nil {
		t.Errorf("with the workload cluster: managementOnly %v, %d members, next %v", st.ManagementOnly, len(st.EtcdMembers), st.Next)
	}
}

// withoutKubeadmConfigs is a scripted control plane whose identity may not
// read the machines' KubeadmConfigs, as controlplane.Client reports it: the
// machines named unjudged are those whose up-to-dateness it could not tell.
type withoutKubeadmConfigs struct {
	*scripted
	unjudged []string
}

func (w withoutKubeadmConfigs) KubeadmConfigsUnread() bool { return true }

func (w withoutKubeadmConfigs) Unjudged(cp *kcpstate.ControlPlane) collections.Machines {
	return cp.Machines.Filter(func(m *clusterv1.Machine) bool { return m != nil && slices.Contains(w.unjudged, m.Name) })
}

// TestStatusWithoutKubeadmConfigs: a machine whose up-to-dateness the read
// could not judge without its KubeadmConfig is shown neither up to date nor
// outdated but unknown; the others as judged; the status says the
// KubeadmConfigs were not read, and with the workload cluster it shows no
// next step, which would compare them, but says why.
func TestStatusWithoutKubeadmConfigs(t *testing.T) {
	w := world(machineSpec{outdated: true}, machineSpec{}, machineSpec{})
	names := w.CP.Machines.SortedByCreationTimestamp()
	f := withoutKubeadmConfigs{scripted: newScripted(w), unjudged: []string{names[2].Name}}
	for _, e := range []*Engine{{Reader: f, Lease: f}, {Reader: f, Lease: f, Workload: f, Etcd: f}} {
		st, err := e.Status(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !st.KubeadmConfigsNotRead || len(st.Machines) != 3 {
			t.Fatalf("kubeadmConfigsNotRead %v, %d machines: want true, 3", st.KubeadmConfigsNotRead, len(st.Machines))
		}
		type verdict struct{ upToDate, unknown bool }
		for i, want := range []verdict{{false, false}, {true, false}, {false, true}} {
			if m := st.Machines[i]; (verdict{m.UpToDate, m.UpToDateUnknown}) != want {
				t.Errorf("machine %s: upToDate %v, unknown %v; want %+v", m.Name, m.UpToDate, m.UpToDateUnknown, want)
			}
		}
		if st.Next != nil {
			t.Errorf("next %+v without the KubeadmConfigs: want none", st.Next)
		}
		if e.Workload != nil && len(st.Errors) != 1 {
			t.Errorf("with the workload cluster, errors %q: want one saying why there is no next step", st.Errors)
		}
	}
}

// TestStatusShowsAStaleMemberAsNext: status's next names the removal of a
// member no machine owns, and the member, as the loop would take it.
func TestStatusShowsAStaleMemberAsNext(t *testing.T) {
	f := newScripted(withMembers(world(machineSpec{}, machineSpec{}, machineSpec{}), staleLearner))
	st, err := (&Engine{Reader: f, Lease: f, Workload: f, Etcd: f}).Status(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.Next == nil || st.Next.Action != string(RemoveStaleMember) || st.Next.Member != staleLearner.String() {
		t.Fatalf("next %+v, want %s of %s", st.Next, RemoveStaleMember, staleLearner)
	}
}

// TestActing: a live lock is a run of this tool, named by its operation and
// holder (a run takes the lock before it pauses, and `pause` holds it
// without an operation); a lock that went unrenewed is nobody's; KCP acts
// only unpaused, by its own conditions; a paused KCP with no run is nobody's.
func TestActing(t *testing.T) {
	run := &record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "alice@ops/pid-1"}
	held := &record.Record{Operation: record.PauseOperation, Who: "bob@ops/pid-2"}
	live := &LockStatus{Holder: "alice@ops/pid-1-x", Live: true}
	expired := &LockStatus{Holder: "alice@ops/pid-1-x"}
	for _, tc := range []struct {
		name   string
		lock   *LockStatus
		rec    *record.Record
		paused bool
		busy   []string
		want   string
	}{
		{"a run", live, run, true, nil, "cp-rollout (upgrade by alice@ops/pid-1-x)"},
		{"a run before it pauses", live, nil, false, []string{"RollingOut"}, "cp-rollout (alice@ops/pid-1-x)"},
		{"pause holding the lock", live, held, true, nil, "cp-rollout (alice@ops/pid-1-x)"},
		{"a run that is gone", expired, run, true, nil, "nobody (KCP paused)"},
		{"KCP rolling out", nil, nil, false, []string{"RollingOut", "ScalingUp"}, "KCP (RollingOut, ScalingUp)"},
		{"KCP paused by someone", nil, nil, true, []string{"RollingOut"}, "nobody (KCP paused)"},
		{"KCP idle", expired, nil, false, nil, "nobody"},
	} {
		if got := Acting(tc.lock, tc.rec, tc.paused, tc.busy).String(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
