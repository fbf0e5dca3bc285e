// Package rbac holds the ClusterRoles in this folder as the tool reads them:
// the YAML an administrator applies is, byte for byte, the list of
// permissions the tool's preflight asks the API server about, so the two
// cannot drift apart.
package rbac

import (
	_ "embed"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

var (
	//go:embed cp-rollout-view.yaml
	viewYAML []byte
	//go:embed cp-rollout-operate.yaml
	operateYAML []byte
)

// View is cp-rollout-view: what status and plan need.
func View() *rbacv1.ClusterRole { return mustDecode("cp-rollout-view.yaml", viewYAML) }

// Operate is cp-rollout-operate: what upgrade, scale and replace need,
// everything View grants included.
func Operate() *rbacv1.ClusterRole { return mustDecode("cp-rollout-operate.yaml", operateYAML) }

func mustDecode(name string, raw []byte) *rbacv1.ClusterRole {
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(raw, role); err != nil {
		// Embedded at build time and decoded by this package's test.
		panic(fmt.Sprintf("deploy/rbac/%s: %v", name, err))
	}
	return role
}
