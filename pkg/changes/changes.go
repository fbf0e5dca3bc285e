// Package changes answers "what do the watches see of one control plane, and
// when did it change?": the Cluster, its KubeadmControlPlane, its
// control-plane Machines with their KubeadmConfigs and InfraMachines, and the
// KubeadmControlPlane's InfraMachineTemplate on the management cluster; the
// control-plane Nodes and their static Pods on the workload cluster.
//
// The rollout loop waits on what the watches see: a wait reads these caches,
// not the API servers, however often they change. Every step that changes
// something is still decided on a live read (rollout.Engine.Cache says how),
// so a cache that lags behind a deletion can make a wait last a moment
// longer, never a step wrong.
package changes

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	wl "github.com/cp-rollout/cp-rollout/pkg/workload"
)

// Scope names what to watch on the management cluster.
type Scope struct {
	Namespace, Cluster string
	// KCP names the cluster's KubeadmControlPlane.
	KCP string
	// Template is the KubeadmControlPlane's InfraMachineTemplate, and
	// InfraMachines the kinds of its machines' InfraMachines, each at the API
	// version Cluster API reads it in (the one its CRD's contract label
	// names): a read at another version is not served from the caches.
	Template      Object
	InfraMachines []schema.GroupVersionKind
}

// Object names one object of a kind.
type Object struct {
	GVK  schema.GroupVersionKind
	Name string
}

// Watches holds the watches of one control plane: a change signal and the
// caches the watches fill. Informers are used for their reconnects: a
// restarted API server is re-listed and re-watched.
type Watches struct {
	signal chan struct{}
	client *cachedClient
	nodes  cache.SharedIndexInformer
	pods   cache.SharedIndexInformer
}

// syncLimit bounds how long Watch waits for the first lists.
const syncLimit = time.Minute

// Watch starts the watches and returns once every cache holds its first list;
// they stop with ctx. live is the uncached management client, mgmt its
// configuration.
func Watch(ctx context.Context, mgmt *rest.Config, live client.Client, scope Scope, workload wl.Kube) (*Watches, error) {
	w := &Watches{signal: make(chan struct{}, 1)}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.notify() },
		UpdateFunc: func(any, any) { w.notify() },
		DeleteFunc: func(any) { w.notify() },
	}

	httpClient, err := rest.HTTPClientFor(mgmt)
	if err != nil {
		return nil, err
	}
	objects := scope.objects()
	byObject := make(map[client.Object]crcache.ByObject, len(objects))
	for _, o := range objects {
		byObject[o.obj] = o.selects
	}
	managed, err := crcache.New(mgmt, crcache.Options{
		HTTPClient: httpClient, Scheme: live.Scheme(), Mapper: live.RESTMapper(),
		DefaultNamespaces: map[string]crcache.Config{scope.Namespace: {}},
		ByObject:          byObject,
		// Managed fields are most of an object and no decision reads them.
		DefaultTransform: crcache.TransformStripManagedFields(),
		// Nothing outside the scope is ever read from the caches.
		ReaderFailOnMissingInformer: true,
	})
	if err != nil {
		return nil, fmt.Errorf("watching the control plane: %w", err)
	}
	watched := map[schema.GroupVersionKind]string{}
	var synced []cache.DoneChecker
	for _, o := range objects {
		gvk, err := apiutil.GVKForObject(o.obj, live.Scheme())
		if err != nil {
			return nil, err
		}
		watched[gvk] = o.name
		inf, err := managed.GetInformer(ctx, o.obj, crcache.BlockUntilSynced(false))
		if err != nil {
			return nil, fmt.Errorf("watching %s: %w", gvk.Kind, err)
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
		synced = append(synced, inf.HasSyncedChecker())
	}
	w.client = &cachedClient{Client: live, cache: managed, watched: watched}

	// Only the control plane's nodes and static pods, selected as the
	// snapshot reads them: on a large cluster the other nodes and the
	// kube-system pods of every node change all the time.
	// Built as client-go's informer factory builds them, without linking the
	// factory: it reaches every API group's informer, lister and client.
	core := workload.CoreV1()
	w.nodes = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = wl.ControlPlaneNodeLabel
			return core.Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = wl.ControlPlaneNodeLabel
			return core.Nodes().Watch(ctx, o)
		},
	}, workload), &corev1.Node{}, 0, cache.Indexers{})
	w.pods = cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = wl.StaticPodSelector
			return core.Pods(metav1.NamespaceSystem).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = wl.StaticPodSelector
			return core.Pods(metav1.NamespaceSystem).Watch(ctx, o)
		},
	}, workload), &corev1.Pod{}, 0, cache.Indexers{})
	for _, inf := range []cache.SharedIndexInformer{w.nodes, w.pods} {
		// wl.Health reads neither managed fields nor annotations.
		_ = inf.SetTransform(func(obj any) (any, error) {
			if o, ok := obj.(metav1.Object); ok {
				o.SetManagedFields(nil)
				o.SetAnnotations(nil)
			}
			return obj, nil
		})
		if _, err := inf.AddEventHandler(handler); err != nil {
			return nil, err
		}
		synced = append(synced, inf.HasSyncedChecker())
		go inf.RunWithContext(ctx)
	}
	go func() { _ = managed.Start(ctx) }()

	// WaitFor returns as the last list arrives; WaitForCacheSync would look
	// every 100 ms.
	syncCtx, cancel := context.WithTimeout(ctx, syncLimit)
	defer cancel()
	if !cache.WaitFor(syncCtx, "", synced...) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("watching the control plane of %s/%s: the first lists did not arrive within %s", scope.Namespace, scope.Cluster, syncLimit)
	}
	return w, nil
}

// watchedObject is one kind the caches hold and which of its objects.
type watchedObject struct {
	obj     client.Object
	selects crcache.ByObject
	// name is the one object watched, or "" for those with the cluster's
	// label.
	name string
}

// objects are the kinds to watch, each selected as narrowly as its reads
// allow: by name, or by the cluster-name label that Cluster API puts on the
// objects of a cluster (KCP sets it on every KubeadmConfig and InfraMachine
// it creates).
func (s Scope) objects() []watchedObject {
	ofCluster := labels.SelectorFromSet(labels.Set{clusterv1.ClusterNameLabel: s.Cluster})
	controlPlane, _ := labels.NewRequirement(clusterv1.MachineControlPlaneLabel, selection.Exists, nil)
	byName := func(obj client.Object, name string) watchedObject {
		return watchedObject{obj, crcache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", name), Label: labels.Everything()}, name}
	}
	out := []watchedObject{
		byName(&clusterv1.Cluster{}, s.Cluster),
		byName(&controlplanev1.KubeadmControlPlane{}, s.KCP),
		{obj: &clusterv1.Machine{}, selects: crcache.ByObject{Label: ofCluster.Add(*controlPlane)}},
		{obj: &bootstrapv1.KubeadmConfig{}, selects: crcache.ByObject{Label: ofCluster}},
	}
	if !s.Template.GVK.Empty() {
		out = append(out, byName(unstructuredOf(s.Template.GVK), s.Template.Name))
	}
	for _, gvk := range s.InfraMachines {
		out = append(out, watchedObject{obj: unstructuredOf(gvk), selects: crcache.ByObject{Label: ofCluster}})
	}
	return out
}

func unstructuredOf(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

func (w *Watches) notify() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// Client reads the management cluster from the caches where they hold the
// kind, and live otherwise; it writes live. It is for controlplane.Client's
// Read alone: the caches hold the cluster's control-plane Machines only, so
// a list of all its Machines would come back short.
func (w *Watches) Client() client.Client { return w.client }

// Nodes is wl.Client's Nodes as the watches see the nodes and pods.
func (w *Watches) Nodes(_ context.Context, names []string, components []string) (map[string]wl.Node, error) {
	return wl.Health(listed[corev1.Node](w.nodes), listed[corev1.Pod](w.pods), names, components), nil
}

// listed is what an informer holds; callers must not change it.
func listed[T any](inf cache.SharedIndexInformer) []*T {
	items := inf.GetStore().List()
	out := make([]*T, 0, len(items))
	for _, item := range items {
		if t, ok := item.(*T); ok {
			out = append(out, t)
		}
	}
	return out
}

// Wait blocks until a change (true), ctx's end, or at most max (false) — the
// bound covers what no watch reports (etcd membership and health, which are
// polled).
func (w *Watches) Wait(ctx context.Context, max time.Duration) bool {
	t := time.NewTimer(max)
	defer t.Stop()
	var c <-chan struct{}
	if w != nil {
		c = w.signal
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

// burst is how long a change waits for the ones that come with it. The
// watches deliver one write's events within a few milliseconds of each other;
// what the caller does next, a read of the caches, costs no round trip, and
// every millisecond here is a millisecond of every reaction, so the pause is
// no longer than one write's events take to arrive (docs/performance.md has
// the reaction times `make bench` measured with it and with a longer one).
const burst = 5 * time.Millisecond

// cachedClient is the live client with reads of the watched kinds served
// from the caches.
type cachedClient struct {
	client.Client
	cache client.Reader
	// watched maps each watched kind to the one object watched, or to "" for
	// a kind watched by the cluster's label.
	watched map[schema.GroupVersionKind]string
}

// Get serves a watched object from the cache; another object of a kind
// watched by name (a template the KubeadmControlPlane was switched to) is
// read live. A kind watched by the cluster-name label is answered from the
// cache alone, not found included: KCP puts the label on every
// KubeadmConfig and InfraMachine it creates, and a deleting machine's are
// gone long before the machine is, so reading them live would cost two
// requests per wait.
func (c *cachedClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if c.serves(obj, key.Name) && len(opts) == 0 {
		return c.cache.Get(ctx, key, obj)
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// List serves a list of a watched kind from the cache, which applies the
// list's selectors to what it holds.
func (c *cachedClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	gvk, err := apiutil.GVKForObject(list, c.Scheme())
	if err != nil {
		return err
	}
	if name, ok := c.watched[gvk.GroupVersion().WithKind(strings.TrimSuffix(gvk.Kind, "List"))]; ok && name == "" {
		return c.cache.List(ctx, list, opts...)
	}
	return c.Client.List(ctx, list, opts...)
}

// serves is true for the watched objects; metadata-only reads are always
// live.
func (c *cachedClient) serves(obj client.Object, name string) bool {
	if _, partial := obj.(*metav1.PartialObjectMetadata); partial {
		return false
	}
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return false
	}
	watched, ok := c.watched[gvk]
	return ok && (watched == "" || watched == name)
}
