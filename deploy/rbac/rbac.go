// Package rbac holds the roles in this folder as the tool reads them: the
// YAML an administrator applies is, byte for byte, the list of permissions
// the tool's preflight asks the API server about, and what `kubectl
// cp-rollout rbac` prints, so the three cannot drift apart.
//
// Each use has two halves: a ClusterRole for what only a cluster-wide grant
// can give (CRDs, the KCP controller's Deployment, the lists of `status -A`),
// and a Role per workload cluster, in its namespace, naming its two Secrets
// and its Lease (the templates in cluster/).
//
// RBAC cannot confine the Role's creates and lists to a name, so its writes
// reach every cluster of the namespace; the ValidatingAdmissionPolicy of
// cp-rollout-confine.yaml, one per identity (Confine), makes the API server
// refuse an identity's writes to clusters whose Role it does not hold.
package rbac

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"sigs.k8s.io/yaml"
)

// Use is one of the two ways the tool is used, and the roles it takes.
type Use struct {
	// Name is the ClusterRole's name, and the prefix of each cluster's Role.
	Name         string
	clusterWide  []byte
	roleTemplate []byte
}

var (
	//go:embed cp-rollout-view.yaml
	viewYAML []byte
	//go:embed cp-rollout-operate.yaml
	operateYAML []byte
	//go:embed cluster/cp-rollout-view.yaml
	viewRoleYAML []byte
	//go:embed cluster/cp-rollout-operate.yaml
	operateRoleYAML []byte
)

var (
	// View is what status needs; plan and --dry-run need the cluster's
	// Secrets besides.
	View = Use{Name: "cp-rollout-view", clusterWide: viewYAML, roleTemplate: viewRoleYAML}
	// Operate is what upgrade, scale, replace, plan and handback need,
	// everything View grants included.
	Operate = Use{Name: "cp-rollout-operate", clusterWide: operateYAML, roleTemplate: operateRoleYAML}
)

// Uses are both, View first.
var Uses = []Use{View, Operate}

// ClusterRoleYAML is the ClusterRole as its file has it, comments included.
func (u Use) ClusterRoleYAML() []byte { return u.clusterWide }

// ClusterRole is the ClusterRole decoded.
func (u Use) ClusterRole() *rbacv1.ClusterRole {
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(u.clusterWide, role); err != nil {
		// Embedded at build time and decoded by this package's test.
		panic(fmt.Sprintf("deploy/rbac: %s: %v", u.Name, err))
	}
	return role
}

// RoleYAML is the Role of one cluster: the template with ${NAMESPACE} and
// ${CLUSTER} filled in, comments included. The names are checked as the API
// server would, so no value can change the YAML around them.
func (u Use) RoleYAML(namespace, cluster string) ([]byte, error) {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return nil, fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(cluster); len(errs) > 0 {
		return nil, fmt.Errorf("cluster name %q: %s", cluster, strings.Join(errs, "; "))
	}
	fill := strings.NewReplacer("${NAMESPACE}", namespace, "${CLUSTER}", cluster)
	return []byte(fill.Replace(string(u.roleTemplate))), nil
}

// RoleName is the name of the Role of one cluster, as the template has it.
func (u Use) RoleName(cluster string) string { return u.Name + "-" + cluster }

// Role is the Role of one cluster decoded, as RoleYAML prints it.
func (u Use) Role(namespace, cluster string) (*rbacv1.Role, error) {
	raw, err := u.RoleYAML(namespace, cluster)
	if err != nil {
		return nil, err
	}
	role := &rbacv1.Role{}
	if err := yaml.UnmarshalStrict(raw, role); err != nil {
		return nil, fmt.Errorf("deploy/rbac: the Role of %s for %s/%s: %w", u.Name, namespace, cluster, err)
	}
	return role, nil
}

//go:embed cp-rollout-fleet.yaml
var fleetYAML []byte

// FleetRoleName is the Role a fleet run needs where runs are recorded.
const FleetRoleName = "cp-rollout-fleet"

// FleetRoleYAML is the Role of fleet runs recorded in namespace, comments
// included.
func FleetRoleYAML(namespace string) ([]byte, error) {
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return nil, fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	return []byte(strings.ReplaceAll(string(fleetYAML), "${NAMESPACE}", namespace)), nil
}

// FleetRole is FleetRoleYAML decoded.
func FleetRole(namespace string) (*rbacv1.Role, error) {
	raw, err := FleetRoleYAML(namespace)
	if err != nil {
		return nil, err
	}
	role := &rbacv1.Role{}
	if err := yaml.UnmarshalStrict(raw, role); err != nil {
		return nil, fmt.Errorf("deploy/rbac: %s: %w", FleetRoleName, err)
	}
	return role, nil
}

//go:embed cp-rollout-confine.yaml
var confineYAML []byte

// Confinement is what confines one subject's writes to the workload clusters
// it is granted, enforced by the API server (cp-rollout-confine.yaml says
// how and why): a ValidatingAdmissionPolicy that selects the subject's
// requests, and the binding that puts it in force, denying. It depends on the
// subject alone, never on a cluster: the grant it checks is RBAC's, so one
// policy serves every cluster the subject is granted, and `rbac` prints the
// same one for each.
type Confinement struct {
	// PolicyYAML is the policy as its file has it, comments included, filled
	// in for the subject.
	PolicyYAML []byte
	Policy     *admissionregistrationv1.ValidatingAdmissionPolicy
	Binding    *admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// Confine is the Confinement of subject: a user, a group, or a ServiceAccount
// (which the API server sees as the user system:serviceaccount:NAMESPACE:NAME,
// so a ServiceAccount and that user name get the same one).
func Confine(subject rbacv1.Subject) (*Confinement, error) {
	kind, name, err := identity(subject)
	if err != nil {
		return nil, err
	}
	match := "request.userInfo.username == " + celString(name)
	if kind == rbacv1.GroupKind {
		// has(): a request without groups must not fail the condition, which
		// every writer's requests meet, Cluster API's controllers' included.
		match = "has(request.userInfo.groups) && " + celString(name) + " in request.userInfo.groups"
	}
	policyName := uniqueName("cp-rollout-confine-"+readableIdentity(kind, name), kind, name)
	// The expression goes in as a JSON string, which is a YAML double-quoted
	// scalar: whatever the name holds, it stays one value. The decode below
	// checks that it did.
	quoted, err := json.Marshal(match)
	if err != nil {
		return nil, err
	}
	fill := strings.NewReplacer("${POLICY}", policyName, "${SUBJECT}", string(quoted))
	raw := []byte(fill.Replace(string(confineYAML)))
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{}
	if err := yaml.UnmarshalStrict(raw, policy); err != nil {
		return nil, fmt.Errorf("deploy/rbac: the confinement of %s %q: %w", subject.Kind, subject.Name, err)
	}
	if policy.Name != policyName || len(policy.Spec.MatchConditions) != 1 || policy.Spec.MatchConditions[0].Expression != match {
		return nil, fmt.Errorf("deploy/rbac: the confinement of %s %q does not decode to its own match condition", subject.Kind, subject.Name)
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
		// Named as its policy, so that one of each exists per subject.
		ObjectMeta: metav1.ObjectMeta{Name: policyName, Labels: policy.Labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: policyName,
			// No matchResources: every namespace. The subject may be granted
			// clusters in several, and in one where it is granted none, RBAC
			// refuses its writes before admission does.
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	return &Confinement{PolicyYAML: raw, Policy: policy, Binding: binding}, nil
}

// BindingName names the binding of u's role for cluster, in namespace, to
// subject: one binding per (use, namespace, cluster, subject), so that
// binding a second subject adds to the first rather than replacing it, and
// no two of these four ever share a name (a hash of all four ends it; the
// rest is for people). clusterWide names the ClusterRoleBinding, which has no
// namespace of its own to tell it apart: its name carries the namespace.
func (u Use) BindingName(namespace, cluster string, subject rbacv1.Subject, clusterWide bool) string {
	readable := u.RoleName(cluster)
	if clusterWide {
		readable = u.Name + "-" + namespace + "-" + cluster
	}
	kind, name := subject.Kind, subject.Name
	if kind == rbacv1.ServiceAccountKind {
		name = subject.Namespace + ":" + subject.Name
	}
	return uniqueName(readable+"-"+readableIdentity(kind, name), u.Name, namespace, cluster, kind, subject.Namespace, subject.Name)
}

// identity is subject as the API server's userInfo has it: a user name or a
// group name, with which kind of the two.
func identity(subject rbacv1.Subject) (kind, name string, err error) {
	switch {
	case subject.Name == "" || !utf8.ValidString(subject.Name) || !utf8.ValidString(subject.Namespace):
		return "", "", fmt.Errorf("subject %s %q: not a name the API server could authenticate", subject.Kind, subject.Name)
	case subject.Kind == rbacv1.UserKind || subject.Kind == rbacv1.GroupKind:
		return subject.Kind, subject.Name, nil
	case subject.Kind == rbacv1.ServiceAccountKind && subject.Namespace != "":
		return rbacv1.UserKind, serviceaccount.MakeUsername(subject.Namespace, subject.Name), nil
	}
	return "", "", fmt.Errorf("subject %s %q: want a User, a Group or a ServiceAccount with its namespace", subject.Kind, subject.Name)
}

// readableIdentity is the part of a name that tells a person whose it is: a
// ServiceAccount's user name (or the NAMESPACE:NAME of a ServiceAccount
// subject) as sa-NAMESPACE-NAME.
func readableIdentity(kind, name string) string {
	prefix := map[string]string{rbacv1.UserKind: "user", rbacv1.GroupKind: "group", rbacv1.ServiceAccountKind: "sa"}[kind]
	if ns, sa, err := serviceaccount.SplitUsername(name); kind == rbacv1.UserKind && err == nil {
		prefix, name = "sa", ns+"-"+sa
	}
	return prefix + "-" + name
}

// uniqueName is readable, cut to what a Kubernetes name may hold and reduced
// to lower-case letters, digits and dashes, then a hash of key: readable is
// for people and may lose what tells two keys apart; the hash does not.
func uniqueName(readable string, key ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(key, "\x00")))
	suffix := "-" + hex.EncodeToString(sum[:8])
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(readable) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	out := strings.Trim(b.String(), "-")
	if max := validation.DNS1123SubdomainMaxLength - len(suffix); len(out) > max {
		out = strings.TrimRight(out[:max], "-")
	}
	return out + suffix
}

// celString is s as a CEL string literal: every character but letters,
// digits and a few harmless others written as a \U escape, so no name can
// end the literal or change the expression around it.
func celString(s string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(" .:@_-+=/", r) {
			b.WriteRune(r)
		} else {
			fmt.Fprintf(&b, `\U%08X`, r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}
