package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/sim"
)

const (
	from = "v1.35.2"
	to   = "v1.36.3"
)

// events parses the JSON Lines progress of `-o json`.
func events(t *testing.T, out string) []map[string]any {
	t.Helper()
	var evs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("not a JSON event: %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestUpgradeThreeReplicasSurgeOne(t *testing.T) {
	e := startSim(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 2 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.plugin(t, ctx, "upgrade", "demo", "--version", to, "-o", "json")
	mon.check(t)
	if r.code != 0 {
		t.Fatalf("upgrade exit %d", r.code)
	}
	evs := events(t, r.stdout)
	for _, ev := range evs {
		for _, k := range []string{"time", "cluster", "namespace", "action", "phase"} {
			if _, ok := ev[k]; !ok {
				t.Fatalf("event lacks %q: %v", k, ev)
			}
		}
	}
	// The summary closes the run, after the hand-back it accounts for.
	if last, handback := evs[len(evs)-1], evs[len(evs)-2]; last["action"] != "summary" || handback["action"] != "handback" || handback["phase"] != "done" {
		t.Errorf("last events %v, %v; want the hand-back done, then the summary", handback, last)
	}
	assertConverged(t, e, 3, to)
	assertKCPIdle(t, e, time.Minute)

	// Re-running the finished upgrade has nothing to do.
	if r := e.plugin(t, ctx, "upgrade", "demo", "--version", to); r.code != 0 || !strings.Contains(r.stderr, "nothing to do") {
		t.Errorf("re-run: exit %d, want 0 with \"nothing to do\"", r.code)
	}
}

func TestUpgradeThreeReplicasSurgeZero(t *testing.T) {
	e := startSim(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 2 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 3, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.plugin(t, ctx, "upgrade", "demo", "--version", to, "--max-surge", "0")
	mon.check(t)
	if r.code != 0 {
		t.Fatalf("upgrade exit %d", r.code)
	}
	assertConverged(t, e, 3, to)
}

// The scenario of CAPI issue 2915: one replica, room for one more machine.
func TestUpgradeOneReplicaCapacityTwo(t *testing.T) {
	e := startSim(t, sim.Options{Replicas: 1, Version: from, Capacity: 2, ProvisionDelay: 2 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 2, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.plugin(t, ctx, "upgrade", "demo", "--version", to)
	mon.check(t)
	if r.code != 0 {
		t.Fatalf("upgrade exit %d", r.code)
	}
	assertConverged(t, e, 1, to)
}

// An upgrade started while a control-plane machine is deleting finishes that
// deletion first, and never counts the deleting machine as one to replace.
func TestUpgradeWaitsForDeletingMachine(t *testing.T) {
	e := startSim(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 2 * time.Second, DeleteDelay: 3 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	machines, err := e.sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victim := machines[0]
	// KCP (running) serves the deletion and then scales back up to 3 at the old version.
	if err := e.sim.ManagementClient().Delete(ctx, &victim); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, func() bool {
		m := &clusterv1.Machine{}
		err := e.sim.ManagementClient().Get(ctx, client.ObjectKeyFromObject(&victim), m)
		return err == nil && !m.DeletionTimestamp.IsZero()
	})
	mon := watchInvariants(t, e, 4, 2)
	r := e.plugin(t, ctx, "upgrade", "demo", "--version", to, "-o", "json")
	mon.check(t)
	if r.code != 0 {
		t.Fatalf("upgrade exit %d", r.code)
	}
	evs := events(t, r.stdout)
	var firstAct string
	for _, ev := range evs {
		if a := ev["action"].(string); a == "create" || a == "delete" || a == "await-deletion" {
			firstAct = a + " " + stringOf(ev["machine"])
			break
		}
	}
	if firstAct != "await-deletion "+victim.Name {
		t.Errorf("first step %q, want waiting for the deletion of %s", firstAct, victim.Name)
	}
	assertConverged(t, e, 3, to)
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}

func waitFor(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal("condition not met in time")
		case <-time.After(50 * time.Millisecond):
		}
	}
}
