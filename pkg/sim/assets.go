package sim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// KubernetesVersion is the version of the kube-apiserver the simulator runs for
// both the management and the workload cluster. hack/envtest-binaries.sh builds
// it and keys its cache directory by it.
const KubernetesVersion = "v1.36.3"

// assetsEnv is the variable controller-runtime's envtest reads; honouring it
// keeps `make test` and a hand-run `go test` pointed at the same binaries.
const assetsEnv = "KUBEBUILDER_ASSETS"

// AssetsDir returns the directory holding the kube-apiserver and etcd binaries:
// $KUBEBUILDER_ASSETS when set, else the cache hack/envtest-binaries.sh fills.
// A missing binary is an error, never a reason to skip: a test run that silently
// skips the simulator proves nothing.
func AssetsDir() (string, error) {
	dir := os.Getenv(assetsEnv)
	if dir == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("locating the envtest binaries: %w", err)
			}
			cache = filepath.Join(home, ".cache")
		}
		dir = filepath.Join(cache, "cp-rollout", "envtest", KubernetesVersion)
	}
	var missing []error
	for _, name := range []string{"kube-apiserver", "etcd"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		switch {
		case err != nil:
			missing = append(missing, err)
		case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
			missing = append(missing, fmt.Errorf("%s is not an executable file", filepath.Join(dir, name)))
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("envtest binaries missing (run `make envtest` or hack/envtest-binaries.sh): %w", errors.Join(missing...))
	}
	return dir, nil
}
