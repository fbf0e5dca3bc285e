// Package e2e drives the real plugin binary, through the real kubectl, against
// the simulator: real API servers, real Machine and KCP controllers, real etcd
// members; only the machines are simulated.
package e2e

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

func TestMain(m *testing.M) { simtest.Main(m) }

// env is a simulator the scenarios run the plugin against.
type env = simtest.Env

// breakLock deletes the Lease of a run the test killed: its holder is known
// to be dead, so the next run need not wait for the Lease to expire.
func breakLock(t *testing.T, e *env) {
	t.Helper()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: e.Sim.ClusterKey().Namespace, Name: runlock.LeaseName("demo")}}
	if err := e.Sim.ManagementClient().Delete(context.Background(), lease); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
}

// mustMachines names the simulator's control-plane machines.
func mustMachines(t *testing.T, e *env) []string {
	t.Helper()
	machines, err := e.Sim.Machines(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range machines {
		out = append(out, m.Name)
	}
	return out
}

// etcdCAKey is the simulated cluster's etcd CA Secret, <cluster>-etcd.
func etcdCAKey(e *env) client.ObjectKey {
	return client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: secret.Name(e.Sim.ClusterKey().Name, secret.EtcdCA)}
}
