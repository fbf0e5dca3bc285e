package controlplane

import (
	"context"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// crdMetadata serves the CustomResourceDefinition metadata reads of CAPI's
// contract lookups from memory after the first read of each CRD. Those
// lookups (which API version of an InfraMachine or its template to use) come
// with every InfraMachine and template read, so a live snapshot of three
// machines made a dozen of them, a third of a rollout's requests. KCP serves
// them from its informer cache too; a CRD's contract labels change when a
// provider is upgraded, not within a rollout. Everything else still goes to
// the API server.
type crdMetadata struct {
	client.Client
	mu   sync.Mutex
	seen map[client.ObjectKey]*metav1.PartialObjectMetadata
}

func withCRDMetadataCache(c client.Client) client.Client {
	return &crdMetadata{Client: c, seen: map[client.ObjectKey]*metav1.PartialObjectMetadata{}}
}

func (c *crdMetadata) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	meta, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok || meta.GroupVersionKind() != apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition") {
		return c.Client.Get(ctx, key, obj, opts...)
	}
	c.mu.Lock()
	cached := c.seen[key]
	c.mu.Unlock()
	if cached != nil {
		cached.DeepCopyInto(meta)
		return nil
	}
	if err := c.Client.Get(ctx, key, meta, opts...); err != nil {
		return err // not remembered: a CRD installed later is found then
	}
	c.mu.Lock()
	c.seen[key] = meta.DeepCopy()
	c.mu.Unlock()
	return nil
}
