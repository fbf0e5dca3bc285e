package controlplane

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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
	withTemplate(t, ctx, live, kcp)

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
	if err := live.Get(ctx, client.ObjectKey{Namespace: kcp.Namespace, Name: deleted[0]}, infraMachine()); !apierrors.IsNotFound(err) {
		t.Fatalf("InfraMachine %s after the cleanup: %v, want it gone", deleted[0], err)
	}
}

// withTemplate creates the InfraMachineTemplate kcp names.
func withTemplate(t *testing.T, ctx context.Context, c client.Client, kcp *controlplanev1.KubeadmControlPlane) {
	t.Helper()
	template := &unstructured.Unstructured{}
	template.SetAPIVersion("infrastructure.cluster.x-k8s.io/v1beta2")
	template.SetKind(kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Kind)
	template.SetNamespace(kcp.Namespace)
	template.SetName(kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name)
	_ = unstructured.SetNestedMap(template.Object, map[string]any{}, "spec", "template", "spec")
	if err := c.Create(ctx, template); err != nil {
		t.Fatal(err)
	}
}

func infraMachine() *unstructured.Unstructured {
	infra := &unstructured.Unstructured{}
	infra.SetAPIVersion("infrastructure.cluster.x-k8s.io/v1beta2")
	infra.SetKind("GenericInfrastructureMachine")
	return infra
}

// TestAmbiguousMachineCreateKeepsItsPieces: a Machine apply whose answer is
// a timeout or a 5xx may have been applied (here it was), and the look that
// would tell fails too, as it does against the same troubled API server: the
// InfraMachine and KubeadmConfig must stay, or the Machine is left
// referencing nothing. A plain refusal (403) applied nothing: its pieces go.
func TestAmbiguousMachineCreateKeepsItsPieces(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	live, cluster, kcp := startAPIServer(t, ctx, pausedByThisTool)
	withTemplate(t, ctx, live, kcp)
	machines := schema.GroupResource{Group: clusterv1.GroupVersion.Group, Resource: "machines"}
	for _, tc := range []struct {
		name    string
		answer  error
		applied bool // whether the API server applied the Machine before answering
		kept    bool
	}{
		{"timeout after the apply", apierrors.NewTimeoutError("request did not complete within 34s", 0), true, true},
		{"503 after the apply", apierrors.NewServiceUnavailable("etcdserver: leader changed"), true, true},
		{"connection reset, not applied", errors.New("read tcp 10.0.0.1:6443: connection reset by peer"), false, true},
		// client-go retries a 5xx with Retry-After: the retry's 429 may
		// answer a request whose first attempt was applied.
		{"429 after a retried apply", apierrors.NewTooManyRequests("the server is busy", 1), true, true},
		{"forbidden", apierrors.NewForbidden(machines, "", errors.New("denied by policy")), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var deletes []string
			c := interceptor.NewClient(live, interceptor.Funcs{
				Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
					if obj.(interface{ GetKind() string }).GetKind() != "Machine" {
						return c.Apply(ctx, obj, opts...)
					}
					if tc.applied {
						if err := c.Apply(ctx, obj, opts...); err != nil {
							return err
						}
					}
					return tc.answer
				},
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if _, ok := obj.(*clusterv1.Machine); ok {
						return apierrors.NewServiceUnavailable("etcdserver: leader changed")
					}
					return c.Get(ctx, key, obj, opts...)
				},
				Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
					deletes = append(deletes, obj.GetName())
					return c.Delete(ctx, obj, opts...)
				},
			})
			_, err := New(c, cluster.Namespace, cluster.Name).CreateMachine(ctx, kcp, cluster, "", true)
			if err == nil {
				t.Fatal("the creation succeeded")
			}
			if tc.kept {
				if len(deletes) > 0 || !strings.Contains(err.Error(), "cannot be told") {
					t.Fatalf("deleted %v, error %q; want the pieces left and the error to say why", deletes, err)
				}
			} else if len(deletes) != 2 {
				t.Fatalf("deleted %v after a refusal; want the InfraMachine and the KubeadmConfig", deletes)
			}
			configs := &bootstrapv1.KubeadmConfigList{}
			if err := live.List(ctx, configs, client.InNamespace(cluster.Namespace)); err != nil {
				t.Fatal(err)
			}
			for _, kc := range configs.Items {
				mine := &clusterv1.Machine{}
				err := live.Get(ctx, client.ObjectKey{Namespace: kc.Namespace, Name: kc.Name}, mine)
				switch {
				case err == nil && !tc.applied:
					t.Errorf("Machine %s exists though the apply was not made", kc.Name)
				case apierrors.IsNotFound(err) && tc.kept:
					// Left for the next run's orphan cleanup.
				case err != nil && !apierrors.IsNotFound(err):
					t.Fatal(err)
				}
				_ = live.Delete(ctx, mine)
				_ = live.Delete(ctx, &kc)
			}
			if !tc.kept && len(configs.Items) > 0 {
				t.Errorf("KubeadmConfigs %v left after a refused create", configs.Items[0].Name)
			}
			infras := &unstructured.UnstructuredList{}
			infras.SetAPIVersion("infrastructure.cluster.x-k8s.io/v1beta2")
			infras.SetKind("GenericInfrastructureMachineList")
			if err := live.List(ctx, infras, client.InNamespace(cluster.Namespace)); err != nil {
				t.Fatal(err)
			}
			if (len(infras.Items) > 0) != tc.kept {
				t.Errorf("%d InfraMachines after the create, want them kept: %v", len(infras.Items), tc.kept)
			}
			for i := range infras.Items {
				_ = live.Delete(ctx, &infras.Items[i])
			}
		})
	}
}
