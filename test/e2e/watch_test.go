package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// status -w -o json follows an upgrade as it runs: one JSON object per
// change, among them several sets of machines as replacements come and old
// machines go, with this tool named as the one acting while it runs; Ctrl-C
// ends the watch with exit 0. Then jsonpath and custom-columns read the
// status the run left.
func TestStatusWatchFollowsAnUpgrade(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	watch := e.StartPlugin(t, "status", "demo", "-w", "--interval", "500ms", "-o", "json")
	if first := watch.Until(t, func(map[string]any) bool { return true }); first["cluster"] != "demo" {
		t.Fatalf("first object %v: want demo's status", first)
	}
	// Read the watch's objects as they come, so that it never waits on a
	// full pipe.
	var seen []map[string]any
	done := make(chan struct{})
	go func() {
		for st := range watch.Events {
			seen = append(seen, st)
		}
		close(done)
	}()

	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to); r.Code != 0 {
		t.Fatalf("upgrade: exit %d", r.Code)
	}
	time.Sleep(2 * time.Second) // a read or two after the hand-back
	if code := watch.Interrupt(); code != 0 {
		t.Errorf("status -w after SIGINT: exit %d, want 0; stderr:\n%s", code, watch.Stderr())
	}
	<-done

	sets, acting := map[string]bool{}, map[string]bool{}
	for _, st := range seen {
		var names []string
		for _, m := range st["machines"].([]any) {
			names = append(names, m.(map[string]any)["name"].(string))
		}
		slices.Sort(names)
		sets[strings.Join(names, ",")] = true
		if a, ok := st["acting"].(map[string]any); ok {
			acting[a["who"].(string)] = true
		}
	}
	t.Logf("%d objects after the first, %d machine sets, acting %v", len(seen), len(sets), acting)
	if len(sets) < 2 {
		t.Errorf("the watch saw %d set(s) of machines, want the machines to change during the upgrade: %v", len(sets), sets)
	}
	if !acting["cp-rollout"] {
		t.Errorf("no object named cp-rollout as acting during its run: %v", acting)
	}

	// After the run, kubectl's printers over the same status: every machine
	// at the new version, each a line of custom-columns, and nobody acting.
	r := e.Plugin(t, ctx, "status", "demo", "-o", "jsonpath={.acting.who} {.machines[*].version}")
	if want := "nobody " + strings.TrimSpace(strings.Repeat(to+" ", 3)); r.Code != 0 || r.Stdout != want {
		t.Errorf("status -o jsonpath: exit %d, %q, want %q", r.Code, r.Stdout, want)
	}
	r = e.Plugin(t, ctx, "status", "demo", "-o", "custom-columns=NAME:.name,VERSION:.version", "--no-headers", "--sort-by", ".created")
	if lines := strings.Split(strings.TrimSpace(r.Stdout), "\n"); r.Code != 0 || len(lines) != 3 || !strings.HasSuffix(lines[0], "  "+to) {
		t.Errorf("status -o custom-columns: exit %d\n%s", r.Code, r.Stdout)
	}
}
