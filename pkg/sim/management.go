package sim

import (
	"context"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"sigs.k8s.io/cluster-api/util/test/builder"

	"github.com/cp-rollout/cp-rollout/pkg/sim/crds"
)

// Management is a management cluster (a real kube-apiserver and etcd with
// Cluster API's CRDs) that several simulators share, as one management
// cluster hosts many clusters. Each simulator on it keeps its Cluster in a
// namespace of its own and runs its own controllers watching that namespace,
// as a Cluster API installation started with --namespace does; it still has
// a workload cluster, etcd members and nodes of its own. Sharing saves an API
// server's start-up (most of a simulator's) and its idle load per cluster.
type Management struct {
	env            *envtest.Environment
	config         *rest.Config
	binDir         string
	threadsRelease chan struct{}
}

// StartManagement starts a management cluster for simulators to share; stop
// it with Stop once they have all stopped. assetsDir holds kube-apiserver and
// etcd; empty means AssetsDir().
func StartManagement(ctx context.Context, assetsDir string) (_ *Management, err error) {
	if assetsDir == "" {
		if assetsDir, err = AssetsDir(); err != nil {
			return nil, err
		}
	}
	m := &Management{threadsRelease: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = m.Stop()
		}
	}()
	if m.binDir, err = os.MkdirTemp("", "cp-rollout-sim-bin-"); err != nil {
		return nil, err
	}
	apiServerBin, etcdBin, err := lifetimeBinaries(assetsDir, m.binDir)
	if err != nil {
		return nil, err
	}
	if m.env, err = managementEnvironment(apiServerBin, etcdBin, assetsDir); err != nil {
		return nil, err
	}
	var startErr error
	onOwnThread(m.threadsRelease, func() { m.config, startErr = m.env.Start() })
	if startErr != nil {
		m.env = nil
		return nil, fmt.Errorf("starting the management cluster: %w", startErr)
	}
	return m, ctx.Err()
}

// Stop stops the management cluster. It is safe to call more than once.
func (m *Management) Stop() error {
	var err error
	if m.env != nil {
		err = m.env.Stop()
		m.env = nil
	}
	if m.threadsRelease != nil {
		close(m.threadsRelease)
		m.threadsRelease = nil
	}
	if m.binDir != "" {
		_ = os.RemoveAll(m.binDir)
		m.binDir = ""
	}
	return err
}

// managementEnvironment describes a management cluster: its API server, its
// etcd and Cluster API's CRDs with the generic infrastructure provider's.
func managementEnvironment(apiServerBin, etcdBin, assetsDir string) (*envtest.Environment, error) {
	crdList, err := crds.ClusterAPI()
	if err != nil {
		return nil, err
	}
	crdList = append(crdList,
		builder.GenericInfrastructureClusterCRD.DeepCopy(),
		builder.GenericInfrastructureMachineCRD.DeepCopy(),
		builder.GenericInfrastructureMachineTemplateCRD.DeepCopy(),
	)
	return &envtest.Environment{
		ControlPlane:          envtest.ControlPlane{APIServer: &envtest.APIServer{Path: apiServerBin}, Etcd: &envtest.Etcd{Path: etcdBin}},
		BinaryAssetsDirectory: assetsDir,
		Scheme:                Scheme(),
		CRDs:                  crdList,
		ErrorIfCRDPathMissing: true,
		// A loaded two-core machine can take longer than envtest's 20 s
		// default to start or stop a kube-apiserver.
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}, nil
}
