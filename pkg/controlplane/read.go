// Package controlplane answers "what is this control plane on the management
// cluster, and how do we change it there": it reads one consistent view of a
// Cluster, its KubeadmControlPlane and control-plane Machines (with their
// InfraMachines and KubeadmConfigs), and performs the management-cluster writes
// a rollout makes: create a replacement as KCP would, delete a machine, manage
// the kcp-cleanup pre-terminate hook, and the KCP hand-over (see handover.go).
//
// A Client reads through the client it is given. The one every step is
// decided on is uncached: its reads go straight to the API server, because a
// cache may lag behind a deletion. A run's waits read through a second
// Client over the watches' caches (pkg/changes). A snapshot reads each object
// once (see oneRead).
package controlplane

import (
	"context"
	"fmt"
	"strings"

	"golang.org/x/sync/errgroup"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// Scheme knows every type the tool reads or writes on the management cluster.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, clusterv1.AddToScheme, controlplanev1.AddToScheme, bootstrapv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err) // static registration; cannot fail at run time
		}
	}
	return s
}

// Client reads and writes one cluster's control plane.
type Client struct {
	c         client.Client
	Namespace string
	Cluster   string
	// Fence, when set, is armed with the lock Acquire takes, so every write
	// through the clients it wraps needs that lock held.
	Fence *Fence
}

// New returns a Client for the cluster namespace/name. Only CRD metadata is
// remembered, by the Client itself (see crdMetadata); c is uncached but for
// the waits' Client (see the package comment).
func New(c client.Client, namespace, cluster string) *Client {
	return &Client{c: withCRDMetadataCache(c), Namespace: namespace, Cluster: cluster}
}

// Kube is the underlying management-cluster client.
func (c *Client) Kube() client.Client { return c.c }

// Key names the Cluster.
func (c *Client) Key() types.NamespacedName {
	return types.NamespacedName{Namespace: c.Namespace, Name: c.Cluster}
}

// Read returns KCP's own view of the control plane, built with KCP's own
// NewControlPlane so that "up to date" means exactly what KCP means by it.
// The Cluster must exist, not be deleting, and be controlled by a v1beta2
// KubeadmControlPlane; otherwise the error is marked Unsafe and names what is
// wrong.
func (c *Client) Read(ctx context.Context) (*kcpstate.ControlPlane, error) {
	// The cluster's Machines are listed while the Cluster and its KCP are
	// read (one after the other: the Cluster names its KCP): the list selects
	// by the cluster's name alone, and is filtered once both are known.
	var (
		all  collections.Machines
		list errgroup.Group
	)
	list.Go(func() (err error) {
		named := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Cluster}}
		if all, err = collections.GetFilteredMachinesForCluster(ctx, c.c, named); err != nil {
			return fmt.Errorf("listing control-plane machines of %s/%s: %w", c.Namespace, c.Cluster, err)
		}
		return nil
	})
	cluster, kcp, err := c.ReadKCP(ctx)
	listErr := list.Wait()
	switch {
	case err != nil:
		return nil, err
	case listErr != nil:
		return nil, listErr
	}
	// As KCP does: control-plane Machines of the cluster that this KCP owns.
	machines := all.Filter(collections.ControlPlaneMachines(cluster.Name),
		collections.OwnedMachines(kcp, controlplanev1.GroupVersion.WithKind("KubeadmControlPlane").GroupKind()))
	reads := newOneRead(c.c, cluster, machines)
	reads.prefetch(ctx, kcp, machines)
	cp, err := kcpstate.NewControlPlane(ctx, nil, reads, cluster, kcp, machines)
	if err != nil {
		return nil, fmt.Errorf("reading control plane of %s/%s: %w", c.Namespace, c.Cluster, err)
	}
	return cp, nil
}

// ReadKCP reads the Cluster and its KubeadmControlPlane alone: what the
// hand-over decides on.
func (c *Client) ReadKCP(ctx context.Context) (*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane, error) {
	cluster := &clusterv1.Cluster{}
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Cluster}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, exitcode.Unsafef("cluster %s/%s not found", c.Namespace, c.Cluster)
		}
		return nil, nil, fmt.Errorf("reading cluster %s/%s: %w", c.Namespace, c.Cluster, err)
	}
	ref := cluster.Spec.ControlPlaneRef
	if !ref.IsDefined() || ref.Kind != "KubeadmControlPlane" || ref.APIGroup != controlplanev1.GroupVersion.Group {
		return nil, nil, exitcode.Unsafef("cluster %s/%s: its control plane is not a KubeadmControlPlane (controlPlaneRef %s %s)",
			c.Namespace, c.Cluster, ref.Kind, ref.Name)
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: ref.Name}, kcp); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, exitcode.Unsafef("cluster %s/%s: KubeadmControlPlane %s not found", c.Namespace, c.Cluster, ref.Name)
		}
		return nil, nil, fmt.Errorf("reading KubeadmControlPlane %s/%s: %w", c.Namespace, ref.Name, err)
	}
	return cluster, kcp, nil
}

// WithKCP returns KCP's view of the same machines as if the KubeadmControlPlane
// were want: which machines a new version or configuration makes outdated,
// before anything is written. The projection is built from the very
// InfraMachines and KubeadmConfigs cp was built from (see readsOf).
func (c *Client) WithKCP(ctx context.Context, cp *kcpstate.ControlPlane, want *controlplanev1.KubeadmControlPlane) (*kcpstate.ControlPlane, error) {
	return kcpstate.NewControlPlane(ctx, nil, c.readsOf(cp), cp.Cluster, want, cp.Machines)
}

// readsOf serves the InfraMachines and KubeadmConfigs snapshot cp was built
// from, which KCP's NewControlPlane keeps in it, and reads anything else (an
// InfraMachineTemplate) live: what is decided on cp is decided on cp's own
// objects, whichever snapshot was read after it.
func (c *Client) readsOf(cp *kcpstate.ControlPlane) *oneRead {
	r := newOneRead(c.c, cp.Cluster, cp.Machines)
	for _, infra := range cp.InfraResources {
		r.served(infra.GroupVersionKind(), infra)
	}
	configGVK := bootstrapv1.GroupVersion.WithKind("KubeadmConfig")
	for _, config := range cp.KubeadmConfigs {
		if u, err := toUnstructured(config, configGVK); err == nil {
			r.served(configGVK, u)
		}
	}
	return r
}

// InfraKinds names the KubeadmControlPlane's InfraMachineTemplate and the
// kinds of cp's InfraMachines, each at the API version Cluster API reads it
// in: what the watches of a run cache (changes.Scope). The template is read
// live; the InfraMachines are cp's.
func (c *Client) InfraKinds(ctx context.Context, cp *kcpstate.ControlPlane) (template schema.GroupVersionKind, machines []schema.GroupVersionKind, err error) {
	tmpl, err := external.GetObjectFromContractVersionedRef(ctx, c.readsOf(cp), cp.KCP.Spec.MachineTemplate.Spec.InfrastructureRef, cp.KCP.Namespace)
	if err != nil {
		return schema.GroupVersionKind{}, nil, fmt.Errorf("reading the InfraMachineTemplate of KubeadmControlPlane %s/%s: %w", cp.KCP.Namespace, cp.KCP.Name, err)
	}
	seen := map[schema.GroupVersionKind]bool{}
	for _, infra := range cp.InfraResources {
		if gvk := infra.GroupVersionKind(); !seen[gvk] {
			seen[gvk] = true
			machines = append(machines, gvk)
		}
	}
	if len(machines) == 0 {
		// No machine yet: the template's kind without its suffix, as
		// Cluster API names them.
		gvk := tmpl.GroupVersionKind()
		machines = append(machines, gvk.GroupVersion().WithKind(strings.TrimSuffix(gvk.Kind, clusterv1.TemplateSuffix)))
	}
	return tmpl.GroupVersionKind(), machines, nil
}
