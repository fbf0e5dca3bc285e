package controlplane

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestReleaseAfterALateRenewal: a renewal the API server writes after
// Release read the Lease makes the guarded delete conflict; Release reads the
// Lease again and deletes it, instead of failing a finished run.
func TestReleaseAfterALateRenewal(t *testing.T) {
	ctx := context.Background()
	deletes := 0
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if deletes++; deletes == 1 {
				return apierrors.NewConflict(coordinationv1.Resource("leases"), obj.GetName(), nil)
			}
			return c.Delete(ctx, obj, opts...)
		},
	}).Build()
	cp := New(c, "default", "demo")
	lock, err := cp.Acquire(ctx, "ops@bastion/pid-7")
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatalf("release after a conflict: %v", err)
	}
	if lease, err := cp.Lease(ctx); err != nil || lease != nil {
		t.Errorf("the Lease is still there (%v, %v)", lease, err)
	}
	if deletes != 2 {
		t.Errorf("%d deletes, want the conflicting one and one more", deletes)
	}
}
