package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// An etcd member stopped before the run: refused before anything changes,
// exit 3, naming the member.
func TestStoppedMemberRefused(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := machines[1].Status.NodeRef.Name
	if err := e.Sim.StopMember(node); err != nil {
		t.Fatal(err)
	}
	before := quietVersions(t, e)
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to)
	if r.Code != 3 || !strings.Contains(r.Stderr, node) {
		t.Fatalf("exit %d, stderr %q: want exit 3 naming member %s", r.Code, r.Stderr, node)
	}
	assertUnchanged(t, before, versions(t, e))
}

// Two runs at once: the second exits 5 naming the first.
func TestSecondRunLocked(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 3 * time.Second, DeleteDelay: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	first := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	first.Until(t, isAction("create", "done"))
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to)
	if r.Code != 5 || !strings.Contains(r.Stderr, "locked by") || !strings.Contains(r.Stderr, "pid-") {
		t.Errorf("second run: exit %d, stderr %q; want exit 5 naming the holder", r.Code, r.Stderr)
	}
	if code := first.Wait(); code != 0 {
		t.Fatalf("first run: exit %d", code)
	}
	assertConverged(t, e, 3, to)
}

// A replacement that never provisions: exit 4 naming the machine and what it
// waits for; the old machines are intact.
func TestReplacementNeverProvisions(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e.Sim.NeverProvisionNext()
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--provision-timeout", "15s")
	if r.Code != 4 || !strings.Contains(r.Stderr, "has no node yet; infrastructure not provisioned") {
		t.Fatalf("exit %d, stderr %q: want exit 4 naming the stuck machine", r.Code, r.Stderr)
	}
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	old := 0
	for _, m := range machines {
		if m.Spec.Version == from && m.DeletionTimestamp.IsZero() {
			old++
		}
	}
	if old != 3 {
		t.Errorf("%d intact old machines, want 3: %s", old, names(machines))
	}
	st := e.Plugin(t, ctx, "status", "demo", "-o", "wide")
	if !strings.Contains(st.Stdout, "infrastructure not provisioned") || !strings.Contains(st.Stdout, "paused by cp-rollout") {
		t.Errorf("status does not show the stuck machine and the paused operation:\n%s", st.Stdout)
	}

	// The provider recovers: the same command picks the stuck machine up and
	// finishes.
	mon := watchInvariants(t, e, 4, 2)
	if err := e.Sim.RecoverProvisioning(ctx); err != nil {
		t.Fatal(err)
	}
	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to); r.Code != 0 {
		t.Fatalf("re-run after the provider recovered: exit %d", r.Code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}

// The workload API server stops answering while the tool waits on it: the
// tool gives up after --health-timeout, exit 4, naming the workload cluster
// and the address it could not reach; once it answers again, a re-run
// finishes.
func TestWorkloadAPIServerUnreachable(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 3 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json", "--health-timeout", "30s")
	run.Until(t, isAction("await-join", "waiting"))
	thaw, err := e.Sim.FreezeWorkloadAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			_ = thaw()
		}
	})
	frozen := time.Now()
	// The tool hanging is the failure this looks for: bound the wait.
	hung := time.AfterFunc(3*time.Minute, run.Kill)
	code := run.Wait()
	hung.Stop()
	took := time.Since(frozen)
	if err := thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	host := e.Sim.WorkloadConfig().Host
	if code != 4 || !strings.Contains(run.Stderr(), "demo") || !strings.Contains(run.Stderr(), strings.TrimPrefix(host, "https://")) {
		t.Fatalf("exit %d after %s, stderr %q: want 4 naming the workload cluster and %s", code, took.Round(time.Second), run.Stderr(), host)
	}
	if took > 2*time.Minute {
		t.Errorf("gave up after %s with --health-timeout 30s", took.Round(time.Second))
	}
	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to); r.Code != 0 {
		t.Fatalf("re-run once the workload API server answers: exit %d", r.Code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}

// Someone else takes the run's Lease mid-run: the tool stops at once, exit 5,
// leaving the KCP paused with its record; once the Lease is free, a re-run
// finishes.
func TestLeaseLostMidRun(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 4 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	run.Until(t, isAction("await-join", "waiting"))
	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: runlock.LeaseName("demo")}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := e.Sim.ManagementClient().Get(ctx, key, lease); err != nil {
			return err
		}
		lease.Spec.HolderIdentity = ptr.To("someone-else")
		return e.Sim.ManagementClient().Update(ctx, lease)
	}); err != nil {
		t.Fatal(err)
	}
	taken := time.Now()
	code := run.Wait()
	if code != 5 || !strings.Contains(run.Stderr(), "lost the lock") {
		t.Fatalf("exit %d, stderr %q: want 5 saying the lock was lost", code, run.Stderr())
	}
	if took := time.Since(taken); took > 2*runlock.LeaseDuration/3+5*time.Second {
		t.Errorf("stopped %s after losing the lock", took.Round(time.Second))
	}
	kcp := kcpOf(t, e)
	if _, ok := kcp.Annotations[record.Annotation]; !ok {
		t.Errorf("the KCP lost its operation record: %v", kcp.Annotations)
	}
	breakLock(t, e)
	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to); r.Code != 0 {
		t.Fatalf("re-run: exit %d", r.Code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}

// The management API server restarts while the tool waits: it reconnects and
// finishes.
//
// Not parallel, and `make test` runs it alone after everything else
// (E2E_ALONE): the tool keeps its Lease only while the API server answers
// within the renewal deadline, and a restart beside other simulators on two
// busy cores can outlast it (the run then rightly stops, exit 5, "lost the
// lock"). Alone, the restart takes a few seconds, as on a real control plane.
func TestManagementAPIServerRestart(t *testing.T) {
	// One machine to replace is enough to have a run in flight, and this test
	// runs with nothing beside it: every second of it is a second of make test.
	e := simtest.StartOwn(t, sim.Options{Replicas: 1, Capacity: 2, Version: from, ProvisionDelay: 4 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 2, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	run.Until(t, isAction("await-join", "waiting"))
	if err := e.Sim.RestartManagementAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if code := run.Wait(); code != 0 {
		t.Fatalf("upgrade across an API server restart: exit %d", code)
	}
	mon.check(t)
	assertConverged(t, e, 1, to)
}

// An etcd member of another machine, not the leader's, stops once the tool
// has deleted a machine, while that machine drains and reaches the
// pre-terminate hook the tool serves, and comes back once the run reports
// waiting for it (at most 50 s later, within the recovery grace): the run
// waits for it (a member that was healthy gets the recovery grace) and
// finishes, with quorum kept throughout.
func TestMemberRestartedWhileServingHook(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	victim := stringOf(run.Until(t, isAction("delete", "done"))["machine"])
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Not the leader's: stopping it would start an election that the
	// victim's member, still there until its hook is served, may win; the
	// monitor would then see the victim deleting while its member leads,
	// which is the fault's doing, not the tool's.
	members, err := mon.etcd.Members(ctx, mon.memberNodes())
	if err != nil {
		t.Fatal(err)
	}
	leader := ""
	for _, mb := range members {
		if mb.Leader {
			leader = mb.Name
		}
	}
	var node string
	for _, m := range machines {
		if m.Name != victim && m.Spec.Version == from && m.DeletionTimestamp.IsZero() && m.Status.NodeRef.Name != leader {
			node = m.Status.NodeRef.Name
			break
		}
	}
	if node == "" {
		t.Fatalf("no other old machine beside %s whose member does not lead (%s): %s", victim, leader, names(machines))
	}
	if err := e.Sim.StopMember(node); err != nil {
		t.Fatal(err)
	}
	restart := time.After(50 * time.Second)
	restarted := false
	var waitedFor []string
	for events := run.Events; events != nil; {
		select {
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if msg := stringOf(ev["message"]); ev["phase"] == "waiting" && strings.Contains(msg, node) {
				waitedFor = append(waitedFor, fmt.Sprintf("%v: %s", ev["action"], msg))
				if !restarted {
					restart = time.After(0)
				}
			}
		case <-restart:
			if !restarted {
				restarted = true
				if err := e.Sim.RestartMember(ctx, node); err != nil {
					t.Fatal(err)
				}
			}
			restart = nil
		}
	}
	if !restarted {
		t.Fatal("the run ended before the member was restarted")
	}
	if code := run.Wait(); code != 0 {
		t.Fatalf("exit %d after member %s stopped while %s was deleted; stderr:\n%s", code, node, victim, simtest.Tail(run.Stderr(), 15))
	}
	if len(waitedFor) == 0 {
		t.Errorf("the run never reported waiting for the stopped member on %s", node)
	}
	t.Logf("waited: %s", strings.Join(waitedFor, " | "))
	mon.check(t)
	assertConverged(t, e, 3, to)
}
