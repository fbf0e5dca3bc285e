package rollout

import (
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// Every action of a run is a step: it opens with e.begin, which reports it
// started, may report that it is waiting, and closes with end, which reports
// it done or failed under the same action name and records it for the
// summary. So the summary is complete by construction.

// stepLog is what a run has done so far, for [k/n] and the summary.
type stepLog struct {
	// began is when the run started; last when its latest step ended.
	began, last time.Time
	times       []progress.StepTime
	// machine counts machine steps (a replacement, an added or removed
	// machine) begun so far; total is how many the run expects.
	machine, total int
	// created and deleted record what the machine step in progress has made:
	// a replacement is one creation and one deletion, in either order.
	created, deleted bool
	// hop is the hop in progress of an upgrade through several versions.
	hop progress.Hop
}

// step is one action in progress.
type step struct {
	e       *Engine
	action  Action
	machine string
	began   time.Time
	outcome string
	// held is how long the cluster refused the step before it went through
	// (etcd's five-second rule for membership changes), for its done event.
	held time.Duration
}

// begin reports action started (on machine, if any) and returns the step;
// the caller closes it with `defer step.end(&err)`.
func (e *Engine) begin(action Action, machine, msg string) *step {
	st := &step{e: e, action: action, machine: machine, began: time.Now()}
	if e.steps.began.IsZero() {
		e.steps.began, e.steps.last = st.began, st.began
	}
	e.report(st.action, machine, progress.Started, msg, st.began)
	return st
}

// note is a step that is done as soon as it begins: it only tells.
func (e *Engine) note(action Action, msg string) {
	var none error
	st := e.begin(action, "", msg)
	st.done(msg)
	st.end(&none)
}

// waiting reports that the step waits, and why.
func (st *step) waiting(why string) {
	st.e.report(st.action, st.machine, progress.Waiting, why, st.began)
}

// done sets the message of the step's done event.
func (st *step) done(msg string) { st.outcome = msg }

// end reports the step done or, when *err is set, failed with that error. Its
// time in the summary runs from the end of the step before it, so the read and
// decision that led to it count too and the summary adds up to the run.
func (st *step) end(err *error) {
	e := st.e
	now := time.Now()
	if *err != nil {
		e.report(st.action, st.machine, progress.Failed, (*err).Error(), st.began)
	} else {
		e.reportHeld(st.action, st.machine, progress.Done, st.outcome, st.began, st.held)
	}
	e.steps.times = append(e.steps.times, progress.StepTime{Action: string(st.action), Machine: st.machine, Duration: now.Sub(e.steps.last), Hop: e.steps.hop})
	e.steps.last = now
}

// beginMachineStep counts a creation or deletion that starts into the
// machine steps: a replacement is one creation and one deletion in either
// order (surge first or delete first), so a new machine step begins when the
// one in progress has already made one of the same kind. A deletion that
// starts and is not made (deleteVictim decides again after its drain) leaves
// its step in progress, for the creation or deletion made next.
func (l *stepLog) beginMachineStep(deletion bool) {
	if l.machine == 0 || (deletion && l.deleted) || (!deletion && l.created) {
		l.machine++
		l.created, l.deleted = false, false
	}
}

// made records that the machine step in progress made its creation or its
// deletion.
func (l *stepLog) made(deletion bool) {
	if deletion {
		l.deleted = true
	} else {
		l.created = true
	}
}

// summarize closes the run with its steps and their durations.
func (e *Engine) summarize() {
	if e.Reporter == nil {
		return
	}
	key := e.Reader.Key()
	run := progress.Event{Time: time.Now(), Cluster: key.Name, Namespace: key.Namespace,
		Step: e.steps.machine, Total: max(e.steps.total, e.steps.machine), ElapsedMs: time.Since(e.steps.began).Milliseconds()}
	if e.Requests != nil {
		r := e.Requests()
		run.Requests = &r
	}
	e.Reporter.Summary(run, e.steps.times)
}

// report sends one event; progress that concerns no step (a read that fails
// and is retried) is reported with it too.
func (e *Engine) report(action Action, machine string, phase progress.Phase, msg string, since time.Time) {
	e.reportHeld(action, machine, phase, msg, since, 0)
}

// reportHeld is report for a step the cluster held back for held.
func (e *Engine) reportHeld(action Action, machine string, phase progress.Phase, msg string, since time.Time, held time.Duration) {
	if e.Reporter == nil {
		return
	}
	key := e.Reader.Key()
	e.Reporter.Report(progress.Event{
		Time: time.Now(), Cluster: key.Name, Namespace: key.Namespace,
		Step: e.steps.machine, Total: max(e.steps.total, e.steps.machine), Action: string(action), Machine: machine, Phase: phase,
		Message: msg, ElapsedMs: time.Since(since).Milliseconds(), HeldMs: held.Milliseconds(), Hop: e.steps.hop,
	})
}
