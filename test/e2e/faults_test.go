package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/sim"
)

// An etcd member stopped before the run: refused before anything changes,
// exit 3, naming the member.
func TestStoppedMemberRefused(t *testing.T) {
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	machines, err := e.sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := machines[1].Status.NodeRef.Name
	if err := e.sim.StopMember(node); err != nil {
		t.Fatal(err)
	}
	before := quietVersions(t, e)
	r := e.plugin(t, ctx, "upgrade", "demo", "--version", to)
	if r.code != 3 || !strings.Contains(r.stderr, node) {
		t.Fatalf("exit %d, stderr %q: want exit 3 naming member %s", r.code, r.stderr, node)
	}
	assertUnchanged(t, before, versions(t, e))
}

// Two runs at once: the second exits 5 naming the first.
func TestSecondRunLocked(t *testing.T) {
	e := startSim(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 3 * time.Second, DeleteDelay: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	first := e.start(t, "upgrade", "demo", "--version", to, "-o", "json")
	first.until(t, isAction("create", "done"))
	r := e.plugin(t, ctx, "upgrade", "demo", "--version", to)
	if r.code != 5 || !strings.Contains(r.stderr, "locked by") || !strings.Contains(r.stderr, "pid-") {
		t.Errorf("second run: exit %d, stderr %q; want exit 5 naming the holder", r.code, r.stderr)
	}
	if code := first.wait(); code != 0 {
		t.Fatalf("first run: exit %d", code)
	}
	assertConverged(t, e, 3, to)
}

// A replacement that never provisions: exit 4 naming the machine and what it
// waits for; the old machines are intact.
func TestReplacementNeverProvisions(t *testing.T) {
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e.sim.NeverProvisionNext()
	r := e.plugin(t, ctx, "upgrade", "demo", "--version", to, "--provision-timeout", "15s")
	if r.code != 4 || !strings.Contains(r.stderr, "has no node yet; infrastructure not provisioned") {
		t.Fatalf("exit %d, stderr %q: want exit 4 naming the stuck machine", r.code, r.stderr)
	}
	machines, err := e.sim.Machines(ctx)
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
	st := e.plugin(t, ctx, "status", "demo", "-o", "wide")
	if !strings.Contains(st.stdout, "infrastructure not provisioned") || !strings.Contains(st.stdout, "paused by cp-rollout") {
		t.Errorf("status does not show the stuck machine and the paused operation:\n%s", st.stdout)
	}
}

// The management API server restarts while the tool waits: it reconnects and
// finishes.
func TestManagementAPIServerRestart(t *testing.T) {
	e := startSim(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 4 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := e.start(t, "upgrade", "demo", "--version", to, "-o", "json")
	run.until(t, isAction("await-join", "waiting"))
	if err := e.sim.RestartManagementAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if code := run.wait(); code != 0 {
		t.Fatalf("upgrade across an API server restart: exit %d", code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}
