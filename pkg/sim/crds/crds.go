// Package crds holds the Cluster API v1beta2 CustomResourceDefinitions the
// simulator installs into its management cluster: core, kubeadm control plane
// and kubeadm bootstrap, copied from the sigs.k8s.io/cluster-api module with
// the contract labels a release would add (see gen). They are embedded so the
// simulator does not depend on a module cache at run time.
package crds

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

//go:generate go run ./gen

//go:embed *.yaml
var files embed.FS

// ClusterAPI returns the embedded CRDs, sorted by file name.
func ClusterAPI() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(names))
	for _, name := range names {
		data, err := files.ReadFile(name)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return nil, fmt.Errorf("decoding embedded CRD %s: %w", name, err)
		}
		out = append(out, crd)
	}
	return out, nil
}
