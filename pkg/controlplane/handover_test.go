package controlplane

import (
	"context"
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// TestKCPControllerVersion: the controller's Deployment is read by
// clusterctl's name, which the roles grant, and the list across namespaces
// is asked only when it is not there; a list refused then says to pass
// --kcp-version.
func TestKCPControllerVersion(t *testing.T) {
	deployment := func(namespace, name, tag string) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
				Labels: map[string]string{clusterv1.ProviderNameLabel: "control-plane-kubeadm"}},
			Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "manager", Image: "registry.k8s.io/cluster-api/kubeadm-control-plane-controller:" + tag}}}}},
		}
	}
	for _, c := range []struct {
		name        string
		deployment  *appsv1.Deployment
		refuseLists bool
		want        string
		wantLists   int
		wantCode    int
	}{
		{name: "clusterctl's install", deployment: deployment(KCPControllerNamespace, KCPControllerDeployment, "v1.14.2"), refuseLists: true, want: "v1.14.2"},
		{name: "custom install, list allowed", deployment: deployment("kcp", "kcp-manager", "v1.13.6"), want: "v1.13.6", wantLists: 1},
		{name: "custom install, list refused", deployment: deployment("kcp", "kcp-manager", "v1.13.6"), refuseLists: true, wantLists: 1, wantCode: exitcode.Unsafe},
	} {
		lists := 0
		mgmt := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(c.deployment).WithInterceptorFuncs(interceptor.Funcs{
			List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
				lists++
				if c.refuseLists {
					return apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, "", errors.New("get by name only"))
				}
				return cl.List(ctx, list, opts...)
			},
		}).Build()
		got, err := New(mgmt, "default", "demo").KCPControllerVersion(context.Background())
		if got != c.want || lists != c.wantLists || exitcode.Of(err) != c.wantCode {
			t.Errorf("%s: %q, %d lists, exit %d (%v); want %q, %d lists, exit %d", c.name, got, lists, exitcode.Of(err), err, c.want, c.wantLists, c.wantCode)
		}
	}
}
