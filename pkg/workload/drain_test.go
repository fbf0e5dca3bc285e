package workload

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
	"github.com/cp-rollout/cp-rollout/pkg/requests"
)

// TestDrainEvictsWhatClusterAPIWould, on a real API server: the node is
// cordoned; a ReplicaSet's pod is evicted and waited for until it is gone,
// and so is one that lands on the node while the drain waits;
// a DaemonSet's pod, a static pod's mirror, a pod labelled for Cluster API's
// drain and a pod of another node are left alone; a pod that does not end
// within the limit is named in Left; Uncordon gives the node back. A node
// with nothing to evict is not cordoned: Cluster API's drain does that.
// The wait follows the pods through a watch: its requests do not grow with
// its length, as a poll's would.
func TestDrainEvictsWhatClusterAPIWould(t *testing.T) {
	cfg := apiservertest.Start(t)
	cfg.QPS, cfg.Burst = 50, 100 // as New sets them
	kube := kubernetes.NewForConfigOrDie(cfg)
	var sent requests.Counter
	counted := rest.CopyConfig(cfg)
	counted.Wrap(sent.Wrap)
	c, err := newClient(counted)
	if err != nil {
		t.Fatal(err)
	}
	c.Name = "default/demo"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, name := range []string{"cp-1", "cp-2", "cp-3"} {
		n, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name, node, owner string, mutate func(*corev1.Pod)) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "c"}}},
		}
		if owner != "" {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: owner, Name: "o", UID: "u", Controller: ptr.To(true)}}
		}
		if mutate != nil {
			mutate(p)
		}
		if _, err := kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod("coredns", "cp-1", "ReplicaSet", nil)
	pod("stuck", "cp-1", "ReplicaSet", nil)
	pod("kube-proxy", "cp-1", "DaemonSet", nil)
	pod("etcd-cp-1", "cp-1", "", func(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"} })
	pod("keep", "cp-1", "ReplicaSet", func(p *corev1.Pod) { p.Labels = map[string]string{clusterv1.PodDrainLabel: "skip"} })
	pod("elsewhere", "cp-2", "ReplicaSet", nil)
	pod("kube-proxy-3", "cp-3", "DaemonSet", nil)

	// No kubelet here: stand in for one, ending each evicted pod a moment
	// later, except "stuck", which never ends.
	go func() {
		for ctx.Err() == nil {
			pods, _ := kube.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil && p.Name != "stuck" {
					_ = kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
				}
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()

	// A pod the scheduler placed just before the cordon took, seen by the
	// drain only once it has begun to wait.
	go func() {
		time.Sleep(time.Second)
		late := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "late", OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "o", UID: "u", Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: "cp-1", Containers: []corev1.Container{{Name: "c", Image: "c"}}},
		}
		if _, err := kube.CoreV1().Pods(late.Namespace).Create(ctx, late, metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
	}()
	d, err := c.Drain(ctx, "cp-1", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(d.Evicted)
	if !d.Cordoned || !slices.Equal(d.Evicted, []string{"default/coredns", "default/late", "default/stuck"}) {
		t.Fatalf("drain: %+v; want cp-1 cordoned and coredns, late and stuck evicted", d)
	}
	// The node, the cordon, the node's pods listed before it and after it, a
	// watch of them, three evictions and one list again after drainRelist; a
	// look every 200 ms would have made fifteen lists in the three seconds.
	if n := sent.Load(); n > 9 {
		t.Errorf("the drain made %d requests; want at most 9", n)
	}
	if !strings.Contains(d.Left, "still terminating") || !strings.Contains(d.Left, "default/stuck") || strings.Contains(d.Left, "coredns") {
		t.Fatalf("left: %q; want only the pod that does not end named", d.Left)
	}
	left, err := kube.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range left.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	if want := []string{"elsewhere", "etcd-cp-1", "keep", "kube-proxy", "kube-proxy-3"}; !slices.Equal(names, want) {
		t.Fatalf("pods left running: %v; want %v", names, want)
	}
	if n, _ := kube.CoreV1().Nodes().Get(ctx, "cp-2", metav1.GetOptions{}); n.Spec.Unschedulable {
		t.Fatal("the other node was cordoned")
	}
	d, err = c.Drain(ctx, "cp-3", 3*time.Second)
	if err != nil || d.Cordoned || len(d.Evicted) > 0 || d.Left != "" {
		t.Fatalf("drain of a node with nothing to evict: %+v, %v; want nothing done", d, err)
	}
	if n, _ := kube.CoreV1().Nodes().Get(ctx, "cp-3", metav1.GetOptions{}); n.Spec.Unschedulable {
		t.Fatal("cp-3, with nothing to evict, was cordoned")
	}
	if err := c.Uncordon(ctx, "cp-1"); err != nil {
		t.Fatal(err)
	}
	if n, _ := kube.CoreV1().Nodes().Get(ctx, "cp-1", metav1.GetOptions{}); n.Spec.Unschedulable {
		t.Fatal("Uncordon left cp-1 unschedulable")
	}
}

// TestDrainSeesPodsGoneWithoutWatchEvents: behind a proxy whose watches stay
// open and silent (one that drops watch events, or an API server that serves
// watches poorly, as Cluster API's in-memory backend does), the drain sees
// the evicted pod gone, and the pod that lands on the node while it waits,
// by listing the node's pods again: it ends within seconds of the last pod's
// end, not at its limit with pods long gone named "still terminating".
func TestDrainSeesPodsGoneWithoutWatchEvents(t *testing.T) {
	cfg := apiservertest.Start(t)
	kube := kubernetes.NewForConfigOrDie(cfg)
	c, err := newClient(silentWatches(t, cfg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name, OwnerReferences: []metav1.OwnerReference{
				{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "o", UID: "u", Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: "cp-1", Containers: []corev1.Container{{Name: "c", Image: "c"}}},
		}
	}
	if _, err := kube.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, pod("coredns"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	go func() { // the kubelet ends each evicted pod a moment later
		for ctx.Err() == nil {
			pods, _ := kube.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil {
					_ = kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	go func() { // a pod placed just before the cordon took
		time.Sleep(500 * time.Millisecond)
		if _, err := kube.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, pod("late"), metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
	}()
	const limit = 15 * time.Second
	began := time.Now()
	d, err := c.Drain(ctx, "cp-1", limit)
	took := time.Since(began)
	slices.Sort(d.Evicted)
	if err != nil || d.Left != "" || !slices.Equal(d.Evicted, []string{"default/coredns", "default/late"}) {
		t.Fatalf("drain: %+v, %v; want coredns and late evicted and nothing left", d, err)
	}
	// The late pod is found by the list after one drainRelist, gone by the
	// next.
	if took > 3*drainRelist+time.Second {
		t.Fatalf("the drain took %s for pods gone within a second of their eviction; want at most %s", took.Round(100*time.Millisecond), 3*drainRelist+time.Second)
	}
	t.Logf("drained in %s behind silent watches", took.Round(100*time.Millisecond))
}

// TestDrainIgnoresBookmarks: a watch BOOKMARK (a Pod with only a
// resourceVersion), sent though the drain did not ask for one, is not taken
// for a pod to evict and wait for: the drain ends when the real pod is gone.
func TestDrainIgnoresBookmarks(t *testing.T) {
	cfg := apiservertest.Start(t)
	kube := kubernetes.NewForConfigOrDie(cfg)
	c, err := newClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.Watching = bookmarking{c.Watching}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "coredns", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "o", UID: "u", Controller: ptr.To(true)}}},
		Spec: corev1.PodSpec{NodeName: "cp-1", Containers: []corev1.Container{{Name: "c", Image: "c"}}},
	}
	if _, err := kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	go func() { // the kubelet ends the evicted pod
		for ctx.Err() == nil {
			if got, err := kube.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{}); err == nil && got.DeletionTimestamp != nil {
				_ = kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	d, err := c.Drain(ctx, "cp-1", 5*time.Second)
	if err != nil || d.Left != "" || !slices.Equal(d.Evicted, []string{"default/coredns"}) {
		t.Fatalf("drain: %+v, %v; want coredns evicted and nothing left", d, err)
	}
}

// bookmarking is a workload clientset whose pod watches start with a
// BOOKMARK event, as an API server may send one unasked.
type bookmarking struct{ Kube }

func (b bookmarking) CoreV1() corev1client.CoreV1Interface { return bookmarkingCore{b.Kube.CoreV1()} }

type bookmarkingCore struct{ corev1client.CoreV1Interface }

func (b bookmarkingCore) Pods(namespace string) corev1client.PodInterface {
	return bookmarkingPods{b.CoreV1Interface.Pods(namespace)}
}

type bookmarkingPods struct{ corev1client.PodInterface }

func (b bookmarkingPods) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := b.PodInterface.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	events := make(chan watch.Event)
	go func() {
		defer close(events)
		bookmark := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: opts.ResourceVersion}}
		select {
		case events <- watch.Event{Type: watch.Bookmark, Object: bookmark}:
		case <-ctx.Done():
			return
		}
		for ev := range w.ResultChan() {
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return watch.NewProxyWatcher(events), nil
}
