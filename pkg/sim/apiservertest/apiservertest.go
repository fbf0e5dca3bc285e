// Package apiservertest starts a bare, real kube-apiserver and etcd (envtest,
// with the binaries the simulator uses) for a package's tests that need an
// API server's own behaviour — validation, evictions, field selectors — and
// no cluster around it.
package apiservertest

import (
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cp-rollout/cp-rollout/pkg/sim/member"
)

// Start runs an API server until t ends and returns its admin configuration.
func Start(t testing.TB) *rest.Config {
	t.Helper()
	assets, err := member.AssetsDir("kube-apiserver", "etcd")
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ControlPlaneStartTimeout: time.Minute}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return cfg
}
