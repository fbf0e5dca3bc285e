package cli

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

func TestMain(m *testing.M) { simtest.Main(m) }

// TestWorkloadAndEtcdWritesAreFenced: the lock's fence covers every side a
// run writes to, as connect wires them: the workload cluster's API server
// (cordon, uncordon, kubeadm-config) and etcd (leadership moves, member
// removal), not only the management cluster. Once the lock is not held
// (here: released, after which another run may take it at once), a
// workload write and an etcd request fail with exit 5 before they leave the
// process.
func TestWorkloadAndEtcdWritesAreFenced(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	key := e.Sim.ClusterKey()
	c := &connection{Management: (*restConfigOf)(e.Sim.ManagementConfig()), Cluster: key.Name, Namespace: key.Namespace}
	use := engineUse{}
	m, err := c.connectManagement(ctx, use)
	if err != nil {
		t.Fatal(err)
	}
	wl, members, closeEtcd, err := c.connectWorkload(ctx, m, use)
	if err != nil {
		t.Fatal(err)
	}
	defer closeEtcd()
	var nodes []etcd.Node
	var node string
	for _, n := range e.Sim.Nodes() {
		nodes, node = append(nodes, etcd.Node{Name: n.Name, IP: n.IP}), n.Name
	}
	// The workload write the test makes is an uncordon: a node cordoned
	// behind the tool's back shows whether it went through.
	cordon := func() {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"unschedulable":true}}`))
		if err := e.Sim.WorkloadClient().Patch(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, patch); err != nil {
			t.Fatal(err)
		}
	}
	cordoned := func() bool {
		n := &corev1.Node{}
		if err := e.Sim.WorkloadClient().Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			t.Fatal(err)
		}
		return n.Spec.Unschedulable
	}

	lock, err := m.cp.Acquire(ctx, "ops@bastion/pid-7-fence", nil)
	if err != nil {
		t.Fatal(err)
	}
	cordon()
	if err := wl.Uncordon(ctx, node); err != nil || cordoned() {
		t.Fatalf("uncordon under a held lock: %v (still cordoned: %v)", err, cordoned())
	}
	if _, err := members.Members(ctx, nodes); err != nil {
		t.Fatalf("etcd under a held lock: %v", err)
	}

	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cordon()
	if err := wl.Uncordon(ctx, node); exitcode.Of(err) != exitcode.Locked {
		t.Errorf("uncordon after the lock was released: %v, want refused with exit 5", err)
	}
	if !cordoned() {
		t.Error("the uncordon reached the workload cluster after the lock was released")
	}
	if err := members.MoveLeader(ctx, nodes, 1); exitcode.Of(err) != exitcode.Locked {
		t.Errorf("moving etcd leadership after the lock was released: %v, want refused with exit 5", err)
	}
	if _, err := members.Members(ctx, nodes); exitcode.Of(err) != exitcode.Locked {
		t.Errorf("etcd request after the lock was released: %v, want refused with exit 5", err)
	}
}
