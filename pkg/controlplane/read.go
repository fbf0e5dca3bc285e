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
//
// An identity that may not read KubeadmConfigs (cp-rollout-view: they hold the
// node-join token) reads the rest, and takes what the KubeadmConfigs would
// have told from KCP's own word on each machine (judgeWithoutKubeadmConfigs,
// Unjudged).
package controlplane

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	authorizationv1 "k8s.io/api/authorization/v1"
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
	"sigs.k8s.io/cluster-api/util/conditions"

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
	// kubeadmConfigs is whether this identity may read the cluster's
	// KubeadmConfigs, asked once; nil (a Client not made by New) reads them.
	kubeadmConfigs *configAccess
}

// configAccess is the answer, once asked, to whether an identity may read
// KubeadmConfigs in the cluster's namespace.
type configAccess struct {
	once   sync.Once
	denied atomic.Bool
}

// kubeadmConfigKind is the kind KCP reads every machine's bootstrap config
// as.
var kubeadmConfigKind = bootstrapv1.GroupVersion.WithKind("KubeadmConfig").GroupKind()

// New returns a Client for the cluster namespace/name. Only CRD metadata is
// remembered, by the Client itself (see crdMetadata), and whether the
// identity may read KubeadmConfigs; c is uncached but for the waits' Client
// (see the package comment).
func New(c client.Client, namespace, cluster string) *Client {
	return &Client{c: withCRDMetadataCache(c), Namespace: namespace, Cluster: cluster, kubeadmConfigs: &configAccess{}}
}

// askKubeadmConfigs asks the API server once, as `kubectl auth can-i get
// kubeadmconfigs.bootstrap.cluster.x-k8s.io` does, whether this identity may
// read the KubeadmConfigs of the cluster's namespace, and reports whether it
// may not. cp-rollout-view does not grant them: a KubeadmConfig holds its
// machine's node-join token in spec.joinConfiguration.discovery.bootstrapToken
// until the machine joins. Asking first, rather than reading and being
// refused, leaves no refused read of them in the audit log. A question that
// gets no answer reads them as before (a refusal then is an error, as it
// always was).
func (c *Client) askKubeadmConfigs(ctx context.Context) bool {
	if c.kubeadmConfigs == nil {
		return false
	}
	c.kubeadmConfigs.once.Do(func() {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: "get", Group: kubeadmConfigKind.Group, Resource: "kubeadmconfigs", Namespace: c.Namespace,
			},
		}}
		if err := c.c.Create(ctx, review); err == nil {
			c.kubeadmConfigs.denied.Store(!review.Status.Allowed)
		}
	})
	return c.kubeadmConfigs.denied.Load()
}

// KubeadmConfigsUnread reports whether this Client's reads go without the
// machines' KubeadmConfigs, which its identity may not read: each control
// plane it reads then says a machine is up to date only as far as KCP's own
// UpToDate condition on it tells (see Unjudged). False until a Read has
// asked.
func (c *Client) KubeadmConfigsUnread() bool {
	return c.kubeadmConfigs != nil && c.kubeadmConfigs.denied.Load()
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
	// Whether the KubeadmConfigs may be read is asked beside them, once per
	// Client, so that the answer is there when they would be.
	list.Go(func() error {
		c.askKubeadmConfigs(ctx)
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
	reads.withoutKubeadmConfigs = c.KubeadmConfigsUnread()
	reads.prefetch(ctx, kcp, machines)
	cp, err := kcpstate.NewControlPlane(ctx, nil, reads, cluster, kcp, machines)
	if err != nil {
		return nil, fmt.Errorf("reading control plane of %s/%s: %w", c.Namespace, c.Cluster, err)
	}
	if reads.withoutKubeadmConfigs {
		judgeWithoutKubeadmConfigs(cp)
	}
	return cp, nil
}

// judgeWithoutKubeadmConfigs completes KCP's verdicts on cp, whose machines'
// KubeadmConfigs were not read. KCP's UpToDate compares a machine's version,
// its InfraMachine and the KubeadmControlPlane's rollout dates whatever it
// read, and takes a machine whose KubeadmConfig it has not got as matching
// in that respect ("a safety precaution to avoid rolling out machines if the
// client or the api-server is misbehaving", controlplane/kubeadm/pkg
// matchesKubeadmConfig): alone, it would call up to date every machine whose
// KubeadmConfig is out of date. KCP's own UpToDate condition on the machine
// says what its full comparison found, where it is for the spec at hand
// (kcpVerdict): a machine it found outdated is counted so. What neither can
// tell, Unjudged names.
func judgeWithoutKubeadmConfigs(cp *kcpstate.ControlPlane) {
	for _, m := range cp.Machines {
		if upToDate, known := kcpVerdict(cp.KCP, m); known && !upToDate && configUnjudged(cp, m) {
			cp.MachinesNotUpToDate.Insert(m)
		}
	}
}

// Unjudged names the machines of cp whose KubeadmConfig it could not compare
// (this Client's identity may not read KubeadmConfigs), that the rest of
// KCP's comparison found up to date, and on which KCP has written no
// UpToDate condition for the spec at hand: whether they are up to date is
// unknown, though KCP's view counts them so. Empty when the KubeadmConfigs
// were read: then a machine is what KCP's comparison says, as ever.
func (c *Client) Unjudged(cp *kcpstate.ControlPlane) collections.Machines {
	if !c.KubeadmConfigsUnread() {
		return collections.New()
	}
	return cp.Machines.Filter(func(m *clusterv1.Machine) bool {
		_, known := kcpVerdict(cp.KCP, m)
		return configUnjudged(cp, m) && !known
	})
}

// configUnjudged reports whether m's verdict in cp hangs on a KubeadmConfig
// that was not read: it has one, cp does not hold it, and the rest of KCP's
// comparison found nothing outdated.
func configUnjudged(cp *kcpstate.ControlPlane, m *clusterv1.Machine) bool {
	if m == nil {
		return false
	}
	_, read := cp.KubeadmConfigs[m.Name]
	return m.Spec.Bootstrap.ConfigRef.IsDefined() && !read && !cp.MachinesNotUpToDate.Has(m)
}

// kcpVerdict is KCP's own verdict on m, from the UpToDate condition KCP
// writes on its machines each time it reconciles (kubeadmcontrolplane
// reconcileMachineUpToDateCondition), known only when that condition is for
// the KubeadmControlPlane's current spec and m's: KCP has observed kcp's
// generation (a paused KCP observes none, so a spec changed since the pause
// is unjudged) and m's own generation is the condition's. False with reason
// NotUpToDate is KCP's comparison finding m outdated; any other False (an
// in-place update, a kubelet not yet at the machine's version) followed a
// comparison that found it up to date, which is what KCP's view counts.
func kcpVerdict(kcp *controlplanev1.KubeadmControlPlane, m *clusterv1.Machine) (upToDate, known bool) {
	if kcp.Status.ObservedGeneration != kcp.Generation {
		return false, false
	}
	c := conditions.Get(m, clusterv1.MachineUpToDateCondition)
	switch {
	case c == nil || c.ObservedGeneration != 0 && c.ObservedGeneration != m.Generation:
		return false, false
	case c.Status == metav1.ConditionTrue:
		return true, true
	case c.Status == metav1.ConditionFalse:
		return c.Reason != clusterv1.MachineNotUpToDateReason, true
	}
	return false, false
}

// ClusterNotFoundError is ReadKCP's (and Read's) error when the API server
// answers that the Cluster is not there. Mid-run it is exit 3: the cluster
// the run took over went away. A verb's first read tells it apart (errors.As)
// to say instead that the name or namespace given matches no Cluster. Err is
// the API server's answer, which a 404 on discovery gives as well.
type ClusterNotFoundError struct {
	Namespace, Name string
	Err             error
}

func (e *ClusterNotFoundError) Error() string {
	return fmt.Sprintf("cluster %s/%s not found", e.Namespace, e.Name)
}

func (e *ClusterNotFoundError) Unwrap() error { return e.Err }

// ReadKCP reads the Cluster and its KubeadmControlPlane alone: what the
// hand-over decides on.
func (c *Client) ReadKCP(ctx context.Context) (*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane, error) {
	cluster := &clusterv1.Cluster{}
	if err := c.c.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: c.Cluster}, cluster); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, exitcode.New(exitcode.Unsafe, &ClusterNotFoundError{Namespace: c.Namespace, Name: c.Cluster, Err: err})
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
	r.withoutKubeadmConfigs = c.KubeadmConfigsUnread()
	for _, infra := range cp.InfraResources {
		r.served(infra.GroupVersionKind(), infra)
	}
	configGVK := kubeadmConfigKind.WithVersion(bootstrapv1.GroupVersion.Version)
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
