package crds

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestContractLabels: every embedded CRD maps each Cluster API contract it
// serves to an API version, or contract-versioned lookups fail at run time.
func TestContractLabels(t *testing.T) {
	list, err := ClusterAPI()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) == 0 {
		t.Fatal("no CRDs embedded")
	}
	for _, crd := range list {
		for _, contract := range []string{"cluster.x-k8s.io/v1beta1", "cluster.x-k8s.io/v1beta2"} {
			if crd.Labels[contract] == "" {
				t.Errorf("%s: no %s label", crd.Name, contract)
			}
		}
	}
}

// TestEmbeddedCRDsAreCurrent: the embedded copies are what the generator
// makes from the cluster-api module this module requires; rerun
// `go generate ./pkg/sim/crds` after changing that version.
func TestEmbeddedCRDsAreCurrent(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("go", "run", "./gen", "-out", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./gen: %v\n%s", err, out)
	}
	generated, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	embedded, err := files.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(generated) != len(embedded) {
		t.Fatalf("generator makes %d CRDs, %d embedded", len(generated), len(embedded))
	}
	for _, path := range generated {
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := files.ReadFile(filepath.Base(path))
		if err != nil {
			t.Fatalf("%s not embedded: %v", filepath.Base(path), err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the generator's output; run go generate ./pkg/sim/crds", filepath.Base(path))
		}
	}
}
