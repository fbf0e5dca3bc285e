package cli

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

func TestRBACOptions(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		cluster     string
		role        string
		subjects    int
		code        int
		errContains string
	}{
		{args: nil},
		{args: []string{"demo", "--role", "operate"}, cluster: "demo", role: "operate"},
		{args: []string{"demo", "--role", "view", "--group", "sre", "--user", "ann", "--serviceaccount", "ops:runbook"}, cluster: "demo", role: "view", subjects: 3},
		{args: []string{"--role", "admin"}, code: exitcode.Usage, errContains: "--role must be one of view, operate"},
		{args: []string{"demo", "--group", "sre"}, code: exitcode.Usage, errContains: "give CLUSTER and --role"},
		{args: []string{"--role", "view", "--group", "sre"}, code: exitcode.Usage, errContains: "give CLUSTER and --role"},
		{args: []string{"demo", "--role", "view", "--serviceaccount", "runbook"}, code: exitcode.Usage, errContains: "NAMESPACE:NAME"},
		{args: []string{"demo", "other"}, code: exitcode.Usage},
	} {
		isolate(t)
		o, r := parse(t, NewCmdRBAC, append([]string{"rbac"}, tc.args...)...)
		if r.code != tc.code || tc.errContains != "" && !strings.Contains(r.err.Error(), tc.errContains) {
			t.Errorf("%v: exit %d (%v), want %d saying %q", tc.args, r.code, r.err, tc.code, tc.errContains)
			continue
		}
		if tc.code != 0 {
			continue
		}
		if o == nil || o.Cluster != tc.cluster || o.Role != tc.role || len(o.Users)+len(o.Groups)+len(o.ServiceAccounts) != tc.subjects {
			t.Errorf("%v: resolved to %+v", tc.args, o)
		}
	}
}

// decodeAll reads a YAML stream as `kubectl apply -f -` would: one object per
// document, each named by its kind.
func decodeAll(t *testing.T, out string) map[string][][]byte {
	t.Helper()
	docs := map[string][][]byte{}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	for {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &meta); err != nil || meta.Kind == "" {
			t.Fatalf("document without a kind (%v):\n%s", err, raw)
		}
		docs[meta.Kind] = append(docs[meta.Kind], raw)
	}
}

// TestRBACPrintsWhatThePreflightChecks: the roles printed for a cluster are,
// decoded, the very roles the preflight expands for it, in the namespace -n
// names; bindings are printed only when subjects are given, for the one use
// asked, and refer to the roles printed.
func TestRBACPrintsWhatThePreflightChecks(t *testing.T) {
	isolate(t)
	r := run(t, "rbac")
	if docs := decodeAll(t, r.out); r.code != 0 || len(docs["ClusterRole"]) != 2 || len(docs) != 1 {
		t.Fatalf("rbac: exit %d, kinds %v, want the two ClusterRoles alone", r.code, docs)
	}
	if !strings.Contains(r.out, "# get: the CustomResourceDefinition") {
		t.Errorf("the ClusterRoles are printed without their comments:\n%s", r.out)
	}
	// Two runs' outputs, one after the other, are still one object per
	// document: each opens with its separator.
	if docs := decodeAll(t, r.out+r.out); len(docs["ClusterRole"]) != 4 {
		t.Errorf("two outputs concatenated: %d ClusterRoles, want 4", len(docs["ClusterRole"]))
	}

	r = run(t, "rbac", "eu1", "-n", "capi-prod")
	docs := decodeAll(t, r.out)
	if r.code != 0 || len(docs["ClusterRole"]) != 2 || len(docs["Role"]) != 2 || len(docs) != 2 {
		t.Fatalf("rbac eu1: exit %d (%v), kinds %v", r.code, r.err, docs)
	}
	for i, u := range rbac.Uses {
		want, err := u.Role("capi-prod", "eu1")
		if err != nil {
			t.Fatal(err)
		}
		got := &rbacv1.Role{}
		if err := yaml.UnmarshalStrict(docs["Role"][i], got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("printed Role %s differs from the one the preflight checks:\n%+v\n%+v", u.Name, got, want)
		}
	}

	r = run(t, "rbac", "eu1", "-n", "capi-prod", "--role", "view", "--group", "sre-oncall")
	docs = decodeAll(t, r.out)
	if r.code != 0 || len(docs["ClusterRole"]) != 1 || len(docs["Role"]) != 1 || len(docs["RoleBinding"]) != 1 || len(docs["ClusterRoleBinding"]) != 1 {
		t.Fatalf("rbac eu1 --role view --group: exit %d (%v), kinds %v", r.code, r.err, docs)
	}
	binding := &rbacv1.RoleBinding{}
	if err := yaml.UnmarshalStrict(docs["RoleBinding"][0], binding); err != nil {
		t.Fatal(err)
	}
	if binding.Namespace != "capi-prod" || binding.RoleRef.Name != "cp-rollout-view-eu1" || binding.RoleRef.Kind != "Role" ||
		len(binding.Subjects) != 1 || binding.Subjects[0].Kind != rbacv1.GroupKind || binding.Subjects[0].Name != "sre-oncall" {
		t.Errorf("RoleBinding %+v: want cp-rollout-view-eu1 in capi-prod bound to group sre-oncall", binding)
	}
	clusterBinding := &rbacv1.ClusterRoleBinding{}
	if err := yaml.UnmarshalStrict(docs["ClusterRoleBinding"][0], clusterBinding); err != nil {
		t.Fatal(err)
	}
	group := rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "sre-oncall"}
	if want := rbac.View.BindingName("capi-prod", "eu1", group, true); clusterBinding.RoleRef.Name != "cp-rollout-view" || clusterBinding.Name != want ||
		!strings.HasPrefix(want, "cp-rollout-view-capi-prod-eu1-group-sre-oncall-") {
		t.Errorf("ClusterRoleBinding %+v: want %s of ClusterRole cp-rollout-view", clusterBinding, want)
	}
	if len(docs["ValidatingAdmissionPolicy"]) != 0 {
		t.Errorf("rbac --role view printed a policy: the view roles write nothing to confine")
	}

	if r := run(t, "rbac", "EU1"); r.code != exitcode.Usage {
		t.Errorf("rbac EU1: exit %d, want %d: not a name the API server takes", r.code, exitcode.Usage)
	}
}

// kinds are the kinds of a YAML stream's documents, in order.
func kinds(t *testing.T, out string) []string {
	t.Helper()
	var kinds []string
	reader := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	for {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return kinds
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &meta); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, meta.Kind)
	}
}

// TestRBACBindsEachSubjectApart: each subject gets bindings of its own,
// named after the use, the cluster and the subject, so that applying the
// bindings of a second subject (or of the same subject for a second cluster)
// adds to the first instead of replacing its subjects, and names that used
// to collide (namespace a-b and cluster c, namespace a and cluster b-c) no
// longer do.
func TestRBACBindsEachSubjectApart(t *testing.T) {
	isolate(t)
	bindingsOf := func(args ...string) (map[string]*rbacv1.RoleBinding, map[string]*rbacv1.ClusterRoleBinding) {
		t.Helper()
		r := run(t, append([]string{"rbac"}, args...)...)
		if r.code != 0 {
			t.Fatalf("rbac %v: exit %d (%v)", args, r.code, r.err)
		}
		docs := decodeAll(t, r.out)
		roleBindings, clusterBindings := map[string]*rbacv1.RoleBinding{}, map[string]*rbacv1.ClusterRoleBinding{}
		for _, raw := range docs["RoleBinding"] {
			b := &rbacv1.RoleBinding{}
			if err := yaml.UnmarshalStrict(raw, b); err != nil {
				t.Fatal(err)
			}
			roleBindings[b.Namespace+"/"+b.Name] = b
		}
		for _, raw := range docs["ClusterRoleBinding"] {
			b := &rbacv1.ClusterRoleBinding{}
			if err := yaml.UnmarshalStrict(raw, b); err != nil {
				t.Fatal(err)
			}
			clusterBindings[b.Name] = b
		}
		return roleBindings, clusterBindings
	}

	all, allCluster := bindingsOf("eu1", "-n", "capi-prod", "--role", "operate", "--user", "ann", "--group", "sre", "--serviceaccount", "ops:runbook")
	if len(all) != 3 || len(allCluster) != 3 {
		t.Fatalf("three subjects: %d RoleBindings and %d ClusterRoleBindings, want 3 of each", len(all), len(allCluster))
	}
	for name, b := range all {
		if len(b.Subjects) != 1 || b.RoleRef.Name != "cp-rollout-operate-eu1" {
			t.Errorf("RoleBinding %s: subjects %v of %s, want one of cp-rollout-operate-eu1", name, b.Subjects, b.RoleRef.Name)
		}
	}
	for name, b := range allCluster {
		if len(b.Subjects) != 1 || b.RoleRef.Name != "cp-rollout-operate" {
			t.Errorf("ClusterRoleBinding %s: subjects %v of %s, want one of cp-rollout-operate", name, b.Subjects, b.RoleRef.Name)
		}
	}
	// ann's own run prints a binding that the run for all three has too,
	// unchanged: applying one after the other leaves all three bound.
	ann, annCluster := bindingsOf("eu1", "-n", "capi-prod", "--role", "operate", "--user", "ann")
	for name, b := range ann {
		if !reflect.DeepEqual(all[name], b) {
			t.Errorf("RoleBinding %s of ann alone differs from the one printed with the other subjects:\n%+v\n%+v", name, b, all[name])
		}
	}
	for name, b := range annCluster {
		if !reflect.DeepEqual(allCluster[name], b) {
			t.Errorf("ClusterRoleBinding %s of ann alone differs from the one printed with the other subjects", name)
		}
	}

	// Neither a cluster whose name reads like another's namespace, nor
	// another cluster, nor the other use, shares a name with these.
	for _, args := range [][]string{
		{"c", "-n", "a-b", "--role", "operate", "--user", "ann"},
		{"b-c", "-n", "a", "--role", "operate", "--user", "ann"},
		{"eu2", "-n", "capi-prod", "--role", "operate", "--user", "ann"},
		{"eu1", "-n", "capi-prod", "--role", "view", "--user", "ann"},
	} {
		other, otherCluster := bindingsOf(args...)
		for name := range other {
			if _, ok := all[name]; ok {
				t.Errorf("rbac %v: RoleBinding %s is also eu1's", args, name)
			}
		}
		for name := range otherCluster {
			if _, ok := allCluster[name]; ok {
				t.Errorf("rbac %v: ClusterRoleBinding %s is also eu1's", args, name)
			}
		}
		allCluster = maps.Clone(allCluster)
		maps.Copy(allCluster, otherCluster)
	}
	if len(allCluster) != 3+4 {
		t.Errorf("%d ClusterRoleBindings in all, want 7: two of these runs shared a name", len(allCluster))
	}
}

// TestRBACPrintsTheConfinement: with --role operate, each subject's policy
// and its binding are printed, as deploy/rbac makes them, before any binding
// grants a role, so kubectl apply puts them in force first; the same for
// every cluster of the subject; none for the view role or without a subject.
func TestRBACPrintsTheConfinement(t *testing.T) {
	isolate(t)
	r := run(t, "rbac", "eu1", "-n", "capi-prod", "--role", "operate", "--group", "sre", "--serviceaccount", "ops:runbook")
	if r.code != 0 {
		t.Fatalf("exit %d (%v)", r.code, r.err)
	}
	order := kinds(t, r.out)
	firstBinding := slices.IndexFunc(order, func(k string) bool { return k == "RoleBinding" || k == "ClusterRoleBinding" })
	if firstBinding < 0 || slices.Contains(order[firstBinding:], "ValidatingAdmissionPolicy") || slices.Contains(order[firstBinding:], "ValidatingAdmissionPolicyBinding") {
		t.Errorf("documents %v: want every policy and policy binding before the first role binding", order)
	}
	docs := decodeAll(t, r.out)
	if len(docs["ValidatingAdmissionPolicy"]) != 2 || len(docs["ValidatingAdmissionPolicyBinding"]) != 2 {
		t.Fatalf("two subjects: %d policies, %d policy bindings; want 2 of each", len(docs["ValidatingAdmissionPolicy"]), len(docs["ValidatingAdmissionPolicyBinding"]))
	}
	for i, s := range []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "sre"}, {Kind: rbacv1.ServiceAccountKind, Namespace: "ops", Name: "runbook"}} {
		want, err := rbac.Confine(s)
		if err != nil {
			t.Fatal(err)
		}
		policy := &admissionregistrationv1.ValidatingAdmissionPolicy{}
		binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
		if err := yaml.UnmarshalStrict(docs["ValidatingAdmissionPolicy"][i], policy); err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(docs["ValidatingAdmissionPolicyBinding"][i], binding); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(policy, want.Policy) || !reflect.DeepEqual(binding, want.Binding) {
			t.Errorf("%s %s: printed\n%+v\n%+v\nwant\n%+v\n%+v", s.Kind, s.Name, policy, binding, want.Policy, want.Binding)
		}
		if !strings.Contains(r.out, string(want.PolicyYAML)) {
			t.Errorf("%s %s: the policy is printed without its comments", s.Kind, s.Name)
		}
	}
	// The policy of the group is the same for another cluster, in another
	// namespace: applying it again changes nothing.
	other := run(t, "rbac", "us1", "-n", "capi-staging", "--role", "operate", "--group", "sre")
	if otherDocs := decodeAll(t, other.out); other.code != 0 || len(otherDocs["ValidatingAdmissionPolicy"]) != 1 ||
		!bytes.Equal(otherDocs["ValidatingAdmissionPolicy"][0], docs["ValidatingAdmissionPolicy"][0]) ||
		!bytes.Equal(otherDocs["ValidatingAdmissionPolicyBinding"][0], docs["ValidatingAdmissionPolicyBinding"][0]) {
		t.Errorf("rbac us1 --group sre: exit %d, a policy other than eu1's for the same group", other.code)
	}
	for _, args := range [][]string{{"eu1", "--role", "operate"}, {"eu1"}, {"eu1", "--role", "view", "--group", "sre"}} {
		if r := run(t, append([]string{"rbac"}, args...)...); r.code != 0 || slices.Contains(kinds(t, r.out), "ValidatingAdmissionPolicy") {
			t.Errorf("rbac %v: exit %d, printed a policy: want none, there is no subject or nothing to confine", args, r.code)
		}
	}
	if r := run(t, "rbac", "eu1", "--role", "operate", "--user", "\xff"); r.code != exitcode.Usage {
		t.Errorf("rbac --user '\\xff': exit %d, want %d: no API server authenticates a name that is not UTF-8", r.code, exitcode.Usage)
	}
}
