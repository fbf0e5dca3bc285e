package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// A learner a failed join left behind (added, never started, owned by no
// machine) would make every membership change wait for its promotion: the
// upgrade removes it as a step of its own first, then rolls every machine,
// and the cluster ends with one named voter per machine.
func TestStaleLearnerRemoved(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Held by `pause` first: KCP's own reconcileEtcdMembers would otherwise
	// remove the stray learner itself, as soon as it sees it, and the run
	// would race it. The upgrade takes the pause over.
	if r := e.Plugin(t, ctx, "pause", "demo", "--reason", "a stray learner to clean up"); r.Code != 0 {
		t.Fatalf("pause: exit %d\n%s", r.Code, r.Stderr)
	}
	id, err := e.Sim.AddStrayLearner(ctx, "https://127.0.0.250:2380")
	if err != nil {
		t.Fatal(err)
	}
	stray := fmt.Sprintf("%x", id)

	st := e.Plugin(t, ctx, "status", "demo", "-o", "json")
	if st.Code != 0 || !strings.Contains(st.Stdout, `"remove-stale-member"`) {
		t.Errorf("status before the run: exit %d, want its next step to be remove-stale-member:\n%s", st.Code, simtest.Tail(st.Stdout, 5))
	}
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "-o", "json")
	if r.Code != 0 {
		t.Fatalf("upgrade with a stale learner: exit %d", r.Code)
	}
	var order []string
	for _, ev := range simtest.Events(t, r.Stdout) {
		if ev["phase"] == "done" && (ev["action"] == "remove-stale-member" || ev["action"] == "create") {
			order = append(order, ev["action"].(string))
		}
	}
	if len(order) == 0 || order[0] != "remove-stale-member" {
		t.Errorf("done steps %v: want the stale learner removed before the first machine is created", order)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
	members, err := e.Sim.EtcdMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if fmt.Sprintf("%x", m.ID) == stray || m.Name == "" || m.IsLearner {
			t.Errorf("after the run, member %x (%q, learner %v) is still there", m.ID, m.Name, m.IsLearner)
		}
	}
	if len(members) != 3 {
		t.Errorf("%d members after the run, want 3", len(members))
	}
}
