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

func needs(t *testing.T, use rbac.Use, s Scope) []string {
	t.Helper()
	perms, err := Needs(use, s)
	if err != nil {
		t.Fatal(err)
	}
	return strs(perms)
}

// TestNeedsNarrowsTheRolesToOneCluster: the roles' permissions are asked
// where the tool uses them: the cluster's Role in its namespace and by the
// names it lists, the ClusterRole cluster-wide but the KCP controller's
// Deployment in its own namespace.
func TestNeedsNarrowsTheRolesToOneCluster(t *testing.T) {
	scope := Scope{Namespace: "capi-prod", Cluster: "eu1",
		InfraMachines: "awsmachines", InfraMachineTemplates: "awsmachinetemplates"}
	got := needs(t, rbac.Operate, scope)
	for _, want := range []string{
		"get clusters.cluster.x-k8s.io in namespace capi-prod",
		"list clusters.cluster.x-k8s.io in all namespaces",
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
		"get deployments.apps capi-kubeadm-control-plane-controller-manager in namespace capi-kubeadm-control-plane-system",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("operate needs no %q; it needs:\n%s", want, strings.Join(got, "\n"))
		}
	}
	for _, p := range got {
		if strings.Contains(p, "*") || strings.Contains(p, "create awsmachinetemplates") {
			t.Errorf("operate needs %q: the template is only read, and no wildcard is asked once the kinds are known", p)
		}
		if strings.HasPrefix(p, "update leases") && !strings.Contains(p, "cp-rollout-eu1 in namespace capi-prod") {
			t.Errorf("operate needs %q: only the cluster's own Lease is written", p)
		}
	}

	scope.WithoutControllerLookup = true
	for _, p := range needs(t, rbac.Operate, scope) {
		if strings.Contains(p, "deployments.apps") {
			t.Errorf("with --kcp-version the controller's Deployment is not looked up, yet %q is asked", p)
		}
	}

	// Kinds not known (the KubeadmControlPlane could not be read): the
	// wildcard is asked as the role grants it.
	view := needs(t, rbac.View, Scope{Namespace: "default", Cluster: "demo"})
	if !slices.Contains(view, "get *.infrastructure.cluster.x-k8s.io in namespace default") {
		t.Errorf("view without known kinds: %v", view)
	}
	for _, p := range view {
		if strings.Contains(p, "secrets") {
			t.Errorf("view needs %q: it reads no Secret", p)
		}
	}
	// status shows the KCP controller's version.
	if want := "get deployments.apps capi-kubeadm-control-plane-controller-manager in namespace capi-kubeadm-control-plane-system"; !slices.Contains(view, want) {
		t.Errorf("view needs no %q; it needs:\n%s", want, strings.Join(view, "\n"))
	}
}

// TestWorkloadNeedsTheTwoSecrets: reaching the workload cluster is reading
// its two Secrets by name, nothing else.
func TestWorkloadNeedsTheTwoSecrets(t *testing.T) {
	perms, err := WorkloadNeeds(Scope{Namespace: "default", Cluster: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"get secrets demo-kubeconfig in namespace default", "get secrets demo-etcd in namespace default"}
	if got := strs(perms); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := WorkloadNeeds(Scope{Namespace: "default", Cluster: "Demo"}); err == nil {
		t.Error("a cluster name the API server would refuse was accepted")
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
	got := Describe("", "a rollout", rbac.Operate, Scope{Namespace: "default", Cluster: "demo"}, []Permission{
		{Verb: "get", Resource: "secrets", Namespace: "default", Name: "demo-etcd"},
		{Verb: "list", Group: "cluster.x-k8s.io", Resource: "clusters"},
	})
	want := "this identity lacks 2 permission(s) that a rollout needs on the management cluster (ClusterRole cp-rollout-operate and Role cp-rollout-operate-demo in namespace default grant them; `kubectl cp-rollout rbac demo -n default` prints them):\n" +
		"  cannot get secrets demo-etcd in namespace default\n" +
		"  cannot list clusters.cluster.x-k8s.io in all namespaces"
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
