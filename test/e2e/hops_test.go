package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// A control plane two minors behind: without --via the skip is refused,
// naming the minor to pass through; plan lists both hops up front; the
// upgrade is one complete rollout per hop, each handed back and agreed by
// KCP before the next (even where the run would not wait for KCP at its
// end), with every event placed in its hop.
func TestUpgradeThroughTwoMinors(t *testing.T) {
	t.Parallel()
	const older = "v1.34.3"
	// One replica: the two-hop upgrade of three, killed at step boundaries,
	// is the kill matrix's and TestClusterClassUpgradeThroughTwoMinors'.
	e := simtest.Start(t, sim.Options{Replicas: 1, Version: older, ProvisionDelay: time.Second, DeleteDelay: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to); r.Code != 2 || !strings.Contains(r.Stderr, "pass through a v1.35.x first (--via") {
		t.Fatalf("upgrade two minors up without --via: exit %d, want 2 naming the minor to pass through:\n%s", r.Code, r.Stderr)
	}
	r := e.Plugin(t, ctx, "plan", "demo", "--version", to, "--via", from, "-o", "json")
	var plan struct {
		Target string
		Steps  []struct {
			Action     string
			Hop, Hops  int
			HopVersion string
		}
	}
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &plan) != nil {
		t.Fatalf("plan --via: exit %d\n%s", r.Code, r.Stdout)
	}
	perHop := map[string]int{}
	for _, s := range plan.Steps {
		if s.Hops != 2 {
			t.Errorf("planned step %+v: want it placed in one of 2 hops", s)
		}
		perHop[fmt.Sprintf("%d %s %s", s.Hop, s.HopVersion, s.Action)]++
	}
	for _, want := range []string{"1 " + from + " create", "1 " + from + " delete", "2 " + to + " create", "2 " + to + " delete"} {
		if perHop[want] != 1 {
			t.Errorf("plan %s: %v; want a creation and a deletion in each hop", plan.Target, perHop)
			break
		}
	}

	mon := watchInvariants(t, e, 2, 1)
	r = e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--via", from, "-o", "json")
	mon.check(t)
	if r.Code != 0 {
		t.Fatalf("upgrade --via: exit %d", r.Code)
	}
	var order []string // each hop's hand-back and KCP's agreement, in order
	for _, ev := range simtest.Events(t, r.Stdout) {
		if ev["action"] == "summary" {
			continue
		}
		if ev["hops"] != float64(2) {
			t.Fatalf("event %v: want hop and hops on every event", ev)
		}
		if (ev["action"] == "handback" || ev["action"] == "await-kcp") && ev["phase"] == "done" {
			order = append(order, fmt.Sprintf("%v %v %v", ev["hop"], ev["hopVersion"], ev["action"]))
		}
	}
	want := "1 " + from + " handback, 1 " + from + " await-kcp, 2 " + to + " handback"
	if got := strings.Join(order, ", "); got != want {
		t.Errorf("hand-backs %s, want %s", got, want)
	}
	assertConverged(t, e, 1, to)
	assertKCPIdle(t, e)
}
