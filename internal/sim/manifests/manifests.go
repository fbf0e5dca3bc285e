// Package manifests holds what the simulator installs of Cluster API into its
// management cluster, as a release's manifests would: the v1beta2
// CustomResourceDefinitions (core, kubeadm control plane and kubeadm
// bootstrap) with the contract labels a release adds, and the three
// providers' admission webhook configurations. They are copied from the
// sigs.k8s.io/cluster-api module (see gen) and embedded so the simulator does
// not depend on a module cache at run time. ManagementCRDs adds the generic
// infrastructure provider's, which cluster-api defines in Go.
package manifests

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"sort"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"sigs.k8s.io/cluster-api/util/test/builder"
)

//go:generate go run ./gen

//go:embed crds/*.yaml webhooks/*.yaml
var files embed.FS

// CRDs returns the embedded CRDs, sorted by file name.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var out []*apiextensionsv1.CustomResourceDefinition
	err := eachDocument("crds", func(name string, doc []byte) error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(doc, crd); err != nil {
			return fmt.Errorf("decoding embedded CRD %s: %w", name, err)
		}
		out = append(out, crd)
		return nil
	})
	return out, err
}

// ManagementCRDs returns what a management cluster of the simulator's
// installs: CRDs() and the generic infrastructure provider's cluster, machine
// and template CRDs (cluster-api's util/test/builder), the infrastructure the
// simulated provider serves. Each call returns copies of its own.
func ManagementCRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	list, err := CRDs()
	if err != nil {
		return nil, err
	}
	return append(list, InfrastructureCRDs()...), nil
}

// InfrastructureCRDs returns copies of the generic infrastructure provider's
// cluster, machine and template CRDs, which the simulated provider serves.
func InfrastructureCRDs() []*apiextensionsv1.CustomResourceDefinition {
	return []*apiextensionsv1.CustomResourceDefinition{
		builder.GenericInfrastructureClusterCRD.DeepCopy(),
		builder.GenericInfrastructureClusterTemplateCRD.DeepCopy(),
		builder.GenericInfrastructureMachineCRD.DeepCopy(),
		builder.GenericInfrastructureMachineTemplateCRD.DeepCopy(),
	}
}

// Webhooks returns the core, kubeadm bootstrap and kubeadm control plane
// providers' mutating and validating webhook configurations. Their webhooks
// name a service of the provider; envtest points them at a local server.
func Webhooks() (mutating []*admissionv1.MutatingWebhookConfiguration, validating []*admissionv1.ValidatingWebhookConfiguration, err error) {
	err = eachDocument("webhooks", func(name string, doc []byte) error {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			return fmt.Errorf("decoding embedded %s: %w", name, err)
		}
		switch kind.Kind {
		case "MutatingWebhookConfiguration":
			c := &admissionv1.MutatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(doc, c); err != nil {
				return fmt.Errorf("decoding embedded %s: %w", name, err)
			}
			mutating = append(mutating, c)
		case "ValidatingWebhookConfiguration":
			c := &admissionv1.ValidatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(doc, c); err != nil {
				return fmt.Errorf("decoding embedded %s: %w", name, err)
			}
			validating = append(validating, c)
		default:
			return fmt.Errorf("embedded %s holds a %q, not a webhook configuration", name, kind.Kind)
		}
		return nil
	})
	return mutating, validating, err
}

// eachDocument calls fn with each YAML document of the files in dir, in file
// name order.
func eachDocument(dir string, fn func(name string, doc []byte) error) error {
	names, err := fs.Glob(files, dir+"/*.yaml")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		data, err := files.ReadFile(name)
		if err != nil {
			return err
		}
		for _, doc := range bytes.Split(data, []byte("\n---\n")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			if err := fn(name, doc); err != nil {
				return err
			}
		}
	}
	return nil
}
