package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// asked is what BetweenMachines saw at one call: the boundary, the calls
// made before it, and what was in flight then on a live read.
type asked struct {
	b        Boundary
	calls    string
	inFlight string
}

// askingEngine is an engine on f whose BetweenMachines records each call
// and answers with answer(call number, from 1).
func askingEngine(t *testing.T, f *scripted, total int, answer func(n int) error) (*Engine, *[]asked) {
	e, _ := engineFor(f, fast)
	e.steps.total = total
	var got []asked
	e.BetweenMachines = func(ctx context.Context, b Boundary) error {
		f.mu.Lock()
		calls := strings.Join(f.calls, ", ")
		f.mu.Unlock()
		s, err := e.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var busy []string
		for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
			switch {
			case !m.DeletionTimestamp.IsZero():
				busy = append(busy, m.Name+" deleting")
			case Problem(s, m) != nil:
				busy = append(busy, fmt.Sprintf("%s: %v", m.Name, Problem(s, m)))
			}
		}
		got = append(got, asked{b: b, calls: calls, inFlight: strings.Join(busy, "; ")})
		return answer(len(got))
	}
	return e, &got
}

// The question comes exactly between machines — after the step before has
// released its old machine (surge first) or passed its new one through the
// gates (delete first), before anything of the next — once per boundary,
// never before the first machine or after the last.
func TestBetweenMachinesIsAskedAtEachBoundaryOnly(t *testing.T) {
	old := machineSpec{outdated: true}
	for _, tc := range []struct {
		name   string
		target Target
		// before are the calls made up to each question.
		before []string
		says   []string
	}{
		{"surge first", surge1,
			[]string{
				"create r1, hook m0, drain n0, move-leader n0->node-r1, delete m0, remove-member n0, release m0",
				"create r1, hook m0, drain n0, move-leader n0->node-r1, delete m0, remove-member n0, release m0, " +
					"create r2, hook m1, drain n1, delete m1, remove-member n1, release m1",
			},
			[]string{"machine 1/3 done (m0 replaced by r1)", "machine 2/3 done (m1 replaced by r2)"}},
		{"delete first", Target{Operation: "upgrade", Replicas: 3, MaxSurge: 0},
			[]string{
				"hook m0, drain n0, move-leader n0->n2, delete m0, remove-member n0, release m0, create r1",
				"hook m0, drain n0, move-leader n0->n2, delete m0, remove-member n0, release m0, create r1, " +
					"hook m1, drain n1, delete m1, remove-member n1, release m1, create r2",
			},
			[]string{"machine 1/3 done (m0 replaced by r1)", "machine 2/3 done (m1 replaced by r2)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newScripted(world(machineSpec{outdated: true, leader: true}, old, old))
			e, got := askingEngine(t, f, 3, func(int) error { return nil })
			if err := converge(t, e, tc.target); err != nil {
				t.Fatal(err)
			}
			if len(*got) != 2 {
				t.Fatalf("asked %d times, want 2 (between 3 machines): %+v", len(*got), *got)
			}
			for i, a := range *got {
				if a.calls != tc.before[i] {
					t.Errorf("question %d came after\n %s\nwant after\n %s", i+1, a.calls, tc.before[i])
				}
				if a.inFlight != "" {
					t.Errorf("question %d asked while in flight: %s", i+1, a.inFlight)
				}
				if a.b.String() != tc.says[i] || a.b.Next() != i+2 {
					t.Errorf("question %d: %q before %d, want %q before %d", i+1, a.b, a.b.Next(), tc.says[i], i+2)
				}
			}
			if e.steps.machine != 3 {
				t.Fatalf("%d machine steps counted, want 3", e.steps.machine)
			}
		})
	}
}

// A scale up adds machines without removing any; a scale down removes them.
func TestBetweenMachinesNamesWhatAScaleDid(t *testing.T) {
	for _, tc := range []struct {
		name     string
		machines []machineSpec
		replicas int32
		says     string
	}{
		{"up", []machineSpec{{}}, 3, "machine 1/2 done (r1 added)"},
		{"down", []machineSpec{{}, {}, {}, {}, {}}, 3, "machine 1/2 done (m0 removed)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newScripted(world(tc.machines...))
			e, got := askingEngine(t, f, 2, func(int) error { return nil })
			if err := converge(t, e, Target{Operation: "scale", Replicas: tc.replicas, MaxSurge: 1}); err != nil {
				t.Fatal(err)
			}
			if len(*got) != 1 || (*got)[0].b.String() != tc.says || (*got)[0].inFlight != "" {
				t.Fatalf("asked %+v, want once: %q, nothing in flight", *got, tc.says)
			}
		})
	}
}

// A no stops the run before the next machine is created: its error is the
// run's, and the KubeadmControlPlane keeps its pause and record for a re-run.
func TestNoBetweenMachinesStopsBeforeTheNextCreate(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(pausedByUs(world(machineSpec{outdated: true, leader: true}, old, old)))
	no := exitcode.New(exitcode.Interrupted, errors.New("not confirmed"))
	e, got := askingEngine(t, f, 3, func(int) error { return no })
	err := convergeUnder(t, e, surge1, &heldLock{})
	if !errors.Is(err, no) || exitcode.Of(err) != exitcode.Interrupted {
		t.Fatalf("got %v, want the answer's error", err)
	}
	if Failed(err) {
		t.Errorf("an operator's stop counts as a failure: its pause would be handed back with --on-failure handback")
	}
	if len(*got) != 1 {
		t.Fatalf("asked %d times, want once", len(*got))
	}
	want := "create r1, hook m0, drain n0, move-leader n0->node-r1, delete m0, remove-member n0, release m0"
	if calls := strings.Join(f.calls, ", "); calls != want {
		t.Fatalf("calls %s, want %s and nothing of the next machine", calls, want)
	}
	if kcp := f.world.CP.KCP; kcp.Annotations[clusterv1.PausedAnnotation] != "true" || kcp.Annotations[record.Annotation] == "" {
		t.Fatalf("the pause or the record went: %v", kcp.Annotations)
	}
	if e.steps.machine != 1 {
		t.Fatalf("%d machine steps counted, want 1: the second never began", e.steps.machine)
	}
}

// Without BetweenMachines nothing is asked and the run goes on: the default.
func TestNoBetweenMachinesByDefault(t *testing.T) {
	var e Engine
	if e.BetweenMachines != nil {
		t.Fatal("BetweenMachines is set by default")
	}
	e.steps.machine, e.steps.created, e.steps.deleted = 1, true, true
	if err := e.beginMachineStep(context.Background(), false); err != nil || e.steps.machine != 2 {
		t.Fatalf("%v, step %d; want step 2 begun", err, e.steps.machine)
	}
}
