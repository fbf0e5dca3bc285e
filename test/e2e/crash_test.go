package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// fullKillMatrix runs every operation of the matrix and kills at every step
// boundary; without it (`make test-faults`) four operations are killed at
// every fourth boundary. `make test-faults KILL_MATRIX=full` sets it.
var fullKillMatrix = os.Getenv("CP_ROLLOUT_FULL_KILL_MATRIX") != ""

// The kill matrix: each operation is run, killed with SIGKILL right after a
// progress event not seen before (so at every step boundary and inside every
// wait, one after another), and run again, until a run finishes by itself.
// Throughout, the invariant monitor watches; at the end the control plane has
// converged with no orphan left.
func TestKillMatrix(t *testing.T) {
	t.Parallel()
	for _, sc := range []struct {
		name       string
		opts       sim.Options
		args       func(t *testing.T, e *env) []string
		maxMachine int
		minHealthy int
		replicas   int
		version    string
		// from, when set, is the version the simulator starts at.
		from string
		// extended operations run only in the full matrix.
		extended bool
	}{
		{name: "upgrade-3-surge-1", opts: sim.Options{Replicas: 3},
			args: fixed("upgrade", "demo", "--version", to), maxMachine: 4, minHealthy: 2, replicas: 3, version: to},
		{name: "upgrade-3-via", opts: sim.Options{Replicas: 3}, from: "v1.34.3",
			args: fixed("upgrade", "demo", "--version", to, "--via", from), maxMachine: 4, minHealthy: 2, replicas: 3, version: to},
		{name: "upgrade-3-surge-0", opts: sim.Options{Replicas: 3},
			args: fixed("upgrade", "demo", "--version", to, "--max-surge", "0"), maxMachine: 3, minHealthy: 2, replicas: 3, version: to, extended: true},
		{name: "upgrade-1", opts: sim.Options{Replicas: 1, Capacity: 2},
			args: fixed("upgrade", "demo", "--version", to), maxMachine: 2, minHealthy: 1, replicas: 1, version: to, extended: true},
		{name: "scale-3-to-5", opts: sim.Options{Replicas: 3},
			args: fixed("scale", "demo", "--replicas", "5"), maxMachine: 5, minHealthy: 2, replicas: 5, version: from, extended: true},
		{name: "scale-5-to-3", opts: sim.Options{Replicas: 5},
			args: fixed("scale", "demo", "--replicas", "3"), maxMachine: 5, minHealthy: 3, replicas: 3, version: from},
		{name: "replace", opts: sim.Options{Replicas: 3},
			args: func(t *testing.T, e *env) []string {
				return []string{"replace", "demo", mustMachines(t, e)[0]}
			}, maxMachine: 4, minHealthy: 2, replicas: 3, version: from},
	} {
		t.Run(sc.name, func(t *testing.T) {
			if sc.extended && !fullKillMatrix {
				t.Skip("in the full matrix only: make test-faults")
			}
			t.Parallel()
			opts := sc.opts
			opts.Version, opts.ProvisionDelay, opts.DeleteDelay = from, time.Second, 500*time.Millisecond
			if sc.from != "" {
				opts.Version = sc.from
			}
			e := simtest.Start(t, opts)
			mon := watchInvariants(t, e, sc.maxMachine, sc.minHealthy)
			args := append(sc.args(t, e), "-o", "json")
			kills := killAtEveryStep(t, e, args)
			mon.check(t)
			t.Logf("%s: converged after %d kills", sc.name, kills)
			if kills < 2 {
				t.Errorf("only %d kills: the matrix did not interrupt the operation", kills)
			}
			assertConverged(t, e, sc.replicas, sc.version)
		})
	}
}

func fixed(args ...string) func(*testing.T, *env) []string {
	return func(*testing.T, *env) []string { return args }
}

// digits are masked when events are compared: pids, counts and addresses
// differ from run to run, the step does not (machine names keep their
// letters, so each machine's steps stay apart).
var digits = regexp.MustCompile(`[0-9]+`)

// killAtEveryStep runs args until one run finishes by itself, killing each
// run right after the first event that no earlier run reported (with the
// default stride, after every fourth such event). It returns the number of
// kills.
func killAtEveryStep(t *testing.T, e *env, args []string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	stride := 4
	if fullKillMatrix {
		stride = 1
	}
	seen := map[string]bool{}
	kills := 0
	for ctx.Err() == nil {
		run := e.StartPlugin(t, args...)
		fresh, killed := 0, ""
		for ev := range run.Events {
			// The hop keeps the steps of an upgrade's hops apart, whose
			// messages differ in their versions' digits alone.
			key := fmt.Sprint(ev["hop"]) + "|" + digits.ReplaceAllString(stringOf(ev["action"])+"|"+stringOf(ev["phase"])+"|"+stringOf(ev["machine"])+"|"+stringOf(ev["message"]), "#")
			if seen[key] {
				continue
			}
			seen[key] = true
			if fresh++; fresh == stride {
				killed = stringOf(ev["action"]) + " " + stringOf(ev["phase"]) + " " + stringOf(ev["machine"])
				run.Kill()
				break
			}
		}
		switch code := run.Wait(); {
		case code == 0: // finished, perhaps just before its kill
			return kills
		case code != -1 || killed == "": // ended by itself, and not well
			t.Fatalf("run after %d kills: exit %d\n%s", kills, code, run.Stderr())
		}
		kills++
		t.Logf("kill %d after %q", kills, killed)
		breakLock(t, e)
	}
	t.Fatalf("did not converge within 20 minutes and %d kills", kills)
	return kills
}
