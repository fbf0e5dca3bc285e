package sim_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// TestFaultAnnotations: each fault asked for with the fault annotation, as
// kubectl annotate or cp-rollout-sim fault ask for it, takes effect where the
// tool and Cluster API look (etcd, the workload cluster's pods and nodes,
// the Eviction API, the Machine controller's drain), is recorded on the
// object, and is undone when the annotation goes. Without the KCP
// controller, which would otherwise remediate, scale and clean up around
// the faults.
func TestFaultAnnotations(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, sim.Options{Replicas: 3, WithoutKCP: true, ProvisionDelay: 200 * time.Millisecond, DeleteDelay: 200 * time.Millisecond}).Sim
	ctx := context.Background()
	c, w := s.ManagementClient(), s.WorkloadClient()
	machines, err := s.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	machine := func(i int) (*clusterv1.Machine, string) {
		return &machines[i], machines[i].Status.NodeRef.Name
	}

	t.Run("etcd-stopped stops the member, its undo restarts it", func(t *testing.T) {
		m, node := machine(0)
		setFault(t, c, m, "etcd-stopped")
		awaitApplied(t, c, m, "etcd-stopped")
		awaitEvent(t, c, m, "FaultApplied", "etcd member of node "+node+" stopped")
		awaitMemberHealthy(t, s, node, false)

		setFault(t, c, m, "")
		awaitApplied(t, c, m, "")
		awaitMemberHealthy(t, s, node, true)
	})

	t.Run("a static pod unready and the node NotReady, an unknown fault reported", func(t *testing.T) {
		m, node := machine(1)
		setFault(t, c, m, "kube-apiserver-unready,node-not-ready,kubelet-unready")
		awaitApplied(t, c, m, "kube-apiserver-unready,node-not-ready")
		awaitEvent(t, c, m, "UnknownFault", `unknown machine fault "kubelet-unready"`)
		if ready := podReady(t, w, "kube-apiserver-"+node); ready {
			t.Error("kube-apiserver pod Ready with kube-apiserver-unready applied")
		}
		if ready := podReady(t, w, "etcd-"+node); !ready {
			t.Error("etcd pod not Ready: the fault named kube-apiserver only")
		}
		if ready, tainted := nodeReady(t, w, node); ready || !tainted {
			t.Errorf("node Ready %t, not-ready taint %t; want NotReady and tainted", ready, tainted)
		}
		// The Machine controller sees it, as it would a real node's.
		simtest.Eventually(t, time.Minute, "the Machine's NodeReady condition False", func(ctx context.Context) (bool, string, error) {
			got := &clusterv1.Machine{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
				return false, "", err
			}
			cond := conditions.Get(got, clusterv1.MachineNodeReadyCondition)
			return cond != nil && cond.Status == metav1.ConditionFalse, fmt.Sprintf("%+v", cond), nil
		})

		setFault(t, c, m, "")
		awaitApplied(t, c, m, "")
		if ready := podReady(t, w, "kube-apiserver-"+node); !ready {
			t.Error("kube-apiserver pod not Ready after the undo")
		}
		if ready, tainted := nodeReady(t, w, node); !ready || tainted {
			t.Errorf("after the undo, node Ready %t, not-ready taint %t; want Ready, untainted", ready, tainted)
		}
	})

	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, s.ClusterKey(), cluster); err != nil {
		t.Fatal(err)
	}

	t.Run("stale-learner adds an unnamed learner, its undo removes it", func(t *testing.T) {
		setFault(t, c, cluster, "stale-learner")
		awaitApplied(t, c, cluster, "stale-learner")
		if n := strayLearners(t, s); n != 1 {
			t.Fatalf("%d unnamed learners, want the fault's one", n)
		}
		setFault(t, c, cluster, "")
		awaitApplied(t, c, cluster, "")
		if n := strayLearners(t, s); n != 0 {
			t.Fatalf("%d unnamed learners after the undo, want none", n)
		}
	})

	t.Run("never-provision holds the next machine until undone", func(t *testing.T) {
		setFault(t, c, cluster, "never-provision")
		awaitApplied(t, c, cluster, "never-provision")
		held := createMachineAndWait(t, s)
		if held.Spec.ProviderID != "" {
			t.Fatalf("machine %s provisioned (%s) with never-provision applied", held.Name, held.Spec.ProviderID)
		}
		setFault(t, c, cluster, "")
		awaitApplied(t, c, cluster, "")
		simtest.Eventually(t, 2*time.Minute, "the held machine's node", func(ctx context.Context) (bool, string, error) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(held), held); err != nil {
				return false, "", err
			}
			return held.Status.NodeRef.IsDefined(), "no nodeRef yet", nil
		})
	})

	t.Run("drain-blocked refuses evictions to the tool's drain and Cluster API's until undone", func(t *testing.T) {
		m, node := machine(2)
		setFault(t, c, m, "drain-blocked")
		awaitApplied(t, c, m, "drain-blocked")
		blocker := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: sim.DrainBlockerNamespace, Name: "drain-blocker-" + node}}

		// The Eviction API, which both drains call.
		err := w.SubResource("eviction").Create(ctx, blocker, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: blocker.Namespace, Name: blocker.Name}})
		if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "disruption budget") {
			t.Fatalf("eviction of %s: %v; want 429 for the disruption budget", blocker.Name, err)
		}

		// The tool's drain evicts it and leaves it, blocked, to Cluster API.
		wl, err := workload.New(ctx, c, cluster.Namespace, cluster.Name)
		if err != nil {
			t.Fatal(err)
		}
		drained, err := wl.Drain(ctx, node, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// CoreDNS may be on the node and go; the blocker may not.
		if !strings.Contains(drained.Left, blocker.Name) || !strings.Contains(drained.Left, "disruption budget") || slices.Contains(drained.Evicted, blocker.Namespace+"/"+blocker.Name) {
			t.Fatalf("tool's drain: %+v; want %s left for the disruption budget", drained, blocker.Name)
		}

		// Cluster API's drain, on the Machine's deletion, waits for it.
		if err := c.Delete(ctx, m); err != nil {
			t.Fatal(err)
		}
		deleting := func(ctx context.Context, reason, message string) (bool, string, error) {
			got := &clusterv1.Machine{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
				return false, "", err
			}
			cond := conditions.Get(got, clusterv1.MachineDeletingCondition)
			if cond == nil {
				return false, "no Deleting condition", nil
			}
			return cond.Reason == reason && strings.Contains(cond.Message, message), cond.Reason + ": " + cond.Message, nil
		}
		simtest.Eventually(t, time.Minute, "Cluster API's drain refused by the budget", func(ctx context.Context) (bool, string, error) {
			return deleting(ctx, clusterv1.MachineDeletingDrainingNodeReason, "cannot evict pod as it would violate the pod's disruption budget")
		})

		setFault(t, c, m, "")
		awaitApplied(t, c, m, "")
		for _, o := range []client.Object{blocker, &policyv1.PodDisruptionBudget{ObjectMeta: blocker.ObjectMeta}} {
			if err := w.Get(ctx, client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
				t.Errorf("%T %s after the undo: %v, want it gone", o, o.GetName(), err)
			}
		}
		// Cluster API's drain retries every 20 s and now completes; with no
		// KCP controller the machine stops at KCP's pre-terminate hook.
		simtest.Eventually(t, time.Minute, "the drain done, the machine at the pre-terminate hook", func(ctx context.Context) (bool, string, error) {
			return deleting(ctx, clusterv1.MachineDeletingWaitingForPreTerminateHookReason, "")
		})
	})
}

// setFault writes the fault annotation with a merge patch, as kubectl
// annotate does; "" removes it.
func setFault(t *testing.T, c client.Client, obj client.Object, value string) {
	t.Helper()
	if err := c.Patch(context.Background(), obj, client.RawPatch(types.MergePatchType, sim.AnnotationPatch(sim.FaultAnnotation, value))); err != nil {
		t.Fatal(err)
	}
}

// awaitApplied waits for the simulator's record of the faults in effect.
func awaitApplied(t *testing.T, c client.Client, obj client.Object, want string) {
	t.Helper()
	simtest.Eventually(t, time.Minute, fmt.Sprintf("%s applied to %s", want, obj.GetName()), func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, "", err
		}
		got := obj.GetAnnotations()[sim.FaultAppliedAnnotation]
		return got == want, fmt.Sprintf("applied %q", got), nil
	})
}

// awaitEvent waits for an Event on obj with reason whose message contains
// message.
func awaitEvent(t *testing.T, c client.Client, obj client.Object, reason, message string) {
	t.Helper()
	simtest.Eventually(t, 30*time.Second, "Event "+reason+" on "+obj.GetName(), func(ctx context.Context) (bool, string, error) {
		list := &corev1.EventList{}
		if err := c.List(ctx, list, client.InNamespace(obj.GetNamespace())); err != nil {
			return false, "", err
		}
		var seen []string
		for _, e := range list.Items {
			if e.InvolvedObject.UID != obj.GetUID() {
				continue
			}
			if e.Reason == reason && strings.Contains(e.Message, message) {
				return true, "", nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, fmt.Sprintf("events %q", seen), nil
	})
}

func awaitMemberHealthy(t *testing.T, s *sim.Sim, node string, healthy bool) {
	t.Helper()
	simtest.Eventually(t, time.Minute, fmt.Sprintf("member %s healthy=%t", node, healthy), func(ctx context.Context) (bool, string, error) {
		members, err := s.EtcdMembers(ctx)
		if err != nil {
			return false, "", err
		}
		for _, m := range members {
			if m.Name == node {
				return m.Healthy == healthy, fmt.Sprintf("%+v", m), nil
			}
		}
		return false, "member not listed", nil
	})
}

func podReady(t *testing.T, w client.Client, name string) bool {
	t.Helper()
	pod := &corev1.Pod{}
	if err := w.Get(context.Background(), client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: name}, pod); err != nil {
		t.Fatal(err)
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(t *testing.T, w client.Client, name string) (ready, tainted bool) {
	t.Helper()
	node := &corev1.Node{}
	if err := w.Get(context.Background(), client.ObjectKey{Name: name}, node); err != nil {
		t.Fatal(err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	for _, taint := range node.Spec.Taints {
		tainted = tainted || taint.Key == corev1.TaintNodeNotReady
	}
	return ready, tainted
}

func strayLearners(t *testing.T, s *sim.Sim) int {
	t.Helper()
	members, err := s.EtcdMembers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range members {
		if m.Name == "" && m.IsLearner {
			n++
		}
	}
	return n
}
