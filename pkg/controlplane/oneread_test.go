package controlplane

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
	"sigs.k8s.io/cluster-api/util/collections"
)

// TestSnapshotReadsEachObjectOnce: a snapshot of three machines lists the
// InfraMachines and KubeadmConfigs once each and reads the template once,
// and KCP's view built from those reads is the view built from one GET per
// object. An InfraMachine without the cluster's label is read on its own, and
// so is every object when the role does not allow the list.
func TestSnapshotReadsEachObjectOnce(t *testing.T) {
	const ns, name = "default", "demo"
	infraGV := schema.GroupVersion{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2"}
	crd := func(plural string) *apiextensionsv1.CustomResourceDefinition {
		return &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{
			Name: plural + "." + infraGV.Group, Labels: map[string]string{"cluster.x-k8s.io/v1beta2": "v1beta2"}}}
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: clusterv1.ClusterSpec{ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: name + "-cp"}}}
	kcp := &controlplanev1.KubeadmControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-cp", Namespace: ns, UID: "kcp-uid"},
		Spec: controlplanev1.KubeadmControlPlaneSpec{Version: "v1.36.3",
			MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{Spec: controlplanev1.KubeadmControlPlaneMachineTemplateSpec{
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infraGV.Group, Kind: "GenericInfrastructureMachineTemplate", Name: "tmpl"}}}},
	}
	labels := map[string]string{clusterv1.ClusterNameLabel: name, clusterv1.MachineControlPlaneLabel: ""}
	template := &unstructured.Unstructured{}
	template.SetGroupVersionKind(infraGV.WithKind("GenericInfrastructureMachineTemplate"))
	template.SetNamespace(ns)
	template.SetName("tmpl")
	_ = unstructured.SetNestedMap(template.Object, map[string]any{"providerID": "x"}, "spec", "template", "spec")
	objs := []client.Object{crd("genericinfrastructuremachines"), crd("genericinfrastructuremachinetemplates"), cluster, kcp, template}
	machines := collections.New()
	for i, version := range []string{"v1.35.2", "v1.36.3", "v1.36.3"} {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("m%d", i), Namespace: ns, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: controlplanev1.GroupVersion.String(), Kind: "KubeadmControlPlane",
				Name: kcp.Name, UID: kcp.UID, Controller: ptr.To(true)}}},
			Spec: clusterv1.MachineSpec{ClusterName: name, Version: version,
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infraGV.Group, Kind: "GenericInfrastructureMachine", Name: fmt.Sprintf("m%d", i)},
				Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: fmt.Sprintf("m%d", i)}}}}
		machines.Insert(m)
		infra := &unstructured.Unstructured{}
		infra.SetGroupVersionKind(infraGV.WithKind("GenericInfrastructureMachine"))
		infra.SetNamespace(ns)
		infra.SetName(m.Name)
		infra.SetAnnotations(map[string]string{clusterv1.TemplateClonedFromNameAnnotation: "tmpl",
			clusterv1.TemplateClonedFromGroupKindAnnotation: "GenericInfrastructureMachineTemplate." + infraGV.Group})
		if i != 2 {
			infra.SetLabels(labels) // m2's InfraMachine lacks the label: read on its own
		}
		config := &bootstrapv1.KubeadmConfig{ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: ns, Labels: labels}}
		objs = append(objs, m, infra, config)
	}

	scheme := Scheme()
	_ = apiextensionsv1.AddToScheme(scheme)
	type counts map[string]int
	// build counts each read; a snapshot's reads run side by side, so the
	// count is locked, and together (when given) holds reads until the
	// others of their group have begun.
	build := func(refuseLists bool, together *sideBySide) (client.Client, counts) {
		n := counts{}
		var mu sync.Mutex
		count := func(read string) {
			mu.Lock()
			n[read]++
			mu.Unlock()
			together.arrive(read)
		}
		c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if _, crd := obj.(*metav1.PartialObjectMetadata); !crd {
					gvk, _ := c.GroupVersionKindFor(obj)
					count("get " + gvk.Kind + " " + key.Name)
				}
				return c.Get(ctx, key, obj, opts...)
			},
			List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
				gvk, _ := c.GroupVersionKindFor(list)
				count("list " + gvk.Kind)
				if refuseLists && gvk.Kind != "MachineList" {
					return apierrors.NewForbidden(schema.GroupResource{Resource: gvk.Kind}, "", fmt.Errorf("get only"))
				}
				return c.List(ctx, list, opts...)
			},
		}).Build()
		return withCRDMetadataCache(c), n
	}
	ctx := context.Background()

	plain, perObject := build(false, nil)
	want, err := kcpstate.NewControlPlane(ctx, nil, plain, cluster, kcp, machines)
	if err != nil {
		t.Fatal(err)
	}
	if perObject["get GenericInfrastructureMachineTemplate tmpl"] != 3 {
		t.Fatalf("KCP's own reads %v: the template is not read per machine, nothing to share", perObject)
	}
	for _, refuse := range []bool{false, true} {
		c, n := build(refuse, nil)
		got, err := kcpstate.NewControlPlane(ctx, nil, newOneRead(c, cluster, machines), cluster, kcp, machines)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.MachinesNotUpToDate.Names(), want.MachinesNotUpToDate.Names()) || len(got.MachinesNotUpToDate) != 1 ||
			!reflect.DeepEqual(got.KubeadmConfigs, want.KubeadmConfigs) || !reflect.DeepEqual(got.InfraResources, want.InfraResources) {
			t.Errorf("lists refused %v: KCP's view differs from one built with a GET per object: outdated %v, want %v",
				refuse, got.MachinesNotUpToDate.Names(), want.MachinesNotUpToDate.Names())
		}
		// KCP's UpToDate reads the template for every machine.
		wantCounts := counts{"list GenericInfrastructureMachineList": 1, "list KubeadmConfigList": 1,
			"get GenericInfrastructureMachine m2": 1, "get GenericInfrastructureMachineTemplate tmpl": 1}
		if refuse {
			for _, m := range []string{"m0", "m1", "m2"} {
				wantCounts["get GenericInfrastructureMachine "+m], wantCounts["get KubeadmConfig "+m] = 1, 1
			}
		}
		if !reflect.DeepEqual(n, wantCounts) {
			t.Errorf("lists refused %v: requests %v, want %v", refuse, n, wantCounts)
		}
	}

	// A snapshot's projection (WithKCP, to the target version), the kinds
	// its watches cache (InfraKinds) and the replacement cloned on it
	// (CreateReplacement) take the InfraMachines and KubeadmConfigs the
	// snapshot itself holds, whichever snapshot was read after it, and read
	// the template live, once each.
	// Read takes the snapshot in two rounds of reads side by side: the
	// Machines beside the Cluster (and then its KCP), then the InfraMachines,
	// the KubeadmConfigs and the template together.
	together := &sideBySide{t: t, groups: [][]string{
		{"get Cluster " + name, "list MachineList"},
		{"list GenericInfrastructureMachineList", "list KubeadmConfigList", "get GenericInfrastructureMachineTemplate tmpl"},
	}}
	c, n := build(false, together)
	cpc := New(c, ns, name)
	read, err := cpc.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	together.groups = nil
	if read.Machines.Len() != 3 {
		t.Fatalf("Read found machines %v, want m0, m1, m2", read.Machines.Names())
	}
	if _, err := cpc.Read(ctx); err != nil { // a later snapshot changes nothing for read's
		t.Fatal(err)
	}
	before := maps.Clone(n)
	templateReads := func() int {
		return n["get GenericInfrastructureMachineTemplate tmpl"] - before["get GenericInfrastructureMachineTemplate tmpl"]
	}
	target := kcp.DeepCopy()
	target.Spec.Version = "v1.37.0"
	projected, err := cpc.WithKCP(ctx, read, target)
	if err != nil {
		t.Fatal(err)
	}
	if projected.MachinesNotUpToDate.Len() != 3 {
		t.Errorf("projected to %s, outdated machines %v, want all three", target.Spec.Version, projected.MachinesNotUpToDate.Names())
	}
	if _, _, err := cpc.InfraKinds(ctx, read); err != nil {
		t.Fatal(err)
	}
	if _, err := cpc.CreateReplacement(ctx, read, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := cpc.WithKCP(ctx, want, target); err != nil {
		t.Fatal(err)
	}
	for k, v := range n {
		if k != "get GenericInfrastructureMachineTemplate tmpl" && strings.HasPrefix(k, "get ") || strings.HasPrefix(k, "list ") {
			if v != before[k] {
				t.Errorf("WithKCP, InfraKinds and CreateReplacement on a snapshot read its objects again: %s %d times, after Read %d", k, v, before[k])
			}
		}
	}
	if got := templateReads(); got != 4 {
		t.Errorf("WithKCP twice, InfraKinds and CreateReplacement read the template %d times; want once each, live", got)
	}
}

// sideBySide holds each read of its groups until every read of the group has
// begun, and fails the test when one waits in vain: reads made one after the
// other never all begin together. A nil one holds nothing.
type sideBySide struct {
	t      *testing.T
	mu     sync.Mutex
	groups [][]string
	begun  map[int]chan struct{}
	count  map[int]int
}

func (s *sideBySide) arrive(read string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	group := slices.IndexFunc(s.groups, func(g []string) bool { return slices.Contains(g, read) })
	if group < 0 {
		s.mu.Unlock()
		return
	}
	if s.begun == nil {
		s.begun, s.count = map[int]chan struct{}{}, map[int]int{}
	}
	if s.begun[group] == nil {
		s.begun[group] = make(chan struct{})
	}
	all := s.begun[group]
	if s.count[group]++; s.count[group] == len(s.groups[group]) {
		close(all)
	}
	others := s.groups[group]
	s.mu.Unlock()
	select {
	case <-all:
	case <-time.After(2 * time.Second):
		s.t.Errorf("%s waited in vain for %v to begin beside it: they are read one after the other", read, others)
	}
}
