// Package changes answers "has anything the rollout loop waits on changed?":
// control-plane Machines on the management cluster, Nodes and kube-system Pods
// on the workload cluster. The loop only learns when to read again from it;
// every decision is made on a fresh live read, never on what the watches saw.
package changes

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Signal is a level signal: it fires (coalesced) whenever a control-plane
// Machine of the cluster, a workload Node or a kube-system Pod changes.
// Informers are used for their reconnects: a restarted API server is
// re-listed and re-watched.
type Signal struct {
	C <-chan struct{}
}

var machinesResource = schema.GroupVersionResource{Group: clusterv1.GroupVersion.Group, Version: clusterv1.GroupVersion.Version, Resource: "machines"}

// Watch starts the watches; they stop with ctx.
func Watch(ctx context.Context, mgmt *rest.Config, namespace, cluster string, workload kubernetes.Interface) (*Signal, error) {
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

	nodes := informers.NewSharedInformerFactory(workload, 0).Core().V1().Nodes().Informer()
	pods := informers.NewSharedInformerFactoryWithOptions(workload, 0, informers.WithNamespace(metav1.NamespaceSystem)).
		Core().V1().Pods().Informer()

	for _, inf := range []cache.SharedIndexInformer{machines, nodes, pods} {
		_ = inf.SetTransform(strip)
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
		go inf.RunWithContext(ctx)
	}
	return &Signal{C: c}, nil
}

// Wait blocks until a change, ctx's end, or at most max — the bound covers
// what no watch reports (etcd membership and health, which are polled).
func (ch *Signal) Wait(ctx context.Context, max time.Duration) {
	t := time.NewTimer(max)
	defer t.Stop()
	var c <-chan struct{}
	if ch != nil {
		c = ch.C
	}
	select {
	case <-ctx.Done():
	case <-c:
	case <-t.C:
	}
}
