// Package access answers "may the identity running the tool do everything an
// operation needs on the management cluster?" before the operation changes
// anything. It asks the API server about each permission of the operation's
// roles in deploy/rbac, its ClusterRole and the Role of the one cluster the
// operation works on (see Needs, Missing). A rollout that stops half-way for a missing permission
// is the worst way to learn of it.
package access

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
)

// Permission is one request the API server authorizes: a verb on a resource,
// in a namespace or cluster-wide, on any object or on one by name.
type Permission struct {
	Verb     string
	Group    string
	Resource string
	// Namespace is "" for a cluster-scoped resource or a request across all
	// namespaces.
	Namespace string
	// Name is "" when the request is for any object of the resource.
	Name string
}

// String says it in `kubectl auth can-i`'s words, with where it applies:
// "get secrets demo-etcd in namespace default", "list deployments.apps in
// all namespaces".
func (p Permission) String() string {
	what := p.Verb + " " + p.Resource
	if p.Group != "" {
		what += "." + p.Group
	}
	if p.Name != "" {
		what += " " + p.Name
	}
	switch {
	case p.Namespace != "":
		return what + " in namespace " + p.Namespace
	case clusterScoped[schema.GroupResource{Group: p.Group, Resource: p.Resource}]:
		return what + " (cluster-scoped)"
	default:
		return what + " in all namespaces"
	}
}

// Scope is the one cluster an operation works on.
type Scope struct {
	Namespace, Cluster string
	// InfraMachines and InfraMachineTemplates are the infrastructure
	// provider's resources the cluster's control-plane machines are made of
	// (e.g. awsmachines and awsmachinetemplates); they stand for the roles'
	// "*" in the infrastructure group. Empty keeps the "*".
	InfraMachines, InfraMachineTemplates string
	// WithoutControllerLookup leaves out the read of the KCP controller's
	// Deployment that finds its version, which --kcp-version makes
	// unnecessary.
	WithoutControllerLookup bool
}

// clusterScoped are the resources of the roles that have no namespace.
var clusterScoped = map[schema.GroupResource]bool{
	{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}: true,
}

var (
	secrets     = schema.GroupResource{Resource: "secrets"}
	deployments = schema.GroupResource{Group: "apps", Resource: "deployments"}
)

// Needs lists the permissions of a use's two roles as the tool uses them on
// one cluster: the cluster's Role in its namespace, by the names it lists
// (its two Secrets, its Lease); the ClusterRole's rules in all namespaces,
// but the KCP controller's Deployment in the namespace the tool reads it in;
// and the infrastructure wildcard as the provider's own resources.
func Needs(use rbac.Use, s Scope) ([]Permission, error) {
	role, err := use.Role(s.Namespace, s.Cluster)
	if err != nil {
		return nil, err
	}
	out := s.expandRules(use.ClusterRole().Rules, "")
	return append(out, s.expandRules(role.Rules, role.Namespace)...), nil
}

// WorkloadNeeds are the permissions that reach the workload cluster: reading
// its two Secrets, as cp-rollout-operate's Role of the cluster grants them
// and cp-rollout-view's does not.
func WorkloadNeeds(s Scope) ([]Permission, error) {
	all, err := Needs(rbac.Operate, s)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(p Permission) bool {
		return (schema.GroupResource{Group: p.Group, Resource: p.Resource}) != secrets
	}), nil
}

func (s Scope) expandRules(rules []rbacv1.PolicyRule, namespace string) []Permission {
	var out []Permission
	for _, rule := range rules {
		for _, group := range rule.APIGroups {
			for _, resource := range rule.Resources {
				gr := schema.GroupResource{Group: group, Resource: resource}
				for _, verb := range rule.Verbs {
					out = append(out, s.expand(Permission{Verb: verb, Group: group, Resource: resource, Namespace: namespace}, gr, rule.ResourceNames)...)
				}
			}
		}
	}
	return out
}

func (s Scope) expand(p Permission, gr schema.GroupResource, names []string) []Permission {
	switch {
	case clusterScoped[gr]:
		p.Namespace = ""
	case gr == deployments:
		if s.WithoutControllerLookup {
			return nil
		}
		p.Namespace = controlplane.KCPControllerNamespace
	case gr.Group == infrastructureGroup && gr.Resource == "*":
		// The InfraMachine resource takes every verb the rule grants; its
		// template is only read and watched (the caches' informers list
		// through their watch, where the API server streams the first
		// list).
		out := []Permission{p}
		if s.InfraMachines != "" {
			out[0].Resource = s.InfraMachines
		}
		if (p.Verb == "get" || p.Verb == "watch") && s.InfraMachineTemplates != "" {
			t := p
			t.Resource = s.InfraMachineTemplates
			out = append(out, t)
		}
		return out
	}
	if len(names) == 0 {
		return []Permission{p}
	}
	out := make([]Permission, len(names))
	for i, name := range names {
		out[i] = p
		out[i].Name = name
	}
	return out
}

// infrastructureGroup is where Cluster API providers serve their machines;
// the roles grant "*" there because the kinds are each provider's own.
var infrastructureGroup = "infrastructure." + clusterv1.GroupVersion.Group

// InfraResources names the infrastructure resources of a control plane's
// machines from the group and kind of the KubeadmControlPlane's
// InfraMachineTemplate: the InfraMachine kind is the template's without its
// "Template" suffix, as Cluster API names them. mapping turns a kind into its
// resource (a RESTMapper's KindFor's inverse); a kind it cannot map stays "".
func InfraResources(templateGroup, templateKind string, mapping func(schema.GroupKind) (string, error)) (machines, templates string) {
	if templateGroup != infrastructureGroup {
		return "", "" // another group: the wildcard rule does not cover it anyway
	}
	templates, _ = mapping(schema.GroupKind{Group: templateGroup, Kind: templateKind})
	machines, _ = mapping(schema.GroupKind{Group: templateGroup, Kind: strings.TrimSuffix(templateKind, clusterv1.TemplateSuffix)})
	return machines, templates
}

// Missing returns the permissions the API server denies, in the order given.
// One SelfSubjectRulesReview of the operation's namespace answers for most:
// a permission there that its rules grant is allowed. Every other one —
// cluster-wide, or not shown by the rules, as with an authorizer that is not
// RBAC — is asked on its own with a SelfSubjectAccessReview, as `kubectl auth
// can-i` does, a few at a time. The rules are used for the preflight alone:
// the API server still authorizes every request the operation makes.
func Missing(ctx context.Context, c client.Client, perms []Permission) ([]Permission, error) {
	granted := namespaceRules(ctx, c, perms)
	allowed := make([]bool, len(perms))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, p := range perms {
		if granted(p) {
			allowed[i] = true
			continue
		}
		g.Go(func() error {
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: p.Verb, Group: p.Group, Resource: p.Resource, Namespace: p.Namespace, Name: p.Name,
				},
			}}
			if err := c.Create(ctx, review); err != nil {
				return fmt.Errorf("asking the API server whether this identity may %s: %w", p, err)
			}
			allowed[i] = review.Status.Allowed
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var missing []Permission
	for i, p := range perms {
		if !allowed[i] {
			missing = append(missing, p)
		}
	}
	return missing, nil
}

// namespaceRules reviews the rules of the namespace most of perms are in
// and returns what they grant there; nothing when none is in a namespace or
// the review fails (each permission is then asked on its own).
func namespaceRules(ctx context.Context, c client.Client, perms []Permission) func(Permission) bool {
	none := func(Permission) bool { return false }
	count := map[string]int{}
	namespace := ""
	for _, p := range perms {
		if p.Namespace == "" {
			continue
		}
		count[p.Namespace]++
		if count[p.Namespace] > count[namespace] {
			namespace = p.Namespace
		}
	}
	if namespace == "" {
		return none
	}
	review := &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: namespace}}
	if err := c.Create(ctx, review); err != nil {
		return none
	}
	return func(p Permission) bool {
		return p.Namespace == namespace && slices.ContainsFunc(review.Status.ResourceRules, func(r authorizationv1.ResourceRule) bool {
			return grants(r, p)
		})
	}
}

// grants is RBAC's own reading of one rule: every listed verb, group and
// resource, or "*"; names, when listed, narrow it to requests for those
// names.
func grants(r authorizationv1.ResourceRule, p Permission) bool {
	matches := func(list []string, v string) bool { return slices.Contains(list, "*") || slices.Contains(list, v) }
	if !matches(r.Verbs, p.Verb) || !matches(r.APIGroups, p.Group) || !matches(r.Resources, p.Resource) {
		return false
	}
	return len(r.ResourceNames) == 0 || p.Name != "" && slices.Contains(r.ResourceNames, p.Name)
}

// Identity names the identity the API server sees, as `kubectl auth whoami`
// does; "" when it will not say (before Kubernetes 1.28, or when
// SelfSubjectReview is disabled).
func Identity(ctx context.Context, c client.Client) string {
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		return ""
	}
	return review.Status.UserInfo.Username
}

// Describe says what is missing for an operation, one permission a line
// after a line naming who lacks them and the roles that grant them.
func Describe(identity, operation string, use rbac.Use, s Scope, missing []Permission) string {
	if identity == "" {
		identity = "this identity"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s lacks %d permission(s) that %s needs on the management cluster (%s grant them; %s prints them):", identity, len(missing), operation, Roles(use, s), PrintRoles(s))
	for _, p := range missing {
		b.WriteString("\n  cannot " + p.String())
	}
	return b.String()
}

// Roles names the two roles of a use for one cluster.
func Roles(use rbac.Use, s Scope) string {
	return fmt.Sprintf("ClusterRole %s and Role %s in namespace %s", use.Name, use.RoleName(s.Cluster), s.Namespace)
}

// PrintRoles is the command that prints the roles of one cluster.
func PrintRoles(s Scope) string {
	return fmt.Sprintf("`kubectl cp-rollout rbac %s -n %s`", s.Cluster, s.Namespace)
}
