package controlplane

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/external"
	"sigs.k8s.io/cluster-api/util/collections"
)

// oneRead serves the object reads of one snapshot. KCP's NewControlPlane
// reads every machine's InfraMachine and KubeadmConfig one GET at a time, and
// UpToDate reads the KubeadmControlPlane's InfraMachineTemplate once per
// machine: inside KCP all of them come from its informer cache, but live they
// were three requests per machine per snapshot, most of a rollout's requests.
// Here the InfraMachines and KubeadmConfigs of the cluster are listed once
// (one request per kind, selected by the cluster-name label KCP puts on
// them) and every other object is read once. It is still a live read: the
// list and the gets go to the API server when the snapshot is taken, and
// nothing outlives the snapshot. An object the list did not return (a
// missing label, a list refused by a role that grants get alone) is read
// with a GET as before.
//
// KCP's NewControlPlane reads one object at a time; prefetch reads the three
// kinds it will ask for side by side first, so a snapshot waits for one
// round trip there instead of three.
//
// An identity that may not read KubeadmConfigs (cp-rollout-view: they hold
// the node-join token) asks for none; see withoutKubeadmConfigs.
type oneRead struct {
	client.Client
	namespace, cluster string
	// listable are the kinds read by listing: the machines' InfraMachine
	// kinds and KubeadmConfig.
	listable map[schema.GroupKind]bool
	// withoutKubeadmConfigs answers every read of a KubeadmConfig with
	// NotFound, sending no request: KCP's NewControlPlane then leaves the
	// KubeadmConfig out of its comparison, as it does one that is gone, and
	// Read judges that part by KCP's own condition (judgeWithoutKubeadmConfigs).
	// A refused read would be an error, and a line in the audit log.
	withoutKubeadmConfigs bool

	mu      sync.Mutex
	lists   map[schema.GroupVersionKind]*sync.Once
	objects map[readKey]*unstructured.Unstructured
}

type readKey struct {
	gvk schema.GroupVersionKind
	key client.ObjectKey
}

func newOneRead(c client.Client, cluster *clusterv1.Cluster, machines collections.Machines) *oneRead {
	r := &oneRead{Client: c, namespace: cluster.Namespace, cluster: cluster.Name,
		listable: map[schema.GroupKind]bool{}, lists: map[schema.GroupVersionKind]*sync.Once{}, objects: map[readKey]*unstructured.Unstructured{}}
	for _, m := range machines {
		if ref := m.Spec.InfrastructureRef; ref.IsDefined() {
			r.listable[schema.GroupKind{Group: ref.APIGroup, Kind: ref.Kind}] = true
		}
		if ref := m.Spec.Bootstrap.ConfigRef; ref.IsDefined() {
			r.listable[schema.GroupKind{Group: ref.APIGroup, Kind: ref.Kind}] = true
		}
	}
	return r
}

// Get serves obj from what this snapshot has already read, listing its kind
// first when the kind is listable.
func (r *oneRead) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	gvk, err := apiutil.GVKForObject(obj, r.Scheme())
	if err != nil {
		return err
	}
	if r.withoutKubeadmConfigs && gvk.GroupKind() == kubeadmConfigKind {
		return apierrors.NewNotFound(schema.GroupResource{Group: kubeadmConfigKind.Group, Resource: "kubeadmconfigs"}, key.Name)
	}
	if _, partial := obj.(*metav1.PartialObjectMetadata); partial || len(opts) > 0 {
		return r.Client.Get(ctx, key, obj, opts...) // metadata-only and optioned reads are not shared
	}
	at := readKey{gvk: gvk, key: key}
	if r.listable[gvk.GroupKind()] && key.Namespace == r.namespace {
		r.listOnce(ctx, gvk)
	}
	if u := r.remembered(at); u != nil {
		return fill(obj, u)
	}
	if err := r.Client.Get(ctx, key, obj); err != nil {
		return err
	}
	u, err := toUnstructured(obj, gvk)
	if err != nil {
		return err
	}
	r.remember(at, u)
	return nil
}

// prefetch reads, side by side, what NewControlPlane will ask for one after
// the other: the machines' InfraMachines and KubeadmConfigs (a list each,
// through the first machine that names them) and the KubeadmControlPlane's
// InfraMachineTemplate. It reads through Get, with CAPI's own contract
// lookup for the infrastructure kinds, so it asks for the very versions and
// keys NewControlPlane asks for. A failed read is not remembered:
// NewControlPlane reads it again and reports it.
func (r *oneRead) prefetch(ctx context.Context, kcp *controlplanev1.KubeadmControlPlane, machines collections.Machines) {
	reads := []func(){func() {
		_, _ = external.GetObjectFromContractVersionedRef(ctx, r, kcp.Spec.MachineTemplate.Spec.InfrastructureRef, kcp.Namespace)
	}}
	if m := machines.Oldest(); m != nil {
		if ref := m.Spec.InfrastructureRef; ref.IsDefined() {
			reads = append(reads, func() { _, _ = external.GetObjectFromContractVersionedRef(ctx, r, ref, m.Namespace) })
		}
		if ref := m.Spec.Bootstrap.ConfigRef; ref.IsDefined() && !r.withoutKubeadmConfigs { // read as KubeadmConfig whatever its kind, as KCP reads it
			reads = append(reads, func() {
				_ = r.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}, &bootstrapv1.KubeadmConfig{})
			})
		}
	}
	var wg sync.WaitGroup
	for _, read := range reads {
		wg.Go(read)
	}
	wg.Wait()
}

// listOnce lists kind gvk the first time it is asked for; a Get of the same
// kind meanwhile waits for that list rather than reading on its own.
func (r *oneRead) listOnce(ctx context.Context, gvk schema.GroupVersionKind) {
	r.mu.Lock()
	once := r.lists[gvk]
	if once == nil {
		once = new(sync.Once)
		r.lists[gvk] = once
	}
	r.mu.Unlock()
	once.Do(func() { r.list(ctx, gvk) })
}

// list remembers every object of kind gvk that carries the cluster's label.
// A failed list is not an error: each object is then read on its own.
func (r *oneRead) list(ctx context.Context, gvk schema.GroupVersionKind) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := r.Client.List(ctx, list, client.InNamespace(r.namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: r.cluster}); err != nil {
		return
	}
	for i := range list.Items {
		u := &list.Items[i]
		u.SetGroupVersionKind(gvk)
		r.remember(readKey{gvk: gvk, key: client.ObjectKeyFromObject(u)}, u)
	}
}

// served remembers u, of kind gvk, as already read, and its kind as listed:
// a Get of that kind is served from what is remembered or read on its own.
func (r *oneRead) served(gvk schema.GroupVersionKind, u *unstructured.Unstructured) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lists[gvk] == nil {
		listed := new(sync.Once)
		listed.Do(func() {})
		r.lists[gvk] = listed
	}
	r.objects[readKey{gvk: gvk, key: client.ObjectKeyFromObject(u)}] = u
}

func (r *oneRead) remembered(at readKey) *unstructured.Unstructured {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.objects[at]
}

func (r *oneRead) remember(at readKey, u *unstructured.Unstructured) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.objects[at] = u
}

// fill copies a remembered object into obj, so the caller's changes never
// reach the remembered one.
func fill(obj client.Object, u *unstructured.Unstructured) error {
	content := runtime.DeepCopyJSON(u.UnstructuredContent())
	if into, ok := obj.(*unstructured.Unstructured); ok {
		into.SetUnstructuredContent(content)
		return nil
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(content, obj); err != nil {
		return fmt.Errorf("reading %s %s: %w", u.GetKind(), client.ObjectKeyFromObject(u), err)
	}
	// As from a typed GET, which does not fill in the kind.
	obj.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	return nil
}

// toUnstructured copies what a GET returned, with its kind: a typed read
// does not carry it.
func toUnstructured(obj client.Object, gvk schema.GroupVersionKind) (*unstructured.Unstructured, error) {
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(content)}
	u.SetGroupVersionKind(gvk)
	return u, nil
}
