package controlplane

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestStoppedCreationCleansUpWithinABound: Ctrl-C right after a
// replacement's InfraMachine is applied stops the creation; the InfraMachine
// is deleted even so, on a context that no longer carries the run's
// cancellation but has a deadline of its own, so an API server that stopped
// answering cannot hold the exit.
func TestStoppedCreationCleansUpWithinABound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	live, cluster, kcp := startAPIServer(t, ctx, pausedByThisTool)
	template := &unstructured.Unstructured{}
	template.SetAPIVersion("infrastructure.cluster.x-k8s.io/v1beta2")
	template.SetKind(kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Kind)
	template.SetNamespace(kcp.Namespace)
	template.SetName(kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name)
	_ = unstructured.SetNestedMap(template.Object, map[string]any{}, "spec", "template", "spec")
	if err := live.Create(ctx, template); err != nil {
		t.Fatal(err)
	}

	runCtx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	var mu sync.Mutex
	var deleted []string
	var deadlines []bool
	c := interceptor.NewClient(live, interceptor.Funcs{
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			err := c.Apply(ctx, obj, opts...)
			interrupt() // the user presses Ctrl-C as the first piece is made
			return err
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			_, bounded := ctx.Deadline()
			mu.Lock()
			deleted, deadlines = append(deleted, obj.GetName()), append(deadlines, bounded)
			mu.Unlock()
			return c.Delete(ctx, obj, opts...)
		},
	})
	_, err := New(c, cluster.Namespace, cluster.Name).CreateMachine(runCtx, kcp, cluster, "", true)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("creation after Ctrl-C: %v, want it stopped by the cancellation", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deleted) != 1 || !deadlines[0] {
		t.Fatalf("deleted %v with deadlines %v; want the InfraMachine deleted on a bounded context", deleted, deadlines)
	}
	infra := &unstructured.Unstructured{}
	infra.SetAPIVersion("infrastructure.cluster.x-k8s.io/v1beta2")
	infra.SetKind("GenericInfrastructureMachine")
	if err := live.Get(ctx, client.ObjectKey{Namespace: kcp.Namespace, Name: deleted[0]}, infra); !apierrors.IsNotFound(err) {
		t.Fatalf("InfraMachine %s after the cleanup: %v, want it gone", deleted[0], err)
	}
}
