package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// The tool killed with SIGKILL at successive points of an upgrade — after the
// k-th progress event of each run, for growing k — and simply run again: the
// control plane never breaks an invariant, and the last run finishes the job.
// A killed run cannot release its lock, so the next run waits for it to
// expire (exit 5 until then), as a runbook retrying the command would.
func TestKilledUpgradeResumes(t *testing.T) {
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	kills := 0
	for k := 3; ; k += 4 {
		run := e.start(t, "upgrade", "demo", "--version", to, "-o", "json")
		n, finished := 0, false
		for ev := range run.events {
			n++
			if ev["action"] == "summary" {
				finished = true
			}
			if n == k && !finished {
				_ = run.cmd.Process.Signal(syscall.SIGKILL)
				kills++
				break
			}
		}
		code := run.wait()
		if finished || code == 0 {
			break
		}
		switch code {
		case -1, 137: // killed
		case 5: // the previous run's lock has not expired yet
			time.Sleep(2 * time.Second)
			k -= 4
		default:
			t.Fatalf("run after %d kills: exit %d", kills, code)
		}
		if ctx.Err() != nil {
			t.Fatal("did not converge in time")
		}
	}
	t.Logf("converged after %d kills", kills)
	if kills < 3 {
		t.Errorf("only %d kills: the matrix did not interrupt the upgrade enough", kills)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}
