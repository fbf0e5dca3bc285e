package rollout

import (
	"context"
	"fmt"
)

// A run may be asked to stop between two machines, as kOps's rolling-update
// --interactive does: Engine.BetweenMachines is called where one machine
// step has ended and the next is about to begin. It is the one point of a
// run where stopping leaves nothing half-done: the loop finishes a deletion
// and waits for a join, gates and soak included, before it creates or
// deletes another machine (Next), so nothing is joining or deleting there.
// The one exception is Next's: a remediation deletes a condemned machine that
// owns no etcd member ahead of a join, as KCP does, and the question before
// that deletion comes while the join goes on.
// A stop there is any stop: the KubeadmControlPlane stays paused with the
// run's record, and the same command resumes at the next machine.

// Boundary is the point between machine step Done and the next, for the
// question asked there.
type Boundary struct {
	// Done counts the machine steps done; Total is how many the run
	// expects in all (never fewer than Done+1).
	Done, Total int
	// Added and Removed name the machines the step just done created and
	// deleted: a replacement has both, a scale up or down one; "" when it
	// made none (a step half made by an earlier run, resumed).
	Added, Removed string
}

// Next is the number of the machine step about to begin.
func (b Boundary) Next() int { return b.Done + 1 }

// String says what was done: `machine 1/3 done (m0 replaced by r1)`.
func (b Boundary) String() string {
	s := fmt.Sprintf("machine %d/%d done", b.Done, b.Total)
	switch {
	case b.Added != "" && b.Removed != "":
		return s + " (" + b.Removed + " replaced by " + b.Added + ")"
	case b.Added != "":
		return s + " (" + b.Added + " added)"
	case b.Removed != "":
		return s + " (" + b.Removed + " removed)"
	}
	return s
}

// beginMachineStep counts a creation or a deletion that starts into the
// machine steps (stepLog.beginMachineStep decides when one begins). When it
// begins a step after one that ended, BetweenMachines is asked first: its
// error stops the run there, before anything of the next machine is done,
// and the count stays as it was.
func (e *Engine) beginMachineStep(ctx context.Context, deletion bool) error {
	// A copy decides whether a step begins, so that when to ask follows
	// the step log's own definition of a machine step.
	probe := e.steps
	probe.beginMachineStep(deletion)
	if probe.machine == e.steps.machine {
		return nil
	}
	if e.steps.machine > 0 && e.BetweenMachines != nil {
		if err := e.BetweenMachines(ctx, e.boundary()); err != nil {
			return err
		}
	}
	e.steps.beginMachineStep(deletion)
	e.machineFrom = len(e.steps.times)
	return nil
}

// boundary describes the machine step in progress as done, from the steps
// it took: its creation and its deletion are steps named after the machine.
func (e *Engine) boundary() Boundary {
	l := &e.steps
	b := Boundary{Done: l.machine, Total: max(l.total, l.machine+1)}
	for _, st := range l.times[min(e.machineFrom, len(l.times)):] {
		switch Action(st.Action) {
		case Create:
			b.Added = st.Machine
		case Delete:
			b.Removed = st.Machine
		}
	}
	return b
}
