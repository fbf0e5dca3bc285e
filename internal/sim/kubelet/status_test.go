package kubelet_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cp-rollout/cp-rollout/internal/sim/kubelet"
)

func ready(t *testing.T, conditions []corev1.NodeCondition) corev1.NodeCondition {
	t.Helper()
	var found []corev1.NodeCondition
	for _, c := range conditions {
		if c.Type == corev1.NodeReady {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d Ready conditions in %+v, want one", len(found), conditions)
	}
	return found[0]
}

// A NotReady kubelet keeps posting the other conditions, and a node that
// comes back is Ready from the moment it came back, not from its birth.
func TestSetReadyTransitions(t *testing.T) {
	born := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	conditions := kubelet.NodeConditions(born)
	if len(conditions) != 4 {
		t.Fatalf("healthy node conditions %+v, want the three pressures and Ready", conditions)
	}
	if c := ready(t, conditions); c.Status != corev1.ConditionTrue || c.Reason != "KubeletReady" {
		t.Fatalf("healthy node Ready %+v", c)
	}

	broke := metav1.NewTime(born.Add(time.Hour))
	conditions = kubelet.SetReady(conditions, false, broke)
	c := ready(t, conditions)
	if c.Status != corev1.ConditionFalse || c.Reason != "KubeletNotReady" || c.Message == "" || !c.LastTransitionTime.Equal(&broke) {
		t.Fatalf("after the fault, Ready %+v; want False since %s with the kubelet's reason", c, broke)
	}
	if len(conditions) != 4 {
		t.Fatalf("conditions %+v, want the same four", conditions)
	}

	// Posting NotReady again keeps the transition time.
	later := metav1.NewTime(broke.Add(time.Minute))
	if c := ready(t, kubelet.SetReady(conditions, false, later)); !c.LastTransitionTime.Equal(&broke) || !c.LastHeartbeatTime.Equal(&later) {
		t.Fatalf("repeated NotReady %+v: want transition %s, heartbeat %s", c, broke, later)
	}

	back := metav1.NewTime(later.Add(time.Minute))
	if c := ready(t, kubelet.SetReady(conditions, true, back)); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&back) {
		t.Fatalf("after the undo, Ready %+v; want True since %s", c, back)
	}

	// A node without any Ready condition yet gets one.
	if c := ready(t, kubelet.SetReady(nil, false, born)); c.Status != corev1.ConditionFalse {
		t.Fatalf("Ready %+v, want False", c)
	}
}
