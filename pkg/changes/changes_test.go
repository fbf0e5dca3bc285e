package changes

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
)

// TestCachedClientReadsTheWatchedObjectsFromTheCaches: the watched objects
// come from the caches, not-found included; another template, metadata-only
// reads and unwatched kinds go to the API server.
func TestCachedClientReadsTheWatchedObjectsFromTheCaches(t *testing.T) {
	ctx := context.Background()
	template := schema.GroupVersionKind{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Kind: "DevMachineTemplate"}
	scope := Scope{Namespace: "default", Cluster: "demo", KCP: "demo-cp", Template: Object{GVK: template, Name: "demo-cp"}}
	inCache := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "in-cache"}}
	live := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "live-only"}}
	cache := fake.NewClientBuilder().WithScheme(controlplane.Scheme()).WithObjects(inCache).Build()
	api := fake.NewClientBuilder().WithScheme(controlplane.Scheme()).WithObjects(inCache.DeepCopy(), live).Build()
	c := &cachedClient{Client: api, cache: cache, watched: map[schema.GroupVersionKind]string{}}
	for _, o := range scope.objects() {
		gvk, err := apiutil.GVKForObject(o.obj, controlplane.Scheme())
		if err != nil {
			t.Fatal(err)
		}
		c.watched[gvk] = o.name
	}

	for _, tc := range []struct {
		name  string
		obj   client.Object
		key   client.ObjectKey
		cache bool
	}{
		{"a watched Machine", &clusterv1.Machine{}, client.ObjectKey{Namespace: "default", Name: "in-cache"}, true},
		{"a Machine the caches do not hold", &clusterv1.Machine{}, client.ObjectKey{Namespace: "default", Name: "live-only"}, true},
		{"the KubeadmControlPlane", &controlplanev1.KubeadmControlPlane{}, client.ObjectKey{Namespace: "default", Name: "demo-cp"}, true},
		{"another KubeadmControlPlane", &controlplanev1.KubeadmControlPlane{}, client.ObjectKey{Namespace: "default", Name: "other"}, false},
		{"the template", unstructuredOf(template), client.ObjectKey{Namespace: "default", Name: "demo-cp"}, true},
		{"another template", unstructuredOf(template), client.ObjectKey{Namespace: "default", Name: "demo-cp-v2"}, false},
		{"a Machine's metadata", metadataOf(clusterv1.GroupVersion.WithKind("Machine")), client.ObjectKey{Namespace: "default", Name: "in-cache"}, false},
		{"a MachineDeployment", &clusterv1.MachineDeployment{}, client.ObjectKey{Namespace: "default", Name: "md"}, false},
	} {
		if got := c.serves(tc.obj, tc.key.Name); got != tc.cache {
			t.Errorf("%s: from the caches %v, want %v", tc.name, got, tc.cache)
		}
	}

	// Not found in the caches is not found: no read goes to the API server.
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "live-only"}, &clusterv1.Machine{}); err == nil {
		t.Error("a Machine the caches do not hold was read from the API server")
	}
	var configs bootstrapv1.KubeadmConfigList
	if err := c.List(ctx, &configs); err != nil {
		t.Errorf("listing KubeadmConfigs from the caches: %v", err)
	}
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines); err != nil || len(machines.Items) != 1 {
		t.Errorf("listing Machines: %d, %v; want the one the caches hold", len(machines.Items), err)
	}
	var clusters clusterv1.ClusterList
	if err := c.List(ctx, &clusters); err != nil {
		t.Errorf("listing Clusters live: %v", err)
	}
}

func metadataOf(gvk schema.GroupVersionKind) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	return m
}
