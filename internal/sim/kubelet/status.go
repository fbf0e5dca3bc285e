package kubelet

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The stand-in serves port-forward only; the simulator writes the Node's
// status on the kubelet's behalf. These are the conditions a kubelet posts,
// in one place, so a healthy node and one whose kubelet reports NotReady
// (the node-not-ready fault) read as they would from a real kubelet.

// notReadyMessage is what a kubelet whose container network is down posts,
// the commonest NotReady a runbook meets.
const notReadyMessage = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"

// NodeConditions are the conditions of a healthy node as its kubelet first
// posts them: no memory, disk or PID pressure, and Ready. The Machine
// controller's NodeHealthy condition waits for all four.
func NodeConditions(now metav1.Time) []corev1.NodeCondition {
	return SetReady([]corev1.NodeCondition{{
		Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory",
		Message: "kubelet has sufficient memory available", LastHeartbeatTime: now, LastTransitionTime: now,
	}, {
		Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure",
		Message: "kubelet has no disk pressure", LastHeartbeatTime: now, LastTransitionTime: now,
	}, {
		Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID",
		Message: "kubelet has sufficient PID available", LastHeartbeatTime: now, LastTransitionTime: now,
	}}, true, now)
}

// SetReady returns conditions with the Ready condition as a kubelet posts
// it: True (KubeletReady) or False (KubeletNotReady, with the reason the
// kubelet gives). The transition time moves only when the status changes,
// as the kubelet keeps it; the heartbeat is now.
func SetReady(conditions []corev1.NodeCondition, ready bool, now metav1.Time) []corev1.NodeCondition {
	want := corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "simulated kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
	}
	if !ready {
		want.Status, want.Reason, want.Message = corev1.ConditionFalse, "KubeletNotReady", notReadyMessage
	}
	out := make([]corev1.NodeCondition, 0, len(conditions)+1)
	found := false
	for _, c := range conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == want.Status {
				want.LastTransitionTime = c.LastTransitionTime
			}
			c, found = want, true
		}
		out = append(out, c)
	}
	if !found {
		out = append(out, want)
	}
	return out
}
