package cli

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// scriptedReads is a status -w reader that returns views (or errors) in
// turn, then ends the watch as Ctrl-C would: it cancels the context and
// returns the error a read cut short returns.
func scriptedReads(cancel context.CancelFunc, reads ...any) func(context.Context) (*statusView, error) {
	return func(ctx context.Context) (*statusView, error) {
		if len(reads) == 0 {
			cancel()
			return nil, ctx.Err()
		}
		next := reads[0]
		reads = reads[1:]
		if err, ok := next.(error); ok {
			return nil, err
		}
		return next.(*statusView), nil
	}
}

// watchStatus is a cluster's status as status -w reads it at renewed: the
// machines given, the lock renewed then.
func watchStatus(renewed time.Time, machines ...string) *statusView {
	st := &rollout.Status{Cluster: "demo", Namespace: "default", EtcdManaged: true,
		ControlPlane: rollout.ControlPlaneStatus{Name: "demo-cp", Version: "v1.36.3", Replicas: 3, Paused: true, PausedByUs: true},
		Lock:         &rollout.LockStatus{Holder: "alice@ops/pid-1", RenewTime: &renewed, Live: true},
		Acting:       rollout.ActingStatus{Who: "cp-rollout", What: "upgrade by alice@ops/pid-1"}}
	for _, m := range machines {
		st.Machines = append(st.Machines, rollout.MachineStatus{Name: m, Version: "v1.36.3", Created: time.Date(2026, 12, 6, 4, 0, 0, 0, time.UTC)})
	}
	return &statusView{status: st}
}

// runWatch runs status -w over reads with the options args give, on stdout
// that is or is not a terminal, and returns what it printed.
func runWatch(t *testing.T, terminal bool, args []string, reads ...any) (out, errOut string, err error) {
	t.Helper()
	o, r := parse(t, NewCmdStatus, append([]string{"status", "demo", "-w", "--interval", "1ms"}, args...)...)
	if o == nil {
		t.Fatalf("status -w %v did not reach Run: %v", args, r.err)
	}
	var stdout, stderr strings.Builder
	o.Streams.Out, o.Streams.ErrOut = &stdout, &stderr
	w := o.watcher()
	w.terminal = terminal
	clock := time.Date(2026, 12, 6, 5, 1, 27, 0, time.UTC)
	w.now = func() time.Time { clock = clock.Add(2 * time.Second); return clock }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = w.run(ctx, scriptedReads(cancel, reads...))
	return stdout.String(), stderr.String(), err
}

// Not on a terminal, status -w prints a block, headed by its time, only when
// the status changed: a lock renewed, which moves every two seconds of a
// run, is no change. Ctrl-C ends it without error.
func TestWatchPrintsOnlyChanges(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	out, errOut, err := runWatch(t, false, nil,
		watchStatus(t0, "m1", "m2", "m3"),
		watchStatus(t0.Add(2*time.Second), "m1", "m2", "m3"), // renewed: the same status
		watchStatus(t0.Add(4*time.Second), "m1", "m2", "m3", "m4"),
		watchStatus(t0.Add(6*time.Second), "m1", "m2", "m3", "m4"))
	if err != nil {
		t.Fatalf("a watch ended by Ctrl-C: %v, want no error", err)
	}
	if errOut != "" {
		t.Errorf("stderr %q", errOut)
	}
	if strings.Contains(out, clearScreen) {
		t.Errorf("a pipe got the terminal's clear-screen sequence:\n%q", out)
	}
	blocks := strings.Split(out, "\n\n2026-")
	if len(blocks) != 2 || !strings.HasPrefix(out, "2026-12-06T05:01:29Z\nCLUSTER ") || !strings.HasPrefix(blocks[1], "12-06T05:01:33Z\nCLUSTER ") {
		t.Fatalf("want two blocks, each headed by its time (the first and third reads):\n%s", out)
	}
	if strings.Contains(blocks[0], "m4") || !strings.Contains(blocks[1], "m4") {
		t.Errorf("the second block is not the changed status:\n%s", out)
	}
	if !strings.Contains(blocks[0], "\nACTING         cp-rollout (upgrade by alice@ops/pid-1)\n") {
		t.Errorf("the watched view does not say who acts:\n%s", blocks[0])
	}
}

// On a terminal every read redraws the whole view in place (the AGE column
// and the lock's renewal move even when nothing else does).
func TestWatchRedrawsATerminal(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	out, _, err := runWatch(t, true, nil, watchStatus(t0, "m1"), watchStatus(t0, "m1"), watchStatus(t0, "m1"))
	if err != nil {
		t.Fatal(err)
	}
	frames := strings.Split(out, clearScreen)
	if len(frames) != 4 || frames[0] != "" {
		t.Fatalf("want three frames, each after the clear-screen sequence:\n%q", out)
	}
	for _, f := range frames[1:] {
		if !strings.HasPrefix(f, "2026-12-06T05:01:") || !strings.Contains(f, "\nCLUSTER        default/demo\n") {
			t.Errorf("frame:\n%s", f)
		}
	}
}

// With -o json, status -w prints one compact object per line for each
// change (JSON Lines), on a terminal too; over a fleet, only the rows that
// changed.
func TestWatchPrintsJSONLines(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	out, _, err := runWatch(t, true, []string{"-o", "json"},
		watchStatus(t0, "m1", "m2", "m3"),
		watchStatus(t0.Add(2*time.Second), "m1", "m2", "m3"),
		watchStatus(t0.Add(4*time.Second), "m2", "m3", "m4"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want two lines, one per change:\n%s", out)
	}
	for i, want := range []string{"m1", "m4"} {
		var st rollout.Status
		if err := json.Unmarshal([]byte(lines[i]), &st); err != nil || st.Cluster != "demo" || len(st.Machines) != 3 {
			t.Fatalf("line %d is not a status object (%v): %s", i+1, err, lines[i])
		}
		if st.Machines[0].Name != want && st.Machines[2].Name != want {
			t.Errorf("line %d: machines %+v, want %s among them", i+1, st.Machines, want)
		}
	}

	// A fleet: each row that changed, on a line of its own.
	row := func(name, version string) fleet.Row {
		return fleet.Row{Cluster: fleet.Cluster{Namespace: "default", Name: name}, Version: version}
	}
	out, _, err = runWatch(t, false, []string{"-o", "json"},
		&statusView{rows: []fleet.Row{row("a", "v1.35.2"), row("b", "v1.35.2")}},
		&statusView{rows: []fleet.Row{row("a", "v1.35.2"), row("b", "v1.36.3")}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"namespace":"default","cluster":"a","version":"v1.35.2","replicas":0,"machines":0,"upToDate":0,"paused":false,"pausedByUs":false}
{"namespace":"default","cluster":"b","version":"v1.35.2","replicas":0,"machines":0,"upToDate":0,"paused":false,"pausedByUs":false}
{"namespace":"default","cluster":"b","version":"v1.36.3","replicas":0,"machines":0,"upToDate":0,"paused":false,"pausedByUs":false}
`
	if out != want {
		t.Errorf("fleet -w -o json:\n%s\nwant:\n%s", out, want)
	}
}

// A first read that fails is the command's error, as without -w; a later
// one is said once on stderr, and the watch goes on.
func TestWatchReadErrors(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	unreachable := exitcode.Unreachablef("cannot reach the management cluster at https://mgmt:6443: connection refused")
	if _, _, err := runWatch(t, false, nil, unreachable); exitcode.Of(err) != exitcode.Unreachable {
		t.Errorf("first read failed: %v, want its error (exit 7)", err)
	}
	lost := errors.New("reading the KubeadmControlPlane: connection refused")
	out, errOut, err := runWatch(t, false, nil, watchStatus(t0, "m1"), lost, lost, watchStatus(t0, "m1", "m2"))
	if err != nil {
		t.Fatal(err)
	}
	if errOut != "warning: reading the status again: "+lost.Error()+"\n" {
		t.Errorf("stderr %q, want the lost read's warning once", errOut)
	}
	if strings.Count(out, "CLUSTER ") != 2 {
		t.Errorf("want the status before and after the lost reads:\n%s", out)
	}
}

// The flags: --interval needs -w and must be positive; -w with -o yaml is
// refused (a stream of YAML documents is nobody's format: -o json is).
func TestWatchFlags(t *testing.T) {
	isolate(t)
	o, r := parse(t, NewCmdStatus, "status", "demo", "-w")
	if o == nil || !o.Watch || o.Interval != 2*time.Second {
		t.Fatalf("status -w: %+v (%v), want a watch every 2s", o, r.err)
	}
	o, _ = parse(t, NewCmdStatus, "status", "-A", "--watch", "--interval", "10s", "-o", "json")
	if o == nil || !o.Watch || o.Interval != 10*time.Second {
		t.Fatalf("status -A --watch --interval 10s: %+v", o)
	}
	refused(t, run(t, "status", "demo", "-w", "-o", "yaml"), exitcode.Usage, "-w cannot go with -o yaml")
	refused(t, run(t, "status", "demo", "--interval", "5s"), exitcode.Usage, "--interval needs -w")
	refused(t, run(t, "status", "demo", "-w", "--interval", "0s"), exitcode.Usage, "--interval must be positive")
}
