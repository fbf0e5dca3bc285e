package rbac

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/cluster-api/util/test/builder"

	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

func roleOf(t *testing.T, u Use) *rbacv1.Role {
	t.Helper()
	role, err := u.Role("capi-prod", "eu1")
	if err != nil {
		t.Fatal(err)
	}
	return role
}

// TestRolesDecode: every role decodes, keeps one rule per (apiGroup,
// resource, resourceNames) with sorted verbs as their headers ask, never
// pairs create with resource names (RBAC cannot confine a create to a name,
// so such a rule would grant nothing), and operate grants all that view
// grants (so one binding of each half is enough to run every verb).
func TestRolesDecode(t *testing.T) {
	for _, u := range Uses {
		for name, rules := range map[string][]rbacv1.PolicyRule{u.Name: u.ClusterRole().Rules, u.Name + "-eu1": roleOf(t, u).Rules} {
			seen := map[string]bool{}
			for _, r := range rules {
				if len(r.APIGroups) != 1 || len(r.Resources) != 1 {
					t.Errorf("%s: rule %v: want one apiGroup and one resource", name, r)
					continue
				}
				key := r.APIGroups[0] + "/" + r.Resources[0] + strings.Join(r.ResourceNames, ",")
				if seen[key] {
					t.Errorf("%s: two rules for %s", name, key)
				}
				seen[key] = true
				if !slices.IsSorted(r.Verbs) {
					t.Errorf("%s: %s verbs %v not sorted", name, key, r.Verbs)
				}
				if len(r.ResourceNames) > 0 && slices.Contains(r.Verbs, "create") {
					t.Errorf("%s: %s grants create by name, which RBAC never matches", name, key)
				}
			}
		}
	}
	view, operate := roleOf(t, View), roleOf(t, Operate)
	for _, pair := range [][2][]rbacv1.PolicyRule{{View.ClusterRole().Rules, Operate.ClusterRole().Rules}, {view.Rules, operate.Rules}} {
		for _, r := range pair[0] {
			for _, verb := range r.Verbs {
				names := r.ResourceNames
				if len(names) == 0 {
					names = []string{""}
				}
				for _, name := range names {
					if !grants(pair[1], r.APIGroups[0], r.Resources[0], verb, name) {
						t.Errorf("view grants %s %s/%s %s, operate does not", verb, r.APIGroups[0], r.Resources[0], name)
					}
				}
			}
		}
	}
}

// grants reads rules as RBAC does, for one group and resource as listed.
func grants(rules []rbacv1.PolicyRule, group, resource, verb, name string) bool {
	return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
		return r.APIGroups[0] == group && r.Resources[0] == resource && slices.Contains(r.Verbs, verb) &&
			(len(r.ResourceNames) == 0 || slices.Contains(r.ResourceNames, name))
	})
}

// TestRoleOfOneCluster: a cluster's Role is in its namespace and names the
// very Secrets and Lease the code reads; the view role reads no Secret, and
// neither role writes a Lease but the cluster's own.
func TestRoleOfOneCluster(t *testing.T) {
	view, operate := roleOf(t, View), roleOf(t, Operate)
	if view.Namespace != "capi-prod" || view.Name != View.RoleName("eu1") || operate.Name != Operate.RoleName("eu1") || view.Name != "cp-rollout-view-eu1" {
		t.Errorf("roles %s/%s and %s: want cp-rollout-{view,operate}-eu1 in capi-prod", view.Namespace, view.Name, operate.Name)
	}
	lease := runlock.LeaseName("eu1")
	kubeconfig, etcdCA := secret.Name("eu1", secret.Kubeconfig), secret.Name("eu1", secret.EtcdCA)
	for _, c := range []struct {
		rules                       []rbacv1.PolicyRule
		group, resource, verb, name string
		want                        bool
	}{
		{view.Rules, "", "secrets", "get", kubeconfig, false},
		{view.Rules, "", "secrets", "get", etcdCA, false},
		{view.Rules, "coordination.k8s.io", "leases", "get", lease, true},
		{view.Rules, "coordination.k8s.io", "leases", "update", lease, false},
		{operate.Rules, "", "secrets", "get", kubeconfig, true},
		{operate.Rules, "", "secrets", "get", etcdCA, true},
		{operate.Rules, "", "secrets", "get", "eu1-ca", false},
		{operate.Rules, "", "secrets", "list", "", false},
		{operate.Rules, "coordination.k8s.io", "leases", "update", lease, true},
		{operate.Rules, "coordination.k8s.io", "leases", "delete", lease, true},
		{operate.Rules, "coordination.k8s.io", "leases", "update", "capi-kubeadm-control-plane-controller-manager", false},
		{operate.Rules, "coordination.k8s.io", "leases", "create", "", true},
	} {
		if got := grants(c.rules, c.group, c.resource, c.verb, c.name); got != c.want {
			t.Errorf("%s %s/%s %q: granted %v, want %v", c.verb, c.group, c.resource, c.name, got, c.want)
		}
	}
	for _, u := range Uses {
		for _, r := range u.ClusterRole().Rules {
			if r.Resources[0] == "secrets" || slices.ContainsFunc(r.Verbs, func(v string) bool { return v != "get" && v != "list" }) {
				t.Errorf("ClusterRole %s grants %v on %s cluster-wide: writes and Secrets belong in a cluster's Role", u.Name, r.Verbs, r.Resources[0])
			}
		}
	}
}

// TestKCPControllerDeploymentByName: both ClusterRoles may get the KCP
// controller's Deployment where clusterctl installs it, the one object
// status and the rolling verbs read for its version, and no other
// Deployment, nor list them.
func TestKCPControllerDeploymentByName(t *testing.T) {
	for _, u := range Uses {
		rules := u.ClusterRole().Rules
		for _, c := range []struct {
			verb, name string
			want       bool
		}{
			{"get", controlplane.KCPControllerDeployment, true},
			{"get", "capi-controller-manager", false},
			{"list", "", false},
			{"watch", "", false},
		} {
			if got := grants(rules, "apps", "deployments", c.verb, c.name); got != c.want {
				t.Errorf("%s: %s deployments %q: granted %v, want %v", u.Name, c.verb, c.name, got, c.want)
			}
		}
	}
}

// TestRoleNamesAreChecked: a name that is not one the API server accepts
// cannot reach the YAML.
func TestRoleNamesAreChecked(t *testing.T) {
	for _, c := range [][2]string{{"default", "demo\nrules: []"}, {"Default", "demo"}, {"", "demo"}, {"default", ""}} {
		if _, err := View.RoleYAML(c[0], c[1]); err == nil {
			t.Errorf("namespace %q, cluster %q: accepted", c[0], c[1])
		}
	}
}

// TestConfineNames: the policy depends on the identity alone (a
// ServiceAccount and its user name are one identity), and two identities
// never share a policy, however alike their names read; the names are ones
// the API server takes.
func TestConfineNames(t *testing.T) {
	confine := func(s rbacv1.Subject) *Confinement {
		t.Helper()
		c, err := Confine(s)
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		return c
	}
	sa := confine(rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "ops", Name: "runbook"})
	if again := confine(rbacv1.Subject{Kind: rbacv1.UserKind, Name: "system:serviceaccount:ops:runbook"}); !bytes.Equal(again.PolicyYAML, sa.PolicyYAML) || !reflect.DeepEqual(again.Binding, sa.Binding) {
		t.Errorf("the ServiceAccount ops:runbook and the user system:serviceaccount:ops:runbook are one identity, with policies %s and %s", sa.Policy.Name, again.Policy.Name)
	}
	if !strings.HasPrefix(sa.Policy.Name, "cp-rollout-confine-sa-ops-runbook-") || sa.Binding.Name != sa.Policy.Name || sa.Binding.Spec.PolicyName != sa.Policy.Name {
		t.Errorf("policy %s, binding %s of %s: want cp-rollout-confine-sa-ops-runbook-<hash>, both", sa.Policy.Name, sa.Binding.Name, sa.Binding.Spec.PolicyName)
	}
	if got := sa.Binding.Spec.ValidationActions; len(got) != 1 || got[0] != admissionregistrationv1.Deny || sa.Binding.Spec.MatchResources != nil {
		t.Errorf("binding actions %v, resources %+v: want Deny, in every namespace", got, sa.Binding.Spec.MatchResources)
	}
	if fp := sa.Policy.Spec.FailurePolicy; fp == nil || *fp != admissionregistrationv1.Fail {
		t.Errorf("failure policy %v, want Fail", fp)
	}
	names := map[string]rbacv1.Subject{}
	for _, s := range []rbacv1.Subject{
		{Kind: rbacv1.UserKind, Name: "a-b"}, {Kind: rbacv1.UserKind, Name: "a.b"}, {Kind: rbacv1.UserKind, Name: "A-B"},
		{Kind: rbacv1.GroupKind, Name: "a-b"}, {Kind: rbacv1.UserKind, Name: "system:serviceaccount:a:b"},
		{Kind: rbacv1.UserKind, Name: "system:serviceaccount:a-b:c"}, {Kind: rbacv1.UserKind, Name: "system:serviceaccount:a:b-c"},
		{Kind: rbacv1.UserKind, Name: strings.Repeat("x", 300)}, {Kind: rbacv1.UserKind, Name: strings.Repeat("x", 301)},
		{Kind: rbacv1.GroupKind, Name: "oidc:Platform Team"}, {Kind: rbacv1.UserKind, Name: "-"},
	} {
		c := confine(s)
		if errs := validation.IsDNS1123Subdomain(c.Policy.Name); len(errs) > 0 {
			t.Errorf("%+v: policy name %q: %v", s, c.Policy.Name, errs)
		}
		if other, ok := names[c.Policy.Name]; ok {
			t.Errorf("%+v and %+v share the policy %s", s, other, c.Policy.Name)
		}
		names[c.Policy.Name] = s
	}
	for _, s := range []rbacv1.Subject{{Kind: rbacv1.UserKind}, {Kind: rbacv1.ServiceAccountKind, Name: "runbook"}, {Kind: "Robot", Name: "r2"}, {Kind: rbacv1.UserKind, Name: "\xff"}} {
		if _, err := Confine(s); err == nil {
			t.Errorf("%+v: confined, want an error", s)
		}
	}
}

// TestConfineSubjectStaysOneValue: whatever a subject's name holds (quotes
// of YAML and CEL, a newline, a comment, unicode), the printed policy decodes
// to one match condition comparing the request's identity with exactly that
// name, and nothing else of the policy changes.
func TestConfineSubjectStaysOneValue(t *testing.T) {
	plain, err := Confine(rbacv1.Subject{Kind: rbacv1.UserKind, Name: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{`o'brien`, `x" || true || "`, "x' || true || '", "a\nrules: []", `\'`, "# comment", "${POLICY}", "Zoë ✓"} {
		for _, kind := range []string{rbacv1.UserKind, rbacv1.GroupKind} {
			c, err := Confine(rbacv1.Subject{Kind: kind, Name: name})
			if err != nil {
				t.Errorf("%s %q: %v", kind, name, err)
				continue
			}
			expr := c.Policy.Spec.MatchConditions[0].Expression
			if strings.Count(expr, "'") != 2 || strings.ContainsAny(expr, "\"\n") {
				t.Errorf("%s %q: match condition %q: want one single-quoted literal, special characters escaped", kind, name, expr)
			}
			if lit := expr[strings.Index(expr, "'")+1 : strings.LastIndex(expr, "'")]; unescapeCEL(t, lit) != name {
				t.Errorf("%s %q: the literal %q reads %q", kind, name, lit, unescapeCEL(t, lit))
			}
			got, want := c.Policy.DeepCopy(), plain.Policy.DeepCopy()
			got.Name, got.Spec.MatchConditions, want.Name, want.Spec.MatchConditions = "", nil, "", nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s %q changed the policy beyond its name and match condition", kind, name)
			}
		}
	}
}

// unescapeCEL reads the \UXXXXXXXX escapes celString writes.
func unescapeCEL(t *testing.T, lit string) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(lit); i++ {
		if lit[i] != '\\' {
			b.WriteByte(lit[i])
			continue
		}
		if i+10 > len(lit) || lit[i+1] != 'U' {
			t.Fatalf("%q: an escape other than \\U", lit)
		}
		r, err := strconv.ParseUint(lit[i+2:i+10], 16, 32)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteRune(rune(r))
		i += 9
	}
	return b.String()
}

// TestBindingNames: one binding per (use, namespace, cluster, subject), so
// that binding a second subject adds to the first, and names that read
// alike (a dash moved between namespace and cluster, or between the parts
// of a ServiceAccount) still differ.
func TestBindingNames(t *testing.T) {
	sa := func(ns, name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}
	}
	user := func(name string) rbacv1.Subject { return rbacv1.Subject{Kind: rbacv1.UserKind, Name: name} }
	type key struct {
		use                Use
		namespace, name    string
		subject            rbacv1.Subject
		clusterWide        bool
		wantReadablePrefix string
	}
	seen := map[string]key{}
	for _, k := range []key{
		{use: Operate, namespace: "a-b", name: "c", subject: user("ann"), clusterWide: true, wantReadablePrefix: "cp-rollout-operate-a-b-c-user-ann-"},
		{use: Operate, namespace: "a", name: "b-c", subject: user("ann"), clusterWide: true},
		{use: Operate, namespace: "a", name: "b-c", subject: user("ann"), wantReadablePrefix: "cp-rollout-operate-b-c-user-ann-"},
		{use: Operate, namespace: "a", name: "b-c", subject: user("bob")},
		{use: Operate, namespace: "a", name: "b-c", subject: rbacv1.Subject{Kind: rbacv1.GroupKind, Name: "ann"}},
		{use: View, namespace: "a", name: "b-c", subject: user("ann")},
		{use: Operate, namespace: "a", name: "b", subject: user("c-ann")},
		{use: Operate, namespace: "a", name: "b-c", subject: sa("ops-x", "runbook"), wantReadablePrefix: "cp-rollout-operate-b-c-sa-ops-x-runbook-"},
		{use: Operate, namespace: "a", name: "b-c", subject: sa("ops", "x-runbook")},
		{use: Operate, namespace: "a", name: "b-c", subject: user("system:serviceaccount:ops:x-runbook")},
	} {
		name := k.use.BindingName(k.namespace, k.name, k.subject, k.clusterWide)
		if k.wantReadablePrefix != "" && !strings.HasPrefix(name, k.wantReadablePrefix) {
			t.Errorf("%+v: %s, want it to read %s<hash>", k, name, k.wantReadablePrefix)
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("%+v: %q: %v", k, name, errs)
		}
		if other, ok := seen[name]; ok {
			t.Errorf("%+v and %+v share the binding name %s", k, other, name)
		}
		seen[name] = k
		if again := k.use.BindingName(k.namespace, k.name, k.subject, k.clusterWide); again != name {
			t.Errorf("%+v: named %s, then %s", k, name, again)
		}
	}
}

// TestConfinementOnTheAPIServer: on a real API server, with the Roles of
// clusters a and b in one namespace and an identity bound to a's alone,
// the policy Confine prints refuses each write of that identity to b's
// objects (made as the tool makes its own: create, server-side apply, merge
// patch, delete; a Lease by name; a relabel either way; a status write), to
// objects of no cluster, and to Leases that are not a cluster's lock, while
// the same writes to a pass. A group's policy confines its members; a user's
// policy matches that exact name and no other; identities without a policy
// (the administrator, a user bound the old way) are left alone; Events are
// not confined. All writes are server-side dry runs, which admission sees.
func TestConfinementOnTheAPIServer(t *testing.T) {
	t.Parallel()
	cfg := apiservertest.StartCAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	scheme := controlplane.Scheme()
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	const ns = "capi-prod"
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	for _, cluster := range []string{"a", "b"} {
		role, err := Operate.Role(ns, cluster)
		must(err)
		must(admin.Create(ctx, role))
		for _, obj := range clusterObjects(ns, cluster, "") {
			must(admin.Create(ctx, obj))
		}
	}
	// An InfraMachineTemplate carries no cluster label: the tool only reads
	// it.
	must(admin.Create(ctx, infraObject(ns, builder.GenericInfrastructureMachineTemplateKind, "template", nil)))

	// Users bound to cluster a's Role: alice, the group sre, o'brien "the
	// second" (a name to quote) confined; bob and o'brien bound the way
	// `rbac` did before there was a policy.
	const weird = `o'brien "the second"`
	subjects := []rbacv1.Subject{
		{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"},
		{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "sre"},
		{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: weird},
		{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"},
		{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "o'brien"},
	}
	must(admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "operate-a"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: Operate.RoleName("a")},
		Subjects:   subjects,
	}))
	var policies []string
	for _, s := range subjects[:3] {
		c, err := Confine(s)
		must(err)
		must(admin.Create(ctx, c.Policy))
		must(admin.Create(ctx, c.Binding))
		policies = append(policies, c.Policy.Name)
	}

	as := func(user string, groups ...string) client.Client {
		impersonated := rest.CopyConfig(cfg)
		impersonated.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
		c, err := client.New(impersonated, client.Options{Scheme: scheme})
		must(err)
		return c
	}
	alice, carol, weirdUser, bob, obrien := as("alice"), as("carol", "sre", "system:authenticated"), as(weird), as("bob"), as("o'brien")

	// A write of each shape the tool makes, to cluster's objects.
	type write struct {
		what string
		do   func(c client.Client, cluster string) error
	}
	machine := func(cluster string) *clusterv1.Machine {
		return clusterObjects(ns, cluster, "new")[2].(*clusterv1.Machine)
	}
	writes := []write{
		{"create Machine", func(c client.Client, cluster string) error { return c.Create(ctx, machine(cluster), client.DryRunAll) }},
		{"apply new Machine", func(c client.Client, cluster string) error {
			content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(machine(cluster))
			must(err)
			u := &unstructured.Unstructured{Object: content}
			u.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("Machine"))
			unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
			unstructured.RemoveNestedField(u.Object, "status")
			return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("capi-kubeadmcontrolplane"), client.ForceOwnership, client.DryRunAll)
		}},
		{"patch KCP spec.version", func(c client.Client, cluster string) error {
			kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster + "-control-plane"}}
			return c.Patch(ctx, kcp, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"version":"v1.36.3"}}`)), client.DryRunAll)
		}},
		{"patch Cluster", func(c client.Client, cluster string) error {
			obj := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster}}
			return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"x":"y"}}}`)), client.DryRunAll)
		}},
		{"delete Machine", func(c client.Client, cluster string) error {
			return c.Delete(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster + "-cp-1"}}, client.DryRunAll)
		}},
		{"create KubeadmConfig", func(c client.Client, cluster string) error {
			return c.Create(ctx, clusterObjects(ns, cluster, "new")[3], client.DryRunAll)
		}},
		{"delete InfraMachine", func(c client.Client, cluster string) error {
			return c.Delete(ctx, infraObject(ns, builder.GenericInfrastructureMachineKind, cluster+"-cp-1", nil), client.DryRunAll)
		}},
		{"patch InfraMachine status", func(c client.Client, cluster string) error {
			obj := infraObject(ns, builder.GenericInfrastructureMachineKind, cluster+"-cp-1", nil)
			return c.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"status":{"x":"y"}}`)), client.DryRunAll)
		}},
		{"create Lease cp-rollout-<cluster>", func(c client.Client, cluster string) error {
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: runlock.LeaseName(cluster)}}
			return c.Create(ctx, lease, client.DryRunAll)
		}},
		{"relabel KCP to the other cluster", func(c client.Client, cluster string) error {
			other := map[string]string{"a": "b", "b": "a"}[cluster]
			kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster + "-control-plane"}}
			return c.Patch(ctx, kcp, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"`+clusterv1.ClusterNameLabel+`":"`+other+`"}}}`)), client.DryRunAll)
		}},
	}

	// The policy is in force within a second or so of its creation.
	deadline := time.Now().Add(time.Minute)
	for _, c := range []client.Client{alice, carol, weirdUser} {
		for err := writes[0].do(c, "b"); !apierrors.IsForbidden(err); err = writes[0].do(c, "b") {
			if time.Now().After(deadline) {
				t.Fatalf("the policies are not in force after a minute: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// denied says whether err is the refusal of one of the policies, naming
	// it as the API server does, with the reason the policy gives.
	denied := func(err error, says string) bool {
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), says) {
			return false
		}
		return slices.ContainsFunc(policies, func(p string) bool { return strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+p+"'") })
	}
	for _, id := range []struct {
		name     string
		c        client.Client
		confined bool
	}{{"alice", alice, true}, {"carol (group sre)", carol, true}, {weird, weirdUser, true}, {"bob (no policy)", bob, false}, {"o'brien (no policy)", obrien, false}, {"admin", admin, false}} {
		for _, w := range writes {
			relabel := strings.HasPrefix(w.what, "relabel")
			errA, errB := w.do(id.c, "a"), w.do(id.c, "b")
			t.Logf("%-22s %-36s a: %-8s b: %s", id.name, w.what, outcome(errA), outcome(errB))
			switch {
			case !id.confined && (errA != nil || errB != nil):
				t.Errorf("%s, with no policy: %s: a %v, b %v; want both allowed", id.name, w.what, errA, errB)
			case id.confined && relabel && (!denied(errA, "would be of cluster b") || !denied(errB, "is of cluster b and would be of cluster a")):
				t.Errorf("%s: %s: a %v, b %v; want both refused by the policy, naming both clusters", id.name, w.what, errA, errB)
			case id.confined && !relabel && (errA != nil || !denied(errB, "is of cluster b")):
				t.Errorf("%s: %s: a %v, b %v; want a allowed, b refused by the policy", id.name, w.what, errA, errB)
			}
		}
	}

	// Nothing of no cluster, and no Lease but a cluster's lock.
	for _, c := range []struct {
		what string
		err  error
		says string
	}{
		{"create Lease other", alice.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other"}}, client.DryRunAll), "other is no such lock"},
		{"patch an InfraMachineTemplate", alice.Patch(ctx, infraObject(ns, builder.GenericInfrastructureMachineTemplateKind, "template", nil),
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"x":"y"}}}`)), client.DryRunAll), "template is of no cluster"},
		{"create an InfraMachine without the label", alice.Create(ctx, infraObject(ns, builder.GenericInfrastructureMachineKind, "bare", nil), client.DryRunAll), "bare is of no cluster"},
		{"create a Machine labelled a of spec.clusterName b", alice.Create(ctx, func() client.Object {
			m := machine("b")
			m.Labels[clusterv1.ClusterNameLabel] = "a"
			return m
		}(), client.DryRunAll), "is of no cluster"},
	} {
		t.Logf("%-22s %-36s %s", "alice", c.what, outcome(c.err))
		if !denied(c.err, c.says) {
			t.Errorf("alice: %s: %v; want refused by the policy, saying %q", c.what, c.err, c.says)
		}
	}

	t.Logf("as the API server words a refusal: %v", writes[0].do(alice, "b"))

	// Events change nothing and are not confined (the policy's header).
	event := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: ns, Name: "b-control-plane.1"},
		EventTime:           metav1.NewMicroTime(time.Now()),
		ReportingController: "cp-rollout", ReportingInstance: "alice", Action: "Upgrade", Reason: "Step", Type: corev1.EventTypeNormal,
		Regarding: corev1.ObjectReference{APIVersion: controlplanev1.GroupVersion.String(), Kind: "KubeadmControlPlane", Namespace: ns, Name: "b-control-plane"},
	}
	if err := alice.Create(ctx, event, client.DryRunAll); err != nil {
		t.Errorf("alice: an Event on b's KubeadmControlPlane: %v; want it allowed, as documented", err)
	}
}

func outcome(err error) string {
	switch {
	case err == nil:
		return "allowed"
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
		return "DENIED by policy"
	default:
		return "error: " + err.Error()
	}
}

// clusterObjects are a cluster's Cluster, KubeadmControlPlane, Machine,
// KubeadmConfig and InfraMachine as Cluster API labels them; prefix, when
// given, names the objects of a replacement instead (without Cluster and
// KubeadmControlPlane, which are the existing ones).
func clusterObjects(ns, cluster, prefix string) []client.Object {
	name := cluster + "-cp-1"
	if prefix != "" {
		name = prefix + "-" + cluster
	}
	labels := func() map[string]string { return map[string]string{clusterv1.ClusterNameLabel: cluster} }
	infraRef := clusterv1.ContractVersionedObjectReference{APIGroup: builder.InfrastructureGroupVersion.Group, Kind: builder.GenericInfrastructureMachineKind, Name: name}
	return []client.Object{
		&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster}, Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}},
		&controlplanev1.KubeadmControlPlane{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster + "-control-plane", Labels: labels()},
			Spec: controlplanev1.KubeadmControlPlaneSpec{Version: "v1.35.2", MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{
				Spec: controlplanev1.KubeadmControlPlaneMachineTemplateSpec{InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: builder.InfrastructureGroupVersion.Group, Kind: builder.GenericInfrastructureMachineTemplateKind, Name: "template"}},
			}},
		},
		&clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels()},
			Spec: clusterv1.MachineSpec{ClusterName: cluster, Version: "v1.35.2", InfrastructureRef: infraRef,
				Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(name)}},
		},
		&bootstrapv1.KubeadmConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels()}},
		infraObject(ns, builder.GenericInfrastructureMachineKind, name, labels()),
	}
}

func infraObject(ns, kind, name string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(builder.InfrastructureGroupVersion.WithKind(kind))
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(labels)
	return u
}

// TestExampleIsWhatRBACPrints: examples/one-cluster.yaml confines its
// operator with the very policy Confine makes (comments included), and its
// bindings carry the names `rbac` gives them, so applying `rbac`'s output
// beside the example adds nothing and the example cannot drift from it.
func TestExampleIsWhatRBACPrints(t *testing.T) {
	raw, err := os.ReadFile("examples/one-cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	operator := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "cp-rollout", Name: "cp-rollout-operator"}
	viewer := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "cp-rollout", Name: "cp-rollout-viewer"}
	confine, err := Confine(operator)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, confine.PolicyYAML) {
		t.Errorf("the example does not hold the operator's policy as Confine prints it (regenerate it with `kubectl cp-rollout rbac demo -n default --role operate --serviceaccount cp-rollout:cp-rollout-operator`)")
	}
	found := map[string]bool{}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "ValidatingAdmissionPolicyBinding":
			got := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			if err := yaml.UnmarshalStrict(doc, got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, confine.Binding) {
				t.Errorf("the example's policy binding %+v, Confine's %+v", got, confine.Binding)
			}
			found[meta.Kind] = true
		case "RoleBinding", "ClusterRoleBinding":
			got := &rbacv1.ClusterRoleBinding{} // a RoleBinding's fields, but for the namespace
			if err := yaml.Unmarshal(doc, got); err != nil {
				t.Fatal(err)
			}
			use, subject := Operate, operator
			if got.RoleRef.Name == View.Name || got.RoleRef.Name == View.RoleName("demo") {
				use, subject = View, viewer
			}
			want := use.BindingName("default", "demo", subject, meta.Kind == "ClusterRoleBinding")
			if got.Name != want || len(got.Subjects) != 1 || got.Subjects[0] != subject {
				t.Errorf("%s %s of %s for %v: want it named %s, for %s %s/%s alone", meta.Kind, got.Name, got.RoleRef.Name, got.Subjects, want, subject.Kind, subject.Namespace, subject.Name)
			}
			found[meta.Kind+" "+use.Name] = true
		}
	}
	if len(found) != 5 {
		t.Errorf("the example holds %v: want the policy binding, and a RoleBinding and a ClusterRoleBinding of each use", found)
	}
}

// The fleet runs' Role is filled in for its namespace, grants ConfigMaps
// alone, and refuses a namespace that would change the YAML around it. That
// it is what a fleet run uses, and all it uses, TestLeastPrivilege shows
// from the audit log.
func TestFleetRole(t *testing.T) {
	role, err := FleetRole("cp-rollout-runs")
	if err != nil {
		t.Fatal(err)
	}
	if role.Name != FleetRoleName || role.Namespace != "cp-rollout-runs" || len(role.Rules) != 1 {
		t.Fatalf("Role %s/%s with %d rules, want %s/cp-rollout-runs with one", role.Namespace, role.Name, len(role.Rules), FleetRoleName)
	}
	r := role.Rules[0]
	if fmt.Sprint(r.APIGroups, r.Resources, r.Verbs) != "[] [configmaps] [create get list patch]" {
		t.Errorf("rule %v %v %v, want ConfigMaps: create get list patch", r.APIGroups, r.Resources, r.Verbs)
	}
	if _, err := FleetRole("a\nrules: [{}]"); err == nil {
		t.Error("a namespace with a newline was accepted")
	}
}
