package controlplane

import (
	"context"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// TestCRDMetadataReadOnce: a CRD's metadata is read from the API server once,
// then from memory; a missing CRD is asked again; other reads always go to
// the API server.
func TestCRDMetadataReadOnce(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = apiextensionsv1.AddToScheme(scheme)
	_ = clusterv1.AddToScheme(scheme)
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{
		Name: "awsmachines.infrastructure.cluster.x-k8s.io", Labels: map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta2"}}}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}}
	reads := map[string]int{}
	base := fake.NewClientBuilder().WithScheme(scheme).WithObjects(crd, cluster).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			reads[key.Name]++
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	c := withCRDMetadataCache(base)
	ctx := context.Background()
	get := func(name string) (*metav1.PartialObjectMetadata, error) {
		meta := &metav1.PartialObjectMetadata{}
		meta.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
		return meta, c.Get(ctx, client.ObjectKey{Name: name}, meta)
	}
	for range 3 {
		meta, err := get(crd.Name)
		if err != nil || meta.Labels["cluster.x-k8s.io/v1beta2"] != "v1beta2" {
			t.Fatalf("got %v, %v", meta, err)
		}
		meta.Labels["changed"] = "by the caller" // must not reach the remembered copy
		if _, err := get("missing.infrastructure.cluster.x-k8s.io"); err == nil {
			t.Fatal("a missing CRD was found")
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), &clusterv1.Cluster{}); err != nil {
			t.Fatal(err)
		}
	}
	if meta, _ := get(crd.Name); meta.Labels["changed"] != "" {
		t.Error("a caller's change reached the remembered metadata")
	}
	if reads[crd.Name] != 1 || reads["missing.infrastructure.cluster.x-k8s.io"] != 3 || reads["demo"] != 3 {
		t.Errorf("reads from the API server %v: want the CRD once, the missing one and the Cluster every time", reads)
	}
}
