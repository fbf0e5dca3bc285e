package rbac

import (
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"

	"sigs.k8s.io/cluster-api/util/secret"

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
