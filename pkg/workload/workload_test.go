package workload

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
)

// TestNodesReadsTheControlPlaneByLabel: nodes and static pods are found as KCP
// finds them, by kubeadm's labels, on a real API server: a node without the
// control-plane label is not one of the control plane's, a pod without
// tier=control-plane is not its static pod, and what is found reports its own
// readiness and address.
func TestNodesReadsTheControlPlaneByLabel(t *testing.T) {
	cfg := apiservertest.Start(t)
	kube := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	node := func(name string, controlPlane, ready bool, ip string) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if controlPlane {
			n.Labels[ControlPlaneNodeLabel] = ""
		}
		n, err := kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}
		if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(component, nodeName string, static, ready bool) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: component + "-" + nodeName,
				Labels: map[string]string{"component": component}},
			Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: component, Image: component}}},
		}
		if static {
			p.Labels["tier"] = "control-plane"
		}
		p, err := kube.CoreV1().Pods(metav1.NamespaceSystem).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		if _, err := kube.CoreV1().Pods(metav1.NamespaceSystem).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	node("cp-1", true, true, "10.0.0.1")
	node("cp-2", true, false, "10.0.0.2")
	node("unlabelled", false, true, "10.0.0.3")
	node("worker", false, true, "10.0.0.4")
	pod("kube-apiserver", "cp-1", true, true)
	pod("etcd", "cp-1", true, false)
	pod("kube-scheduler", "cp-1", false, true) // not kubeadm's: no tier label
	pod("kube-apiserver", "unlabelled", true, true)

	c := &Client{Config: cfg, Kube: kube, Name: "default/demo"}
	components := []string{"etcd", "kube-apiserver", "kube-scheduler"}
	got, err := c.Nodes(ctx, []string{"cp-1", "cp-2", "unlabelled", "gone"}, components)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("read %d nodes, want the 4 asked for: %v", len(got), got)
	}
	if n := got["cp-1"]; !n.Found || !n.Ready || n.InternalIP != "10.0.0.1" ||
		!n.Pods["kube-apiserver"] || n.Pods["etcd"] || n.Pods["kube-scheduler"] {
		t.Errorf("cp-1 read as %+v; want found, Ready, 10.0.0.1, kube-apiserver Ready, etcd not Ready, kube-scheduler missing", n)
	}
	if n := got["cp-1"]; n.Problem(components) != "static pod etcd-cp-1 not Ready" {
		t.Errorf("cp-1's problem: %q", n.Problem(components))
	}
	if n := got["cp-2"]; !n.Found || n.Ready || n.Problem(components) != "node cp-2 not Ready" {
		t.Errorf("cp-2 read as %+v, problem %q", n, n.Problem(components))
	}
	for _, name := range []string{"unlabelled", "gone"} {
		if n := got[name]; n.Found || n.Name != name {
			t.Errorf("%s read as %+v; want not found among the control-plane nodes", name, n)
		}
	}
}

// TestWatchesOutliveTheRequestTimeout: a workload cluster's configuration
// bounds every request (Cluster API's 10 s, 1 s here), a watch's stream
// included; the clients for watches keep a watch open past it, and it still
// delivers.
func TestWatchesOutliveTheRequestTimeout(t *testing.T) {
	cfg := apiservertest.Start(t)
	cfg.Timeout = time.Second
	c, err := newClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	watchNodes := func(kube Kube) <-chan watch.Event {
		w, err := kube.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
		return w.ResultChan()
	}
	bounded, watching := watchNodes(c.Kube), watchNodes(c.Watching)
	deadline := time.After(3 * time.Second)
	for bounded != nil {
		select {
		case _, open := <-bounded:
			if !open {
				bounded = nil // the premise: a bounded watch ends
			}
		case <-deadline:
			t.Fatal("a watch on the bounded clients outlived the request timeout: the test shows nothing")
		}
	}
	select {
	case e, open := <-watching:
		t.Fatalf("the watch for informers ended or changed before anything happened: %v %v", e.Type, open)
	case <-time.After(time.Second):
	}
	if _, err := c.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case e, open := <-watching:
		if !open || e.Type != watch.Added {
			t.Fatalf("the watch for informers: %v %v, want the node added", e.Type, open)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch for informers did not deliver a node created after the request timeout")
	}
}
