package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// Killed after the drain cordoned the victim's node and before the Machine's
// deletion went through (held by an admission webhook, then denied): the
// node stays cordoned, marked as the tool's. handback unpauses the KCP and
// gives the node back.
func TestKillAfterCordon(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	wl := e.Sim.WorkloadClient()

	// A pod on every node, so whichever machine goes first has a pod to
	// evict and its node is cordoned (a node with nothing to evict is not).
	// The simulator's kubelet stand-in runs the add-ons' pods alone: the test
	// ends these when they are evicted, as a kubelet would.
	nodes := &corev1.NodeList{}
	if err := wl.List(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "evictable-" + n.Name, OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "app", UID: "u", Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		}
		if err := wl.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		for ctx.Err() == nil {
			pods := &corev1.PodList{}
			_ = wl.List(ctx, pods, client.InNamespace(metav1.NamespaceDefault))
			for i := range pods.Items {
				if p := &pods.Items[i]; p.DeletionTimestamp != nil {
					_ = wl.Delete(ctx, p, client.GracePeriodSeconds(0))
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()

	g := openGate(t, e, admissionregistrationv1.Delete, func(*admissionv1.AdmissionRequest) bool { return true })
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	req := g.Wait(t)
	run.Kill()
	g.open()

	m := &clusterv1.Machine{}
	if err := e.Sim.ManagementClient().Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, m); err != nil {
		t.Fatal(err)
	}
	if !m.DeletionTimestamp.IsZero() {
		t.Fatalf("machine %s is deleting: the kill came after its deletion", m.Name)
	}
	node := &corev1.Node{}
	key := client.ObjectKey{Name: m.Status.NodeRef.Name}
	if err := wl.Get(ctx, key, node); err != nil {
		t.Fatal(err)
	}
	if _, marked := node.Annotations[workload.CordonedAnnotation]; !node.Spec.Unschedulable || !marked {
		t.Fatalf("after the kill node %s is unschedulable=%v with annotations %v: want it cordoned and marked by the drain", node.Name, node.Spec.Unschedulable, node.Annotations)
	}

	breakLock(t, e)
	r := e.Plugin(t, ctx, "handback", "demo")
	if r.Code != 0 || !strings.Contains(r.Stdout, "uncordoned node(s) "+node.Name) {
		t.Fatalf("handback: exit %d, stdout %q; want node %s uncordoned", r.Code, r.Stdout, node.Name)
	}
	if err := wl.Get(ctx, key, node); err != nil {
		t.Fatal(err)
	}
	if _, marked := node.Annotations[workload.CordonedAnnotation]; node.Spec.Unschedulable || marked {
		t.Errorf("after handback node %s is unschedulable=%v with annotations %v", node.Name, node.Spec.Unschedulable, node.Annotations)
	}
}
