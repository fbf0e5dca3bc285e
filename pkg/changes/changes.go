// Package changes answers "has anything the rollout loop waits on changed?":
// control-plane Machines on the management cluster, control-plane Nodes and
// their static Pods on the workload cluster. The loop only learns when to read
// again from it; every decision is made on a fresh live read, never on what
// the watches saw.
package changes

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	wl "github.com/cp-rollout/cp-rollout/pkg/workload"
)

// Signal is a level signal: it fires (coalesced) whenever a control-plane
// Machine of the cluster, a control-plane Node or a static control-plane Pod
// changes.
// Informers are used for their reconnects: a restarted API server is
// re-listed and re-watched.
type Signal struct {
	C <-chan struct{}
}

var machinesResource = schema.GroupVersionResource{Group: clusterv1.GroupVersion.Group, Version: clusterv1.GroupVersion.Version, Resource: "machines"}

// Watch starts the watches; they stop with ctx.
func Watch(ctx context.Context, mgmt *rest.Config, namespace, cluster string, workload wl.Kube) (*Signal, error) {
	c := make(chan struct{}, 1)
	notify := func() {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}
	// Only the fact of a change matters: keep nothing of the objects.
	strip := func(obj any) (any, error) {
		if o, ok := obj.(metav1.Object); ok {
			o.SetManagedFields(nil)
			o.SetAnnotations(nil)
		}
		return obj, nil
	}

	dyn, err := dynamic.NewForConfig(mgmt)
	if err != nil {
		return nil, err
	}
	machines := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = clusterv1.ClusterNameLabel + "=" + cluster + "," + clusterv1.MachineControlPlaneLabel
	}).ForResource(machinesResource).Informer()

	// Only the control plane's nodes and static pods, selected as the
	// snapshot reads them: on a large cluster the other nodes and the
	// kube-system pods of every node change all the time, and each change
	// would cost a read.
	// Built as client-go's informer factory builds them, without linking the
	// factory: it reaches every API group's informer, lister and client.
	core := workload.CoreV1()
	nodes := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = wl.ControlPlaneNodeLabel
			return core.Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = wl.ControlPlaneNodeLabel
			return core.Nodes().Watch(ctx, o)
		},
	}, workload), &corev1.Node{}, 0, cache.Indexers{})
	pods := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = wl.StaticPodSelector
			return core.Pods(metav1.NamespaceSystem).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = wl.StaticPodSelector
			return core.Pods(metav1.NamespaceSystem).Watch(ctx, o)
		},
	}, workload), &corev1.Pod{}, 0, cache.Indexers{})

	for _, inf := range []cache.SharedIndexInformer{machines, nodes, pods} {
		_ = inf.SetTransform(strip)
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
		go inf.RunWithContext(ctx)
	}
	return &Signal{C: c}, nil
}

// Wait blocks until a change (true), ctx's end, or at most max (false) — the
// bound covers what no watch reports (etcd membership and health, which are
// polled).
func (ch *Signal) Wait(ctx context.Context, max time.Duration) bool {
	t := time.NewTimer(max)
	defer t.Stop()
	var c <-chan struct{}
	if ch != nil {
		c = ch.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return false
	case <-c:
		// One step of a controller shows as a burst of changes (a Machine's
		// status, its Node, its pods): let the burst pass, and read once.
		settle := time.NewTimer(burst)
		defer settle.Stop()
		select {
		case <-ctx.Done():
		case <-settle.C:
		}
		return true
	}
}

// burst is how long a change waits for the ones that come with it.
const burst = 30 * time.Millisecond
