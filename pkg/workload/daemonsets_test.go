package workload

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// TestDaemonSetsUnready: a DaemonSet Ready on a peer must be Ready on the
// new node; one Ready on no peer, a pod no DaemonSet controls and a
// DaemonSet that does not run on the peers are not waited for.
func TestDaemonSetsUnready(t *testing.T) {
	type podSpec struct {
		namespace, name, node, daemonSet string
		ready, terminating               bool
		waiting                          string // a container's waiting reason
	}
	pod := func(s podSpec) runtime.Object {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: s.name}, Spec: corev1.PodSpec{NodeName: s.node}}
		if s.daemonSet != "" {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: s.daemonSet, Controller: ptr.To(true)}}
		}
		if s.terminating {
			p.DeletionTimestamp = ptr.To(metav1.Now())
			p.Finalizers = []string{"test"}
		}
		p.Status.Phase = corev1.PodRunning
		status := corev1.ConditionFalse
		if s.ready {
			status = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, Reason: "ContainersNotReady"}}
		cs := corev1.ContainerStatus{Name: s.daemonSet, Ready: s.ready}
		if s.waiting != "" {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: s.waiting}
		}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{cs}
		return p
	}
	peers := []runtime.Object{
		pod(podSpec{"kube-system", "kube-proxy-old", "old-1", "kube-proxy", true, false, ""}),
		pod(podSpec{"kube-system", "cilium-old", "old-2", "cilium", true, false, ""}),
		// Broken everywhere before the run: not the new node's doing.
		pod(podSpec{"monitoring", "agent-old", "old-1", "agent", false, false, "CrashLoopBackOff"}),
		// No DaemonSet's.
		pod(podSpec{"default", "web", "old-1", "", true, false, ""}),
	}
	for _, tc := range []struct {
		name  string
		onNew []runtime.Object
		peers []string
		want  []string // String() of each, in order
	}{
		{name: "all Ready", peers: []string{"old-1", "old-2"}, onNew: []runtime.Object{
			pod(podSpec{"kube-system", "kube-proxy-new", "new", "kube-proxy", true, false, ""}),
			pod(podSpec{"kube-system", "cilium-new", "new", "cilium", true, false, ""}),
		}},
		{name: "one Running, not Ready; one missing", peers: []string{"old-1", "old-2"}, onNew: []runtime.Object{
			pod(podSpec{"kube-system", "kube-proxy-new", "new", "kube-proxy", false, false, ""}),
		}, want: []string{
			"DaemonSet kube-system/cilium has no pod on node new",
			"DaemonSet kube-system/kube-proxy: pod kube-proxy-new on node new is Running, not Ready: container kube-proxy not ready",
		}},
		{name: "a container's reason", peers: []string{"old-1"}, onNew: []runtime.Object{
			pod(podSpec{"kube-system", "kube-proxy-new", "new", "kube-proxy", false, false, "ImagePullBackOff"}),
		}, want: []string{"DaemonSet kube-system/kube-proxy: pod kube-proxy-new on node new is Running, not Ready: container kube-proxy ImagePullBackOff"}},
		{name: "an old pod going beside a Ready new one", peers: []string{"old-1"}, onNew: []runtime.Object{
			pod(podSpec{"kube-system", "kube-proxy-a", "new", "kube-proxy", false, true, ""}),
			pod(podSpec{"kube-system", "kube-proxy-b", "new", "kube-proxy", true, false, ""}),
		}},
		{name: "only a terminating pod", peers: []string{"old-1"}, onNew: []runtime.Object{
			pod(podSpec{"kube-system", "kube-proxy-a", "new", "kube-proxy", true, true, ""}),
		}, want: []string{"DaemonSet kube-system/kube-proxy: pod kube-proxy-a on node new is Running, terminating"}},
		{name: "no peers", peers: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Client{Kube: fake.NewClientset(append(append([]runtime.Object{}, peers...), tc.onNew...)...), Name: "default/demo"}
			got, err := c.DaemonSetsUnready(t.Context(), "new", tc.peers)
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, u := range got {
				lines = append(lines, u.String())
			}
			if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
