package workload

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/noderefutil"
)

// Drain empties a node before its Machine is deleted, so that Cluster API's
// own drain finds nothing left to evict. That drain evicts, then looks again
// only 20 seconds later (drainRetryInterval in the Machine controller), even
// when the pods were gone in a moment; here each pod's end is seen as it
// happens, through a watch, and within drainRelist when the watch does not
// tell it.
//
// It is a head start, never a replacement: it evicts a strict subset of what
// Cluster API's drain evicts, through the same Eviction API (so
// PodDisruptionBudgets hold), and leaves everything else — and every pod whose
// eviction is refused — to it. Cluster API's own drain helper
// (core/reconcilers/machine/drain) would be the first choice, but it brings
// Cluster API's admission webhooks with it, 9 MB of the binary, for the
// MachineDrainRules this never applies: with any MachineDrainRule in the
// cluster's namespace the caller leaves the drain to Cluster API altogether.
//
// Drained reports what was done and, in Left, why the node is not empty yet;
// an error is returned only when ctx ends.
func (c *Client) Drain(ctx context.Context, node string, limit time.Duration) (Drained, error) {
	n, err := c.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return Drained{Left: "node " + node + " not found"}, nil
	case err != nil:
		return Drained{Left: "reading node " + node + ": " + err.Error()}, ctx.Err()
	case noderefutil.IsNodeUnreachable(n):
		// Cluster API drains an unreachable node its own way (short grace
		// periods, pods that never go are skipped).
		return Drained{Left: "node " + node + " is unreachable"}, nil
	}
	listed, err := c.evictablePods(ctx, node)
	switch {
	case err != nil:
		return Drained{Left: err.Error()}, ctx.Err()
	case len(listed) == 0:
		// Nothing to evict: the node is left to Cluster API's drain, which
		// cordons it and finds it empty. A cordon here would cost the deletion
		// a second: the Machine controller reconciles a Machine when its Node
		// changes, and a Machine at most once a second (Cluster API's
		// ReconcilerRateLimiting), so a deletion right after a cordon waits
		// out the reconcile the cordon caused.
		return Drained{}, nil
	}
	var d Drained
	if !n.Spec.Unschedulable {
		// Marked as this tool's cordon: a run killed before it deletes the
		// machine or gives the node back leaves the mark, and the next run
		// or handback gives it back (Cordoned).
		patch := []byte(`{"metadata":{"annotations":{"` + CordonedAnnotation + `":"true"}},"spec":{"unschedulable":true}}`)
		if _, err := c.Kube.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return Drained{Left: "cordoning node " + node + ": " + err.Error()}, ctx.Err()
		}
		d.Cordoned = true
	}
	remaining, err := c.evictUntilEmpty(ctx, node, limit, &d)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return d, ctx.Err()
	case wait.Interrupted(err):
		d.Left = fmt.Sprintf("still terminating after %s: %s", limit, strings.Join(remaining, ", "))
	default:
		d.Left = err.Error()
	}
	return d, nil
}

// drainRelist is how often the drain lists the node's pods again while it
// waits, beside the watch. A watch alone is trusted to report every change,
// and one that stays silent — a proxy that drops or holds watch events, an
// API server that serves watches poorly (Cluster API's in-memory backend) —
// kept the drain waiting out its whole limit for pods long gone. A list of
// one node's pods is cheap; every two seconds it bounds what a silent watch
// costs without adding much to a drain that takes seconds.
const drainRelist = 2 * time.Second

// evictUntilEmpty lists the pods of the cordoned node, evicts each evictable
// one once, and follows the rest through a watch from that list, as kubectl's
// waits do, and through a list every drainRelist, as informers re-list, until
// none is left or limit passes. The first list is taken after the cordon, so
// it also finds a pod scheduled before the cordon took; the watch or a later
// list finds one that lands later. It returns the pods still on the node, as
// namespace/name, and records each eviction in d. A failed request ends it:
// this drain is a head start, and Cluster API's drain does the rest.
func (c *Client) evictUntilEmpty(ctx context.Context, node string, limit time.Duration, d *Drained) (remaining []string, err error) {
	waitCtx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	onNode := fields.OneTermEqualSelector("spec.nodeName", node).String()
	pods := c.Watching.CoreV1().Pods(metav1.NamespaceAll)
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: onNode})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	w, err := pods.Watch(waitCtx, metav1.ListOptions{FieldSelector: onNode, ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, fmt.Errorf("watching the pods of node %s: %w", node, err)
	}
	defer w.Stop()

	left := map[types.UID]string{}
	evicted := map[types.UID]bool{}
	// see takes in one pod as a list or the watch shows it. Evictions use
	// ctx, not the wait's: limit bounds the waiting, and a request under
	// way when it passes is not cut short.
	see := func(p *corev1.Pod, gone bool) error {
		if gone || !evictable(p) {
			delete(left, p.UID)
			return nil
		}
		left[p.UID] = p.Namespace + "/" + p.Name
		if p.DeletionTimestamp != nil || evicted[p.UID] {
			return nil // evicted already; waiting for it to end
		}
		if err := c.evict(ctx, p); err != nil {
			return fmt.Errorf("evicting pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		evicted[p.UID] = true
		d.Evicted = append(d.Evicted, p.Namespace+"/"+p.Name)
		return nil
	}
	// seeAll takes in a list: a pod it lacks is gone, whatever the watch
	// said or did not say.
	seeAll := func(list *corev1.PodList) error {
		listed := map[types.UID]bool{}
		for i := range list.Items {
			listed[list.Items[i].UID] = true
			if err := see(&list.Items[i], false); err != nil {
				return err
			}
		}
		for uid := range left {
			if !listed[uid] {
				delete(left, uid)
			}
		}
		return nil
	}
	names := func() []string { return slices.Sorted(maps.Values(left)) }
	if err := seeAll(list); err != nil {
		return names(), err
	}
	relist := time.NewTicker(drainRelist)
	defer relist.Stop()
	events := w.ResultChan()
	for len(left) > 0 {
		select {
		case <-waitCtx.Done():
			return names(), wait.ErrorInterrupted(waitCtx.Err())
		case <-relist.C:
			list, err := pods.List(waitCtx, metav1.ListOptions{FieldSelector: onNode})
			switch {
			case waitCtx.Err() != nil:
				return names(), wait.ErrorInterrupted(waitCtx.Err())
			case err != nil:
				return names(), fmt.Errorf("listing the pods of node %s: %w", node, err)
			}
			if err := seeAll(list); err != nil {
				return names(), err
			}
		case ev, open := <-events:
			switch p, ok := ev.Object.(*corev1.Pod); {
			case !open:
				// The API server may end a watch when it likes; the lists
				// carry on alone.
				events = nil
			case ev.Type == watch.Error:
				return names(), fmt.Errorf("watching the pods of node %s: %w", node, apierrors.FromObject(ev.Object))
			case ev.Type == watch.Bookmark:
				// A Pod that carries only a resourceVersion, which an API
				// server may send though the watch did not ask: no pod.
			case ok:
				if err := see(p, ev.Type == watch.Deleted); err != nil {
					return names(), err
				}
			}
		}
	}
	return nil, nil
}

// Drained is what Drain did.
type Drained struct {
	// Cordoned is true when Drain marked the node unschedulable: a node
	// with nothing to evict, or cordoned before, is left as it was.
	Cordoned bool
	// Evicted names the pods evicted, as namespace/name.
	Evicted []string
	// Left says why pods may remain for Cluster API's drain; "" when the node
	// holds none that it would evict.
	Left string
}

// CordonedAnnotation marks a node that Drain cordoned. Only such a node is
// ever uncordoned by this tool: a cordon of someone else's stays.
const CordonedAnnotation = "cp-rollout.cluster.x-k8s.io/cordoned"

// Cordoned names the control-plane nodes that carry Drain's cordon, which a
// run killed between its drain and the deletion of the machine left behind.
func (c *Client) Cordoned(ctx context.Context) ([]string, error) {
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: ControlPlaneNodeLabel})
	if err != nil {
		return nil, fmt.Errorf("workload cluster %s: listing control-plane nodes: %w", c.Name, err)
	}
	var names []string
	for _, n := range nodes.Items {
		if _, ok := n.Annotations[CordonedAnnotation]; ok && n.Spec.Unschedulable {
			names = append(names, n.Name)
		}
	}
	return names, nil
}

// Uncordon marks node schedulable again and drops Drain's mark: a drain
// whose Machine was not deleted after all gives its node back.
func (c *Client) Uncordon(ctx context.Context, node string) error {
	patch := []byte(`{"metadata":{"annotations":{"` + CordonedAnnotation + `":null}},"spec":{"unschedulable":false}}`)
	_, err := c.Kube.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// evictablePods lists the pods of node that Drain evicts.
func (c *Client) evictablePods(ctx context.Context, node string) ([]*corev1.Pod, error) {
	pods, err := c.Kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	var out []*corev1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; evictable(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// evictable is a pod that Cluster API's drain would evict and that no rule
// of the user's orders: not a static pod's mirror, not run by a DaemonSet,
// without the cluster.x-k8s.io/drain label (skip, wait-completed, or a drain
// order). Cluster API evicts some of the others too (orphaned DaemonSet pods,
// labelled ones): those are left to it.
func evictable(p *corev1.Pod) bool {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return false
	}
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "DaemonSet" {
		return false
	}
	_, labelled := p.Labels[clusterv1.PodDrainLabel]
	return !labelled
}

// evict asks the Eviction API to evict p with its own grace period, as
// Cluster API's drain does. A pod already gone is not an error.
func (c *Client) evict(ctx context.Context, p *corev1.Pod) error {
	err := c.Kube.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
