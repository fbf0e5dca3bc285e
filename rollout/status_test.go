package rollout

import (
	"context"
	"testing"
)

// TestStatusWithoutTheWorkloadCluster: an engine with no workload client (the
// identity may not read the cluster's Secrets) shows the machines as the
// management cluster has them and says that it read no more: no etcd member,
// no next step, which would need their health, and no error. The scripted
// control plane has no Workload or Etcd: a call to either panics.
func TestStatusWithoutTheWorkloadCluster(t *testing.T) {
	w := world(machineSpec{outdated: true}, machineSpec{}, machineSpec{deleting: true})
	f := newScripted(w)
	st, err := (&Engine{ControlPlane: f}).Status(context.Background())
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
	st, err = (&Engine{ControlPlane: f, Workload: f, Etcd: f}).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.ManagementOnly || len(st.EtcdMembers) == 0 || st.Next == nil {
		t.Errorf("with the workload cluster: managementOnly %v, %d members, next %v", st.ManagementOnly, len(st.EtcdMembers), st.Next)
	}
}

// TestStatusShowsAStaleMemberAsNext: status's next names the removal of a
// member no machine owns, and the member, as the loop would take it.
func TestStatusShowsAStaleMemberAsNext(t *testing.T) {
	f := newScripted(withMembers(world(machineSpec{}, machineSpec{}, machineSpec{}), staleLearner))
	st, err := (&Engine{ControlPlane: f, Workload: f, Etcd: f}).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Next == nil || st.Next.Action != string(RemoveStaleMember) || st.Next.Member != staleLearner.String() {
		t.Fatalf("next %+v, want %s of %s", st.Next, RemoveStaleMember, staleLearner)
	}
}
