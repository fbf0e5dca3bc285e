package manifests

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
)

// TestContractLabels: every embedded CRD maps each Cluster API contract it
// serves to an API version, or contract-versioned lookups fail at run time.
func TestContractLabels(t *testing.T) {
	list, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) == 0 {
		t.Fatal("no CRDs embedded")
	}
	for _, crd := range list {
		for _, v := range crd.Spec.Versions {
			if contract := "cluster.x-k8s.io/" + v.Name; v.Served && (v.Name == "v1beta1" || v.Name == "v1beta2") && crd.Labels[contract] != v.Name {
				t.Errorf("%s serves %s but its %s label is %q", crd.Name, v.Name, contract, crd.Labels[contract])
			}
		}
		if crd.Labels["cluster.x-k8s.io/v1beta2"] == "" {
			t.Errorf("%s: no cluster.x-k8s.io/v1beta2 label", crd.Name)
		}
	}
}

// TestWebhookConfigurations: the three providers' configurations have names
// of their own (an API server holds one object per name) and webhooks only
// for resources the embedded CRDs serve.
func TestWebhookConfigurations(t *testing.T) {
	mutating, validating, err := Webhooks()
	if err != nil {
		t.Fatal(err)
	}
	if len(mutating) != 3 || len(validating) != 3 {
		t.Fatalf("%d mutating and %d validating configurations, want 3 of each (core, bootstrap, control plane)", len(mutating), len(validating))
	}
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, crd := range crds {
		served[crd.Spec.Group+"/"+crd.Spec.Names.Plural] = true
	}
	// Each configuration's name and the rules of all its webhooks.
	rules := map[string][]admissionv1.RuleWithOperations{}
	for _, c := range mutating {
		for _, w := range c.Webhooks {
			rules[c.Name] = append(rules[c.Name], w.Rules...)
		}
	}
	for _, c := range validating {
		for _, w := range c.Webhooks {
			rules[c.Name] = append(rules[c.Name], w.Rules...)
		}
	}
	if len(rules) != len(mutating)+len(validating) {
		t.Errorf("%d distinct names for %d configurations: an API server holds one object per name", len(rules), len(mutating)+len(validating))
	}
	for name, list := range rules {
		for _, r := range list {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					if res, _, _ := strings.Cut(res, "/"); !served[g+"/"+res] {
						t.Errorf("%s: webhook for %s/%s, which no embedded CRD serves", name, g, res)
					}
				}
			}
		}
	}
}

// TestEmbeddedManifestsAreCurrent: the embedded copies are what the generator
// makes from the cluster-api module this module requires; rerun
// `go generate ./internal/sim/manifests` after changing that version.
func TestEmbeddedManifestsAreCurrent(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("go", "run", "./gen", "-out", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./gen: %v\n%s", err, out)
	}
	generated, err := filepath.Glob(filepath.Join(dir, "*", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := fs.Glob(files, "*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(generated) != len(embedded) {
		t.Fatalf("generator makes %d files, %d embedded", len(generated), len(embedded))
	}
	for _, path := range generated {
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, path)
		got, err := files.ReadFile(filepath.ToSlash(rel))
		if err != nil {
			t.Fatalf("%s not embedded: %v", rel, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the generator's output; run go generate ./internal/sim/manifests", rel)
		}
	}
}
