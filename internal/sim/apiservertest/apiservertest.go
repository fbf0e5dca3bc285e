// Package apiservertest starts a bare, real kube-apiserver and etcd (envtest,
// with the binaries the simulator uses) for a package's tests that need an
// API server's own behaviour — validation, evictions, field selectors — and
// no cluster around it.
package apiservertest

import (
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cp-rollout/cp-rollout/internal/sim/manifests"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

// Start runs an API server until t ends and returns its admin configuration.
func Start(t testing.TB) *rest.Config {
	t.Helper()
	return start(t, nil)
}

// StartCAPI is Start with the CRDs of the simulator's management cluster
// (manifests.ManagementCRDs: Cluster API's and the generic infrastructure
// provider's) installed, and nothing else: no webhooks, no controllers. What
// a test writes there stays as written (sim.CreateInertClusters fills in what
// the webhooks would), so a test or benchmark of code that reads a
// management cluster pays only for the API server.
func StartCAPI(t testing.TB) *rest.Config {
	t.Helper()
	crds, err := manifests.ManagementCRDs()
	if err != nil {
		t.Fatal(err)
	}
	return start(t, crds)
}

func start(t testing.TB, crds []*apiextensionsv1.CustomResourceDefinition) *rest.Config {
	t.Helper()
	assets, err := member.AssetsDir("kube-apiserver", "etcd")
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDs:                  crds,
		// A loaded two-core machine can take longer than envtest's 20 s
		// default to start or stop an API server.
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	return cfg
}
