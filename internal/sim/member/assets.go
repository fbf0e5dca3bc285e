package member

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// KubernetesVersion keys the directory hack/envtest-binaries.sh fills with the
// kube-apiserver and etcd binaries the simulator runs.
const KubernetesVersion = "v1.36.3"

// assetsEnv is the variable controller-runtime's envtest reads; honouring it keeps
// `make test` and a hand-run `go test` pointed at the same binaries.
const assetsEnv = "KUBEBUILDER_ASSETS"

// AssetsDir returns the directory holding the named envtest binaries (by default
// kube-apiserver and etcd): $KUBEBUILDER_ASSETS when set, else the cache
// hack/envtest-binaries.sh fills. It lives here rather than in the simulator package
// because members need the etcd binary and the simulator imports this package, not the
// reverse. A missing binary is an error, never a reason to skip: a test run that
// silently skips the simulator proves nothing.
func AssetsDir(binaries ...string) (string, error) {
	if len(binaries) == 0 {
		binaries = []string{"kube-apiserver", "etcd"}
	}
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
	for _, name := range binaries {
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

// etcdBinary is the etcd every member runs.
func etcdBinary() (string, error) {
	dir, err := AssetsDir("etcd")
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "etcd"), nil
}
