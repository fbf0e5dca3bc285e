package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
)

// TestReadWithoutKubeadmConfigs: an identity that may not read KubeadmConfigs
// (cp-rollout-view: they hold the node-join token) asks for none, and
// Read does not fail for it. Without them, a machine is outdated when KCP's
// comparison of what was read says so (its version) or when KCP's own
// UpToDate condition on it, written for the spec at hand, says so (its
// KubeadmConfig); up to date when that condition says so; and unjudged
// otherwise: no condition, one for an older generation of the machine, or
// any condition while KCP has not observed its own spec. An identity that
// may read them reads them as before, and nothing is unjudged.
func TestReadWithoutKubeadmConfigs(t *testing.T) {
	const ns, name, version = "default", "demo", "v1.36.3"
	infraGV := schema.GroupVersion{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2"}
	crd := func(plural string) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{
			Name: plural + "." + infraGV.Group, Labels: map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta2"}}}
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: clusterv1.ClusterSpec{ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: name + "-cp"}}}
	kcp := &controlplanev1.KubeadmControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-cp", Namespace: ns, UID: "kcp-uid", Generation: 4},
		Spec: controlplanev1.KubeadmControlPlaneSpec{Version: version,
			MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{Spec: controlplanev1.KubeadmControlPlaneMachineTemplateSpec{
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infraGV.Group, Kind: "GenericInfrastructureMachineTemplate", Name: "tmpl"}}}},
		Status: controlplanev1.KubeadmControlPlaneStatus{ObservedGeneration: 4},
	}
	labels := map[string]string{clusterv1.ClusterNameLabel: name, clusterv1.MachineControlPlaneLabel: ""}
	template := &unstructured.Unstructured{}
	template.SetGroupVersionKind(infraGV.WithKind("GenericInfrastructureMachineTemplate"))
	template.SetNamespace(ns)
	template.SetName("tmpl")
	_ = unstructured.SetNestedMap(template.Object, map[string]any{"providerID": "x"}, "spec", "template", "spec")

	// Each machine, what KCP's UpToDate condition on it says, and for which
	// generation of the machine (its own is 1).
	type upToDate struct {
		status     metav1.ConditionStatus
		reason     string
		generation int64
	}
	machines := []struct {
		name, version string
		condition     *upToDate
		// outdatedConfig: its KubeadmConfig differs from the KCP's spec,
		// which only a read of it shows.
		outdatedConfig bool
	}{
		{name: "old-version", version: "v1.35.2", condition: &upToDate{metav1.ConditionFalse, clusterv1.MachineNotUpToDateReason, 1}},
		{name: "up-to-date", version: version, condition: &upToDate{metav1.ConditionTrue, clusterv1.MachineUpToDateReason, 1}},
		{name: "outdated-config", version: version, outdatedConfig: true, condition: &upToDate{metav1.ConditionFalse, clusterv1.MachineNotUpToDateReason, 1}},
		{name: "kubelet-behind", version: version, condition: &upToDate{metav1.ConditionFalse, clusterv1.MachineUpToDateUpdatingReason, 1}},
		{name: "no-condition", version: version},
		{name: "stale-condition", version: version, condition: &upToDate{metav1.ConditionTrue, clusterv1.MachineUpToDateReason, 0 /* set below */}},
	}
	objs := []client.Object{crd("genericinfrastructuremachines"), crd("genericinfrastructuremachinetemplates"), cluster, kcp, template}
	for _, spec := range machines {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: spec.name, Namespace: ns, Labels: labels, Generation: 2,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: controlplanev1.GroupVersion.String(), Kind: "KubeadmControlPlane",
				Name: kcp.Name, UID: kcp.UID, Controller: ptr.To(true)}}},
			Spec: clusterv1.MachineSpec{ClusterName: name, Version: spec.version,
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infraGV.Group, Kind: "GenericInfrastructureMachine", Name: spec.name},
				Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: spec.name}}}}
		if c := spec.condition; c != nil {
			generation := m.Generation
			if spec.name == "stale-condition" {
				generation = m.Generation - 1 // KCP judged the machine before its spec last changed
			}
			m.Status.Conditions = []metav1.Condition{{Type: clusterv1.MachineUpToDateCondition, Status: c.status, Reason: c.reason, ObservedGeneration: generation}}
		}
		infra := &unstructured.Unstructured{}
		infra.SetGroupVersionKind(infraGV.WithKind("GenericInfrastructureMachine"))
		infra.SetNamespace(ns)
		infra.SetName(spec.name)
		infra.SetLabels(labels)
		infra.SetAnnotations(map[string]string{clusterv1.TemplateClonedFromNameAnnotation: "tmpl",
			clusterv1.TemplateClonedFromGroupKindAnnotation: "GenericInfrastructureMachineTemplate." + infraGV.Group})
		config := &bootstrapv1.KubeadmConfig{ObjectMeta: metav1.ObjectMeta{Name: spec.name, Namespace: ns, Labels: labels}}
		config.Spec.JoinConfiguration.Discovery.BootstrapToken.Token = "abcdef.0123456789abcdef"
		if spec.outdatedConfig {
			config.Spec.ClusterConfiguration.APIServer.ExtraArgs = []bootstrapv1.Arg{{Name: "audit-log-maxage", Value: ptr.To("7")}}
		}
		objs = append(objs, m, infra, config)
	}

	scheme := Scheme()
	_ = apiextensionsv1.AddToScheme(scheme)
	// build is the management cluster as an identity sees it: mayReadConfigs
	// answers its access review; every read of a KubeadmConfig is recorded.
	build := func(mayReadConfigs bool, objs ...client.Object) (client.Client, func() []string) {
		var (
			mu    sync.Mutex
			reads []string
		)
		record := func(what string) {
			mu.Lock()
			reads = append(reads, what)
			mu.Unlock()
		}
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				review, ok := obj.(*authorizationv1.SelfSubjectAccessReview)
				if !ok {
					return c.Create(ctx, obj, opts...)
				}
				a := review.Spec.ResourceAttributes
				review.Status.Allowed = mayReadConfigs || a.Resource != "kubeadmconfigs"
				record(fmt.Sprintf("can-i %s %s.%s in %s", a.Verb, a.Resource, a.Group, a.Namespace))
				return nil
			},
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if gvk, _ := c.GroupVersionKindFor(obj); gvk.GroupKind() == kubeadmConfigKind {
					record("get KubeadmConfig " + key.Name)
				}
				return c.Get(ctx, key, obj, opts...)
			},
			List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
				if gvk, _ := c.GroupVersionKindFor(list); gvk.Kind == "KubeadmConfigList" {
					record("list KubeadmConfigs")
				}
				return c.List(ctx, list, opts...)
			},
		}).Build()
		return c, func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(reads)
		}
	}
	ctx := context.Background()
	read := func(t *testing.T, mayReadConfigs bool, objs ...client.Object) (*Client, *kcpstate.ControlPlane, []string) {
		t.Helper()
		c, reads := build(mayReadConfigs, objs...)
		cpc := New(c, ns, name)
		cp, err := cpc.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cpc.Read(ctx); err != nil { // asked once per Client
			t.Fatal(err)
		}
		return cpc, cp, reads()
	}
	names := func(cp *kcpstate.ControlPlane, c *Client) (outdated, unjudged string) {
		o, u := cp.MachinesNotUpToDate.Names(), c.Unjudged(cp).Names()
		slices.Sort(o)
		slices.Sort(u)
		return strings.Join(o, ","), strings.Join(u, ",")
	}

	t.Run("may read KubeadmConfigs", func(t *testing.T) {
		c, cp, reads := read(t, true, objs...)
		want := []string{"can-i get kubeadmconfigs.bootstrap.cluster.x-k8s.io in default", "list KubeadmConfigs", "list KubeadmConfigs"}
		if !slices.Equal(reads, want) {
			t.Errorf("requests %q, want %q: asked once, then listed once per snapshot as before", reads, want)
		}
		outdated, unjudged := names(cp, c)
		if c.KubeadmConfigsUnread() || outdated != "old-version,outdated-config" || unjudged != "" || len(cp.KubeadmConfigs) != len(machines) {
			t.Errorf("unread %v, outdated %q, unjudged %q, %d KubeadmConfigs: want false, KCP's full comparison, none, all",
				c.KubeadmConfigsUnread(), outdated, unjudged, len(cp.KubeadmConfigs))
		}
	})

	t.Run("may not read KubeadmConfigs", func(t *testing.T) {
		c, cp, reads := read(t, false, objs...)
		if want := []string{"can-i get kubeadmconfigs.bootstrap.cluster.x-k8s.io in default"}; !slices.Equal(reads, want) {
			t.Errorf("requests %q, want %q: the question alone, no refused read", reads, want)
		}
		outdated, unjudged := names(cp, c)
		if !c.KubeadmConfigsUnread() || outdated != "old-version,outdated-config" || unjudged != "no-condition,stale-condition" || len(cp.KubeadmConfigs) != 0 {
			t.Errorf("unread %v, outdated %q, unjudged %q, %d KubeadmConfigs: want true, old-version and outdated-config, no-condition and stale-condition, none",
				c.KubeadmConfigsUnread(), outdated, unjudged, len(cp.KubeadmConfigs))
		}
		// A projection to another version (plan's) asks for none either.
		want := kcp.DeepCopy()
		want.Spec.Version = "v1.37.0"
		projected, err := c.WithKCP(ctx, cp, want)
		if err != nil {
			t.Fatal(err)
		}
		if projected.MachinesNotUpToDate.Len() != len(machines) {
			t.Errorf("projected to %s: outdated %v, want every machine", want.Spec.Version, projected.MachinesNotUpToDate.Names())
		}
	})

	t.Run("may not read KubeadmConfigs, KCP behind its spec", func(t *testing.T) {
		// The spec changed since KCP last reconciled (a paused KCP observes
		// nothing): its conditions speak of an older spec.
		behind := slices.Clone(objs)
		for i, o := range behind {
			if k, ok := o.(*controlplanev1.KubeadmControlPlane); ok {
				k = k.DeepCopy()
				k.Status.ObservedGeneration = k.Generation - 1
				behind[i] = k
			}
		}
		c, cp, _ := read(t, false, behind...)
		outdated, unjudged := names(cp, c)
		if outdated != "old-version" || unjudged != "kubelet-behind,no-condition,outdated-config,stale-condition,up-to-date" {
			t.Errorf("outdated %q, unjudged %q: want old-version (its version) and every other machine unjudged", outdated, unjudged)
		}
	})
}
