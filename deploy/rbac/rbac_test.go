package rbac

import (
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// TestRolesDecode: both roles decode, keep one rule per (apiGroup, resource)
// with sorted verbs as their headers ask, and operate grants all that view
// grants (so one binding is enough to run every verb).
func TestRolesDecode(t *testing.T) {
	view, operate := View(), Operate()
	for _, role := range []*rbacv1.ClusterRole{view, operate} {
		seen := map[string]bool{}
		for _, r := range role.Rules {
			if len(r.APIGroups) != 1 || len(r.Resources) != 1 {
				t.Errorf("%s: rule %v: want one apiGroup and one resource", role.Name, r)
				continue
			}
			key := r.APIGroups[0] + "/" + r.Resources[0]
			if seen[key] {
				t.Errorf("%s: two rules for %s", role.Name, key)
			}
			seen[key] = true
			if !slices.IsSorted(r.Verbs) {
				t.Errorf("%s: %s verbs %v not sorted", role.Name, key, r.Verbs)
			}
		}
	}
	grants := func(role *rbacv1.ClusterRole, group, resource, verb string) bool {
		for _, r := range role.Rules {
			if r.APIGroups[0] == group && r.Resources[0] == resource && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	for _, r := range view.Rules {
		for _, verb := range r.Verbs {
			if !grants(operate, r.APIGroups[0], r.Resources[0], verb) {
				t.Errorf("cp-rollout-view grants %s %s/%s, cp-rollout-operate does not", verb, r.APIGroups[0], r.Resources[0])
			}
		}
	}
}
