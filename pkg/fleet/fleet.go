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

// Select lists the Clusters in scope, sorted by namespace and name. Those
// whose control plane is not a KubeadmControlPlane, or that are being
// deleted, are returned apart as skipped: a fleet command does not fail on a
// cluster it was never meant to touch.
func Select(ctx context.Context, l *Lister, scope Scope) (clusters []Cluster, skipped []Skipped, err error) {
	all, err := listClusters(ctx, l, scope)
	for _, s := range all {
		if s.problem != "" {
			skipped = append(skipped, Skipped{Cluster: s.Cluster, Reason: s.problem})
			continue
		}
		clusters = append(clusters, s.Cluster)
	}
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

// selected is a Cluster in scope, as Select and Overview take it.
type selected struct {
	Cluster
	// controlPlane names its KubeadmControlPlane; problem says why no
	// operation of this tool applies to it, if none does.
	controlPlane, problem string
	// labels, window (its WindowAnnotation) and replicas (the control
	// plane's desired machines, as the Cluster's status reports them; 0 when
	// not reported) are what a staged run places it by.
	labels   labels.Set
	window   string
	replicas int32
}

// listClusters lists the Clusters in scope, in namespace and name order,
// keeping of each what Select and Overview use.
func listClusters(ctx context.Context, l *Lister, scope Scope) ([]selected, error) {
	what := collection{gv: clusterv1.GroupVersion, resource: "clusters", namespace: scope.Namespace}
	if scope.Selector != nil {
		what.labels = scope.Selector.String()
	}
	var all []selected
	err := listEach(ctx, l, what, func(cl *clusterv1.Cluster) {
		s := selected{Cluster: Cluster{Namespace: cl.Namespace, Name: cl.Name}, problem: notOurs(cl),
			labels: cl.Labels, window: cl.Annotations[WindowAnnotation]}
		if cp := cl.Status.ControlPlane; cp != nil && cp.DesiredReplicas != nil {
			s.replicas = *cp.DesiredReplicas
		}
		if s.problem == "" {
			s.controlPlane = cl.Spec.ControlPlaneRef.Name
		}
		all = append(all, s)
	})
	if err != nil {
		return nil, fmt.Errorf("listing Clusters %s: %w", scope, err)
	}
	// The API server lists in this order already (etcd's key order); a
	// fleet's output must not depend on it.
	sort.Slice(all, func(i, j int) bool {
		if all[i].Namespace != all[j].Namespace {
			return all[i].Namespace < all[j].Namespace
		}
		return all[i].Name < all[j].Name
	})
	return all, nil
}
