package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// failFirstMove is the real etcd client with one fault injected: the first
// MoveLeader fails, as one to a member that falls behind or restarts at that
// moment would. No member of a healthy cluster can be made to refuse a
// MoveLeader it would otherwise accept, so the fault sits at the client.
type failFirstMove struct {
	rollout.Etcd

	mu    sync.Mutex
	tried []uint64 // the target of each MoveLeader, in order
}

func (f *failFirstMove) ForwardLeadership(ctx context.Context, nodes []etcd.Node, from, to uint64) error {
	f.mu.Lock()
	f.tried = append(f.tried, to)
	first := len(f.tried) == 1
	f.mu.Unlock()
	if first {
		return fmt.Errorf("injected: member %x did not take leadership in time", to)
	}
	return f.Etcd.ForwardLeadership(ctx, nodes, from, to)
}

// MoveLeader fails for the first candidate while the leader's machine is
// replaced: the engine moves leadership to the next candidate and finishes.
// The engine runs in-process with the plugin's parts (without its change
// watches, which only shorten waits) because the fault is injected into its
// etcd client.
func TestMoveLeaderFallsBackToNextCandidate(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	mgmt := e.Sim.ManagementClient()
	ns, cluster := e.Sim.ClusterKey().Namespace, e.Sim.ClusterKey().Name

	kcp := kcpOf(t, e)
	creds, err := etcd.LoadCredentials(ctx, mgmt, e.Sim.ClusterKey(), kcp)
	if err != nil {
		t.Fatal(err)
	}
	wl, err := workload.New(ctx, mgmt, ns, cluster)
	if err != nil {
		t.Fatal(err)
	}
	dialer, err := etcd.NewPortForwardDialer(wl.Config)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := etcd.New(etcd.Config{Dialer: dialer, Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	flaky := &failFirstMove{Etcd: ec}
	var out bytes.Buffer
	reporter := progress.New("json", &out, io.Discard)
	engine := (&rollout.Engine{Workload: wl, Etcd: flaky,
		Reporter: reporter, Timeouts: rollout.DefaultTimeouts}).Plays(controlplane.New(mgmt, ns, cluster))

	// Replace the machine whose member leads, so leadership must move.
	var nodes []etcd.Node
	for _, n := range e.Sim.Nodes() {
		nodes = append(nodes, etcd.Node{Name: n.Name, IP: n.IP})
	}
	members, err := ec.Members(ctx, nodes)
	if err != nil {
		t.Fatal(err)
	}
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var leader string
	for _, mb := range members {
		for _, m := range machines {
			if mb.Leader && m.Status.NodeRef.Name == mb.Name {
				leader = m.Name
			}
		}
	}
	if leader == "" {
		t.Fatalf("no machine's member leads: %+v", members)
	}
	p, err := engine.Prepare(ctx, rollout.Request{Operation: "replace", Replace: leader, MaxSurge: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = engine.Run(ctx, p)
	reporter.Stop()
	mon.check(t)
	if err != nil {
		t.Fatalf("replace %s: %v\n%s", leader, err, out.String())
	}

	flaky.mu.Lock()
	tried := flaky.tried
	flaky.mu.Unlock()
	if len(tried) < 2 || tried[0] == tried[1] {
		t.Fatalf("MoveLeader targets %x: want a second, different candidate after the first failed", tried)
	}
	var fellBack bool
	for _, ev := range simtest.Events(t, out.String()) {
		if ev["action"] == "move-leader" && ev["phase"] == "failed" && strings.Contains(stringOf(ev["message"]), "trying the next candidate") {
			fellBack = true
		}
	}
	if !fellBack {
		t.Errorf("no event tells of the failed first candidate:\n%s", out.String())
	}
	for _, m := range mustMachines(t, e) {
		if m == leader {
			t.Errorf("machine %s still exists", leader)
		}
	}
	assertConverged(t, e, 3, from)
}
