package e2e

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/sim/simtest"
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

	// A CoreDNS pod on every node, so whichever machine goes first has a pod
	// to evict and its node is cordoned (a node with nothing to evict is not).
	dep := &appsv1.Deployment{}
	if err := wl.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "coredns"}, dep); err != nil {
		t.Fatal(err)
	}
	dep.Spec.Replicas = ptr.To(int32(3))
	if err := wl.Update(ctx, dep); err != nil {
		t.Fatal(err)
	}
	simtest.Eventually(t, time.Minute, "a CoreDNS pod on each of the three nodes", func(ctx context.Context) (bool, string, error) {
		pods := &corev1.PodList{}
		if err := wl.List(ctx, pods, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{"k8s-app": "kube-dns"}); err != nil {
			return false, "", err
		}
		nodes := map[string]bool{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
				nodes[p.Spec.NodeName] = true
			}
		}
		return len(nodes) == 3, strings.Join(slices.Sorted(maps.Keys(nodes)), ", "), nil
	})

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
