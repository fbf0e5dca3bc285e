// Package fleet answers "which clusters does a command act on, and how do
// many of them run at once": it selects Clusters by label selector, runs one
// cluster's operation for each with a bound on how many are in flight and a
// budget of failures, and reads where every selected control plane stands
// from a handful of list requests to the management cluster (Overview).
//
// Each cluster's operation is exactly the one-cluster operation, with its own
// engine, lock, hand-over and guards: nothing here decides a step.
package fleet

import (
	"context"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Cluster names one Cluster.
type Cluster struct {
	Namespace string `json:"namespace"`
	Name      string `json:"cluster"`
}

func (c Cluster) String() string { return c.Namespace + "/" + c.Name }

// Scope is which Clusters a command selects: those in Namespace (every
// namespace when it is empty) whose labels match Selector.
type Scope struct {
	Namespace string
	Selector  labels.Selector
}

// String describes the scope for messages: the selector as given and where.
func (s Scope) String() string {
	where := "in any namespace"
	if s.Namespace != "" {
		where = "in namespace " + s.Namespace
	}
	if s.Selector == nil || s.Selector.Empty() {
		return where
	}
	return fmt.Sprintf("matching -l %s %s", s.Selector, where)
}

// Skipped is a selected Cluster that no operation of this tool applies to,
// and why.
type Skipped struct {
	Cluster
	Reason string `json:"reason"`
}

// listPage bounds each list request, so that the tool's memory follows the
// page and not the fleet (a management cluster may hold thousands of
// Machines).
var listPage int64 = 500

// Select lists the Clusters in scope, sorted by namespace and name. Those
// whose control plane is not a KubeadmControlPlane, or that are being
// deleted, are returned apart as skipped: a fleet command does not fail on a
// cluster it was never meant to touch.
func Select(ctx context.Context, c client.Reader, scope Scope) (clusters []Cluster, skipped []Skipped, err error) {
	err = listClusters(ctx, c, scope, func(cl *clusterv1.Cluster) {
		key := Cluster{Namespace: cl.Namespace, Name: cl.Name}
		if reason := notOurs(cl); reason != "" {
			skipped = append(skipped, Skipped{Cluster: key, Reason: reason})
			return
		}
		clusters = append(clusters, key)
	})
	return clusters, skipped, err
}

// notOurs says why no operation of this tool applies to cl; "" when one does.
func notOurs(cl *clusterv1.Cluster) string {
	ref := cl.Spec.ControlPlaneRef
	switch {
	case !cl.DeletionTimestamp.IsZero():
		return "the Cluster is being deleted"
	case !ref.IsDefined():
		return "the Cluster has no control plane"
	case ref.Kind != "KubeadmControlPlane" || ref.APIGroup != controlplanev1.GroupVersion.Group:
		return fmt.Sprintf("its control plane is a %s, not a KubeadmControlPlane", ref.Kind)
	}
	return ""
}

// listClusters calls each for every Cluster in scope, in namespace and name
// order.
func listClusters(ctx context.Context, c client.Reader, scope Scope, each func(*clusterv1.Cluster)) error {
	var all []clusterv1.Cluster
	opts := []client.ListOption{client.InNamespace(scope.Namespace)}
	if scope.Selector != nil {
		opts = append(opts, client.MatchingLabelsSelector{Selector: scope.Selector})
	}
	err := listPages(ctx, c, func() *clusterv1.ClusterList { return &clusterv1.ClusterList{} }, opts, func(l *clusterv1.ClusterList) {
		all = append(all, l.Items...)
	})
	if err != nil {
		return fmt.Errorf("listing Clusters %s: %w", scope, err)
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].Namespace != all[j].Namespace {
			return all[i].Namespace < all[j].Namespace
		}
		return all[i].Name < all[j].Name
	})
	for i := range all {
		each(&all[i])
	}
	return nil
}

// listPages lists in pages of listPage, handing each page to each. Every page
// is decoded into a list of its own: a decoder may reuse what a list it is
// given already holds, and each keeps the items it was handed.
func listPages[L client.ObjectList](ctx context.Context, c client.Reader, newList func() L, opts []client.ListOption, each func(L)) error {
	cont := ""
	for {
		list := newList()
		page := append([]client.ListOption{client.Limit(listPage), client.Continue(cont)}, opts...)
		if err := c.List(ctx, list, page...); err != nil {
			return err
		}
		each(list)
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
}
