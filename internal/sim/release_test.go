package sim

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A release the proxy does not serve is refused with its name, and nothing
// is left in the cache.
func TestBuildReleaseNamesWhatTheProxyDoesNotServe(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := BuildRelease(ctx, "v1.99.0", io.Discard)
	if err == nil || !strings.Contains(err.Error(), "sigs.k8s.io/cluster-api@v1.99.0") {
		t.Fatalf("building v1.99.0: %v; want a refusal naming sigs.k8s.io/cluster-api@v1.99.0", err)
	}
	if _, err := BuildRelease(ctx, "latest", io.Discard); err == nil || !strings.Contains(err.Error(), "not a Cluster API release") {
		t.Errorf("building latest: %v; want it refused as no release", err)
	}
}

// The build module takes the release's requirements, drops its replaces
// (a directory a module download lacks) and takes the api module from the
// proxy at the release's version.
func TestBuildModule(t *testing.T) {
	src := t.TempDir()
	goMod := "module sigs.k8s.io/cluster-api\n\ngo 1.26.0\n\nreplace sigs.k8s.io/cluster-api/api => ./api\n\nrequire (\n\tsigs.k8s.io/cluster-api/api v0.0.0-00010101000000-000000000000\n\tk8s.io/api v0.36.3\n)\n"
	for name, data := range map[string]string{"go.mod": goMod, "go.sum": "k8s.io/api v0.36.3 h1:x\n"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := buildModule(src, "v1.14.2", filepath.Join(t.TempDir(), "build"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"require sigs.k8s.io/cluster-api v1.14.2", "\tk8s.io/api v0.36.3", "replace sigs.k8s.io/cluster-api/api => sigs.k8s.io/cluster-api/api v1.14.2"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("go.mod lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"module sigs.k8s.io/cluster-api\n", "=> ./api", "go 1.26.0"} {
		if strings.Contains(string(got), unwanted) {
			t.Errorf("go.mod keeps %q of the release's:\n%s", unwanted, got)
		}
	}
	if sum, err := os.ReadFile(filepath.Join(dir, "go.sum")); err != nil || string(sum) != "k8s.io/api v0.36.3 h1:x\n" {
		t.Errorf("go.sum %q, %v; want the release's", sum, err)
	}
}
