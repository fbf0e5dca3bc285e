package controlplane

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

func TestOrphansAmong(t *testing.T) {
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "cp", UID: "kcp-uid"}}
	byKCP := metav1.OwnerReference{APIVersion: controlplanev1.GroupVersion.String(), Kind: "KubeadmControlPlane", Name: "cp", UID: "kcp-uid"}
	byOtherKCP := byKCP
	byOtherKCP.UID = "older-kcp-uid"
	byMachine := metav1.OwnerReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: "m1", UID: "m1-uid"}
	config := func(name string, deleting bool, owners ...metav1.OwnerReference) client.Object {
		c := &bootstrapv1.KubeadmConfig{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name), OwnerReferences: owners}}
		if deleting {
			c.DeletionTimestamp = &metav1.Time{}
			c.Finalizers = []string{"x"}
		}
		return c
	}
	machine := clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m1"}}
	machine.Spec.InfrastructureRef.Name = "m1-infra"
	machine.Spec.Bootstrap.ConfigRef.Name = "m1-config"

	got := orphansAmong([]client.Object{
		config("orphan", false, byKCP),           // the one orphan
		config("m1", false, byKCP),               // shares its Machine's name, not yet owned
		config("m1-config", false, byKCP),        // named by a Machine, not yet owned
		config("owned", false, byKCP, byMachine), // taken over by a Machine
		config("going", true, byKCP),             // already deleting
		config("foreign", false),                 // not made by KCP's desired state
		config("another-kcp", false, byOtherKCP), // made for another KubeadmControlPlane of that name
	}, []clusterv1.Machine{machine}, kcp)
	if len(got) != 1 || got[0].GetName() != "orphan" {
		var names []string
		for _, o := range got {
			names = append(names, o.GetName())
		}
		t.Fatalf("orphans %v, want [orphan]", names)
	}
}
