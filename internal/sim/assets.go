package sim

import "github.com/cp-rollout/cp-rollout/internal/sim/member"

// KubernetesVersion is the version of the kube-apiserver the simulator runs for
// both the management and the workload cluster. hack/envtest-binaries.sh builds
// it and keys its cache directory by it.
const KubernetesVersion = member.KubernetesVersion

// AssetsDir returns the directory holding the kube-apiserver and etcd binaries:
// $KUBEBUILDER_ASSETS when set, else the cache hack/envtest-binaries.sh fills.
// A missing binary is an error, never a reason to skip. The lookup lives in
// package member, which needs the etcd binary and cannot import this package.
func AssetsDir() (string, error) { return member.AssetsDir() }
