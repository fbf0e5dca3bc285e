package access

import (
	"errors"
	"slices"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
)

func strs(perms []Permission) []string {
	out := make([]string, len(perms))
	for i, p := range perms {
		out[i] = p.String()
	}
	return out
}

// TestNeedsNarrowsTheRolesToOneCluster: the roles' permissions are asked
// where the tool uses them, so a Role confined to the cluster's namespace, or
// to its two Secrets and its Lease by name, passes the preflight.
func TestNeedsNarrowsTheRolesToOneCluster(t *testing.T) {
	scope := Scope{Namespace: "capi-prod", Cluster: "eu1",
		InfraMachines: "awsmachines", InfraMachineTemplates: "awsmachinetemplates"}
	got := strs(Needs(rbac.Operate(), scope))
	for _, want := range []string{
		"get clusters.cluster.x-k8s.io in namespace capi-prod",
		"watch machines.cluster.x-k8s.io in namespace capi-prod",
		"patch kubeadmcontrolplanes.controlplane.cluster.x-k8s.io in namespace capi-prod",
		"create awsmachines.infrastructure.cluster.x-k8s.io in namespace capi-prod",
		"delete awsmachines.infrastructure.cluster.x-k8s.io in namespace capi-prod",
		"get awsmachinetemplates.infrastructure.cluster.x-k8s.io in namespace capi-prod",
		"get customresourcedefinitions.apiextensions.k8s.io (cluster-scoped)",
		"create leases.coordination.k8s.io in namespace capi-prod",
		"update leases.coordination.k8s.io cp-rollout-eu1 in namespace capi-prod",
		"get secrets eu1-kubeconfig in namespace capi-prod",
		"get secrets eu1-etcd in namespace capi-prod",
		"list deployments.apps in all namespaces",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("operate needs no %q; it needs:\n%s", want, strings.Join(got, "\n"))
		}
	}
	for _, p := range got {
		if strings.Contains(p, "*") || strings.Contains(p, "create awsmachinetemplates") {
			t.Errorf("operate needs %q: the template is only read, and no wildcard is asked once the kinds are known", p)
		}
	}

	scope.WithoutControllerLookup = true
	for _, p := range strs(Needs(rbac.Operate(), scope)) {
		if strings.Contains(p, "deployments.apps") {
			t.Errorf("with --kcp-version the controller's Deployment is not looked up, yet %q is asked", p)
		}
	}

	// Kinds not known (the KubeadmControlPlane could not be read): the
	// wildcard is asked as the role grants it.
	if got := strs(Needs(rbac.View(), Scope{Namespace: "default", Cluster: "demo"})); !slices.Contains(got, "get *.infrastructure.cluster.x-k8s.io in namespace default") {
		t.Errorf("view without known kinds: %v", got)
	}
}

func TestInfraResources(t *testing.T) {
	mapping := func(gk schema.GroupKind) (string, error) {
		switch gk.Kind {
		case "DockerMachineTemplate":
			return "dockermachinetemplates", nil
		case "DockerMachine":
			return "dockermachines", nil
		}
		return "", errors.New("no match")
	}
	if m, tpl := InfraResources("infrastructure.cluster.x-k8s.io", "DockerMachineTemplate", mapping); m != "dockermachines" || tpl != "dockermachinetemplates" {
		t.Errorf("got %q, %q", m, tpl)
	}
	if m, tpl := InfraResources("infrastructure.cluster.x-k8s.io", "Unknown", mapping); m != "" || tpl != "" {
		t.Errorf("unmapped kinds: got %q, %q, want the wildcard kept", m, tpl)
	}
	if m, tpl := InfraResources("vmware.infrastructure.cluster.x-k8s.io", "DockerMachineTemplate", mapping); m != "" || tpl != "" {
		t.Errorf("another group: got %q, %q", m, tpl)
	}
}

func TestDescribeOneLineEach(t *testing.T) {
	got := Describe("", "a rollout", "cp-rollout-operate", []Permission{
		{Verb: "get", Resource: "secrets", Namespace: "default", Name: "demo-etcd"},
		{Verb: "list", Group: "apps", Resource: "deployments"},
	})
	want := "this identity lacks 2 permission(s) that a rollout needs on the management cluster (ClusterRole cp-rollout-operate in deploy/rbac grants them):\n" +
		"  cannot get secrets demo-etcd in namespace default\n" +
		"  cannot list deployments.apps in all namespaces"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestGrantsReadsRulesAsRBACDoes: a rule grants what it lists or "*", and
// with resource names only requests for one of them.
func TestGrantsReadsRulesAsRBACDoes(t *testing.T) {
	get := Permission{Verb: "get", Group: "cluster.x-k8s.io", Resource: "machines", Namespace: "default"}
	named := Permission{Verb: "get", Resource: "secrets", Namespace: "default", Name: "demo-etcd"}
	rule := func(verbs, groups, resources []string, names ...string) authorizationv1.ResourceRule {
		return authorizationv1.ResourceRule{Verbs: verbs, APIGroups: groups, Resources: resources, ResourceNames: names}
	}
	for _, c := range []struct {
		rule authorizationv1.ResourceRule
		p    Permission
		want bool
	}{
		{rule([]string{"get", "list"}, []string{"cluster.x-k8s.io"}, []string{"machines"}), get, true},
		{rule([]string{"*"}, []string{"*"}, []string{"*"}), get, true},
		{rule([]string{"list"}, []string{"cluster.x-k8s.io"}, []string{"machines"}), get, false},
		{rule([]string{"get"}, []string{""}, []string{"machines"}), get, false},
		{rule([]string{"get"}, []string{"cluster.x-k8s.io"}, []string{"clusters"}), get, false},
		{rule([]string{"get"}, []string{""}, []string{"secrets"}, "demo-etcd"), named, true},
		{rule([]string{"get"}, []string{""}, []string{"secrets"}, "demo-kubeconfig"), named, false},
		{rule([]string{"get"}, []string{"cluster.x-k8s.io"}, []string{"machines"}, "m1"), get, false},
	} {
		if got := grants(c.rule, c.p); got != c.want {
			t.Errorf("%+v grants %s: %v, want %v", c.rule, c.p, got, c.want)
		}
	}
}
