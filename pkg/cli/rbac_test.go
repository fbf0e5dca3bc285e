package cli

import (
	"bufio"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

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
	if clusterBinding.RoleRef.Name != "cp-rollout-view" || clusterBinding.Name != "cp-rollout-view-capi-prod-eu1" {
		t.Errorf("ClusterRoleBinding %+v: want cp-rollout-view-capi-prod-eu1 of ClusterRole cp-rollout-view", clusterBinding)
	}

	if r := run(t, "rbac", "EU1"); r.code != exitcode.Usage {
		t.Errorf("rbac EU1: exit %d, want %d: not a name the API server takes", r.code, exitcode.Usage)
	}
}
