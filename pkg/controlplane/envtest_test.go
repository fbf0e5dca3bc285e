package controlplane

import (
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cp-rollout/cp-rollout/internal/sim/manifests"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

// apiServer starts a real kube-apiserver with etcd and the CAPI CRDs the
// simulator's management cluster loads (the generic infrastructure ones
// included), stopped when t ends, and returns a client of it.
func apiServer(t *testing.T) client.WithWatch {
	t.Helper()
	assets, err := member.AssetsDir("kube-apiserver", "etcd")
	if err != nil {
		t.Fatal(err)
	}
	defs, err := manifests.ManagementCRDs()
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, CRDs: defs, Scheme: Scheme(), ControlPlaneStartTimeout: time.Minute}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
