// Package rbac holds the roles in this folder as the tool reads them: the
// YAML an administrator applies is, byte for byte, the list of permissions
// the tool's preflight asks the API server about, and what `kubectl
// cp-rollout rbac` prints, so the three cannot drift apart.
//
// Each use has two halves: a ClusterRole for what only a cluster-wide grant
// can give (CRDs, the KCP controller's Deployment, the lists of `status -A`),
// and a Role per workload cluster, in its namespace, naming its two Secrets
// and its Lease (the templates in cluster/).
package rbac

import (
	_ "embed"
	"fmt"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/validation"
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
