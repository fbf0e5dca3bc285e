package workload

import (
	"context"
	"fmt"
	"sort"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// UnreadyDaemonSet is a DaemonSet that runs a Ready pod on a peer of a node
// and none on the node itself.
type UnreadyDaemonSet struct {
	// Namespace and Name are the DaemonSet's.
	Namespace, Name string
	Node            string
	// Pod is the DaemonSet's pod on Node, "" when it has none there.
	Pod string
	// State is how far that pod got: its phase and why it is not Ready.
	State string
}

func (u UnreadyDaemonSet) String() string {
	if u.Pod == "" {
		return fmt.Sprintf("DaemonSet %s/%s has no pod on node %s", u.Namespace, u.Name, u.Node)
	}
	return fmt.Sprintf("DaemonSet %s/%s: pod %s on node %s is %s", u.Namespace, u.Name, u.Pod, u.Node, u.State)
}

// DaemonSetsUnready lists the DaemonSets that run a Ready pod on one of
// peers but no Ready pod on node, in namespace and name order: what works on
// the other control-plane nodes must work on a new one before an old one
// goes (kube-proxy or a CNI that never comes up on new nodes,
// cluster-api#10949). A DaemonSet Ready on no peer is not the new node's
// doing, and waiting for it would hold every run on a fault that was there
// before; a DaemonSet that does not run on the peers is none of its business.
//
// Pods are listed node by node (field selector spec.nodeName), the way a
// kubelet lists its own: a workload cluster's pods, across all its workers,
// are far more than those of a few control-plane nodes.
func (c *Client) DaemonSetsUnready(ctx context.Context, node string, peers []string) ([]UnreadyDaemonSet, error) {
	want := map[daemonSet]bool{}
	for _, peer := range peers {
		pods, err := c.podsOn(ctx, peer)
		if err != nil {
			return nil, err
		}
		for _, p := range pods {
			if ds, ok := daemonSetOf(p); ok && podReady(p) {
				want[ds] = true
			}
		}
	}
	if len(want) == 0 {
		return nil, nil
	}
	pods, err := c.podsOn(ctx, node)
	if err != nil {
		return nil, err
	}
	// Of the pods a DaemonSet has on node, one Ready is enough (an update
	// may briefly leave an old pod beside the new); otherwise the one that
	// is not going away says best where it stands.
	on := map[daemonSet]*corev1.Pod{}
	for _, p := range pods {
		ds, ok := daemonSetOf(p)
		if !ok || !want[ds] {
			continue
		}
		if seen := on[ds]; seen == nil || podReady(p) || !podReady(seen) && seen.DeletionTimestamp != nil {
			on[ds] = p
		}
	}
	var unready []UnreadyDaemonSet
	for ds := range want {
		p := on[ds]
		if p != nil && podReady(p) {
			continue
		}
		u := UnreadyDaemonSet{Namespace: ds.namespace, Name: ds.name, Node: node, State: "no pod"}
		if p != nil {
			u.Pod, u.State = p.Name, podState(p)
		}
		unready = append(unready, u)
	}
	sort.Slice(unready, func(i, j int) bool {
		if unready[i].Namespace != unready[j].Namespace {
			return unready[i].Namespace < unready[j].Namespace
		}
		return unready[i].Name < unready[j].Name
	})
	return unready, nil
}

// daemonSet names one DaemonSet.
type daemonSet struct{ namespace, name string }

// podsOn lists the pods bound to node, in every namespace.
func (c *Client) podsOn(ctx context.Context, node string) ([]*corev1.Pod, error) {
	list, err := c.Kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("workload cluster %s: listing the pods on node %s: %w", c.Name, node, err)
	}
	pods := make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		// The selector is the API server's to apply; checking it again
		// costs nothing and keeps a client that ignores it honest.
		if list.Items[i].Spec.NodeName == node {
			pods = append(pods, &list.Items[i])
		}
	}
	return pods, nil
}

// daemonSetOf is the DaemonSet that controls p, if one does.
func daemonSetOf(p *corev1.Pod) (daemonSet, bool) {
	owner := metav1.GetControllerOf(p)
	if owner == nil || owner.Kind != "DaemonSet" || owner.APIVersion != appsv1.SchemeGroupVersion.String() {
		return daemonSet{}, false
	}
	return daemonSet{namespace: p.Namespace, name: owner.Name}, true
}

// podState says how far a pod that is not Ready got: its phase, and the
// first reason a container gives (CrashLoopBackOff, ImagePullBackOff …), or
// else the Ready condition's.
func podState(p *corev1.Pod) string {
	state := string(p.Status.Phase)
	if state == "" {
		state = string(corev1.PodPending)
	}
	if p.DeletionTimestamp != nil {
		return state + ", terminating"
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
			return fmt.Sprintf("%s, not Ready: container %s %s", state, cs.Name, cs.State.Waiting.Reason)
		case cs.State.Terminated != nil && cs.State.Terminated.Reason != "":
			return fmt.Sprintf("%s, not Ready: container %s %s", state, cs.Name, cs.State.Terminated.Reason)
		case !cs.Ready:
			return fmt.Sprintf("%s, not Ready: container %s not ready", state, cs.Name)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Reason != "" {
			return fmt.Sprintf("%s, not Ready (%s)", state, c.Reason)
		}
	}
	return state + ", not Ready"
}
