package inplace

import (
	"testing"

	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
)

// TestDefaultNodeDeletionTimeoutIsTheWebhooks: the local default gives what
// Cluster API's Machine webhook gives, for an unset timeout and a set one.
func TestDefaultNodeDeletionTimeoutIsTheWebhooks(t *testing.T) {
	for _, set := range []*int32{nil, ptr.To[int32](0), ptr.To[int32](42)} {
		ours, theirs := &clusterv1.Machine{}, &clusterv1.Machine{}
		ours.Spec.Deletion.NodeDeletionTimeoutSeconds, theirs.Spec.Deletion.NodeDeletionTimeoutSeconds = ptr.To(ptr.Deref(set, 0)), ptr.To(ptr.Deref(set, 0))
		if set == nil {
			ours.Spec.Deletion.NodeDeletionTimeoutSeconds, theirs.Spec.Deletion.NodeDeletionTimeoutSeconds = nil, nil
		}
		defaultNodeDeletionTimeout(ours)
		coreadmission.DefaultMachineNodeDeletionTimeoutSeconds(theirs)
		if got, want := ptr.Deref(ours.Spec.Deletion.NodeDeletionTimeoutSeconds, -1), ptr.Deref(theirs.Spec.Deletion.NodeDeletionTimeoutSeconds, -1); got != want {
			t.Errorf("set %v: ours %d, the webhook's %d", set, got, want)
		}
	}
}
