package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// TestInFlight: a replacement still joining is in flight; a healthy machine,
// a machine being deleted (KCP finishes it), and one that was up and went
// bad (the run's failure, not a step of it) are not — nor an up-to-date
// machine whose promoted member is dead, which no run saw healthy.
func TestInFlight(t *testing.T) {
	for _, c := range []struct {
		name  string
		specs []machineSpec
		seen  string // a machine the run saw healthy
		want  string
	}{
		{name: "all healthy", specs: []machineSpec{{}, {}, {}}},
		{name: "deleting", specs: []machineSpec{{outdated: true, deleting: true}, {}, {}}},
		{name: "dead, never seen healthy", specs: []machineSpec{{outdated: true}, {unhealthy: true}, {}}},
		{name: "replacement without a node", specs: []machineSpec{{outdated: true}, {outdated: true}, {noNode: true}}, want: "m2"},
		{name: "replacement's member a learner", specs: []machineSpec{{outdated: true}, {learner: true}}, want: "m1"},
		{name: "outdated machine KCP was still creating", specs: []machineSpec{{outdated: true, noNode: true}, {}, {}}, want: "m0"},
		{name: "went bad after it was up", specs: []machineSpec{{}, {unhealthy: true, noMember: true}, {}}, seen: "m1"},
		{name: "a deletion and a join", specs: []machineSpec{{outdated: true, deleting: true}, {}, {noNode: true}}, want: "m2"},
	} {
		s := world(c.specs...)
		s.SeenHealthy = map[string]bool{c.seen: c.seen != ""}
		var got []string
		for _, m := range InFlight(s).SortedByCreationTimestamp() {
			got = append(got, m.Name)
		}
		if strings.Join(got, ",") != c.want {
			t.Errorf("%s: in flight %v, want %q", c.name, got, c.want)
		}
	}
}

type warning struct {
	action, reason, note string
	regarding            []string
}

type warnings []warning

func (w *warnings) Warn(action, reason, note string, regarding ...client.Object) {
	var names []string
	for _, obj := range regarding {
		switch obj.(type) {
		case *clusterv1.Cluster:
			names = append(names, "Cluster/"+obj.GetName())
		case *controlplanev1.KubeadmControlPlane:
			names = append(names, "KubeadmControlPlane/"+obj.GetName())
		}
	}
	*w = append(*w, warning{action, reason, note, names})
}

// failedOn is an engine on w that a run failed on: handback takes a real
// lock over a fake management cluster, and the failure record and the
// Warning Events are kept for the test to look at.
func failedOn(w *Snapshot) (*Engine, *handingBack, *warnings) {
	e, f := handingBackOn(newScripted(w), newFakeLease())
	warned := &warnings{}
	e.Audit = warned
	return e, f, warned
}

var upgrade = Request{Operation: "upgrade"} // as pausedByUs records it

// TestAfterFailureExplainsThePause: a run that failed on an unsafe state
// leaves its pause standing, with the failure in the record (written under
// the lock) and one Warning Event on the Cluster and the KubeadmControlPlane
// that names the failure, what the pause blocks and the two ways on.
func TestAfterFailureExplainsThePause(t *testing.T) {
	e, f, warned := failedOn(pausedByUs(world(machineSpec{outdated: true}, machineSpec{}, machineSpec{})))
	runErr := exitcode.Unsafef("machine m0: etcd member n0 is unhealthy: connection refused")
	a := e.AfterFailure(context.Background(), upgrade, runErr, false)
	if !a.Paused || a.KCP != "demo-cp" || f.resumed {
		t.Fatalf("aftermath %+v, resumed %v: want the pause standing", a, f.resumed)
	}
	for _, says := range []string{"demo-cp stays paused", "remediates", "certificates", "ControlPlaneIsStable", "spec.version", "Re-run the same command", "kubectl cp-rollout handback demo -n default"} {
		if !strings.Contains(a.Hint, says) {
			t.Errorf("hint %q does not say %q", a.Hint, says)
		}
	}
	if len(f.recorded) != 1 || f.recorded[0].Reason != runErr.Error() || f.recorded[0].ExitCode != exitcode.Unsafe || f.recorded[0].Time.IsZero() {
		t.Errorf("recorded %+v, want the failure once, exit 3, with its time", f.recorded)
	}
	if !f.lockedWhileRecording {
		t.Error("the failure was recorded without the lock")
	}
	if lease, _ := f.lease.Lease(context.Background()); lease != nil && runlock.Holder(lease) != "" {
		t.Errorf("the lock was kept after the failure was recorded: %s", runlock.Holder(lease))
	}
	if len(*warned) != 1 {
		t.Fatalf("%d Warning Events written, want 1: %+v", len(*warned), *warned)
	}
	w := (*warned)[0]
	if strings.Join(w.regarding, ",") != "Cluster/demo,KubeadmControlPlane/demo-cp" || w.reason != "PausedAfterFailure" {
		t.Errorf("warning %s on %v, want PausedAfterFailure on the Cluster and the KubeadmControlPlane", w.reason, w.regarding)
	}
	if !strings.Contains(w.note, "exit 3") || !strings.Contains(w.note, "etcd member n0 is unhealthy") || !strings.HasSuffix(w.note, a.Hint) {
		t.Errorf("note %q: want the failure, then the hint whole", w.note)
	}
}

// TestAfterFailureHandsBackWithNothingInFlight: with --on-failure handback
// and no machine deleting or joining, the control plane goes back to KCP, as
// the handback verb gives it: no failure is recorded, no pause explained.
func TestAfterFailureHandsBackWithNothingInFlight(t *testing.T) {
	e, f, warned := failedOn(pausedByUs(world(machineSpec{outdated: true}, machineSpec{}, machineSpec{})))
	a := e.AfterFailure(context.Background(), upgrade, exitcode.Timeoutf("machine m1 did not become healthy within 1m0s"), true)
	if !f.resumed || a.HandedBack == nil || a.Paused || a.Stayed != "" {
		t.Fatalf("aftermath %+v, resumed %v: want handed back", a, f.resumed)
	}
	if !strings.Contains(strings.Join(a.HandedBack.Lines(), "\n"), "KCP will now roll out 1 outdated machine(s) (m0)") {
		t.Errorf("handback says %q, want what KCP will do now", a.HandedBack.Lines())
	}
	if len(f.recorded) != 0 || len(*warned) != 0 {
		t.Errorf("recorded %+v and warned %+v about a pause that was handed back", f.recorded, *warned)
	}
}

// TestAfterFailureStaysWhileAStepIsInFlight: with --on-failure handback but a
// replacement still joining, the pause stays, says why, and is explained as
// without the flag.
func TestAfterFailureStaysWhileAStepIsInFlight(t *testing.T) {
	for _, c := range []struct {
		specs []machineSpec
		says  string
	}{
		{[]machineSpec{{outdated: true}, {}, {}, {noNode: true}}, "machine m3 is still joining"},
	} {
		e, f, warned := failedOn(pausedByUs(world(c.specs...)))
		a := e.AfterFailure(context.Background(), upgrade, exitcode.Unsafef("machine m1: etcd member n1 is unhealthy"), true)
		if f.resumed || !a.Paused || !strings.Contains(a.Stayed, c.says) {
			t.Errorf("aftermath %+v, resumed %v: want the pause kept because %s", a, f.resumed, c.says)
		}
		if len(f.recorded) != 1 || len(*warned) != 1 {
			t.Errorf("%s: recorded %d, warned %d: want the pause explained", c.says, len(f.recorded), len(*warned))
		}
	}
}

// TestAfterFailureOnlyForItsOwnFailures: a stop that is not a failure (a
// signal, the lock) still says the pause stands but records and hands back
// nothing; another operation's pause is not this run's to speak of.
func TestAfterFailureOnlyForItsOwnFailures(t *testing.T) {
	e, f, warned := failedOn(pausedByUs(world(machineSpec{}, machineSpec{}, machineSpec{})))
	for _, err := range []error{exitcode.Stopped(nil), exitcode.Lockedf("lost the lock"), errors.New("etcdserver: request timed out")} {
		if a := e.AfterFailure(context.Background(), upgrade, err, true); !a.Paused || f.resumed {
			t.Errorf("%v: aftermath %+v, resumed %v: want the pause said and kept", err, a, f.resumed)
		}
	}
	scale := Request{Operation: "scale", Replicas: new(int32(5))}
	if a := e.AfterFailure(context.Background(), scale, exitcode.Unsafef("holds an unfinished operation"), true); a.Paused || f.resumed {
		t.Errorf("another operation's pause: aftermath %+v, resumed %v", a, f.resumed)
	}
	if len(f.recorded) != 0 || len(*warned) != 0 {
		t.Errorf("recorded %+v, warned %+v: want nothing", f.recorded, *warned)
	}
	e, f, _ = failedOn(world(machineSpec{}))
	if a := e.AfterFailure(context.Background(), upgrade, exitcode.Unsafef("x"), false); a.Paused || len(f.recorded) != 0 {
		t.Errorf("not paused: aftermath %+v, recorded %+v", a, f.recorded)
	}
}

// TestFailureNoteFitsAnEvent: a long reason is cut, the hint never is.
func TestFailureNoteFitsAnEvent(t *testing.T) {
	hint := PausedHint("default", "demo", "demo-cp", "upgrade to v1.36.3")
	note := failureNote("upgrade to v1.36.3", 4, errors.New(strings.Repeat("waited for machine m3; ", 100)), hint)
	if len(note) > 1024 || !strings.HasSuffix(note, hint) || !strings.HasPrefix(note, "upgrade to v1.36.3 failed (exit 4, timeout): waited") {
		t.Errorf("note of %d bytes: %q", len(note), note)
	}
}

// TestStatusShowsTheLastFailure: a pause whose run failed is one line, "paused
// by cp-rollout since T, last run failed: REASON", and its JSON carries the
// failure in the record; a record written before failures were kept reads
// as one without.
func TestStatusShowsTheLastFailure(t *testing.T) {
	w := world(machineSpec{}, machineSpec{}, machineSpec{})
	rec := record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "ops", Started: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC),
		LastFailure: &record.Failure{Reason: "machine m1: etcd member n1 is unhealthy", Time: time.Date(2026, 1, 1, 10, 5, 0, 0, time.UTC), ExitCode: 3}}
	raw, _ := json.Marshal(rec)
	w.CP.KCP.Annotations = map[string]string{clusterv1.PausedAnnotation: "true", record.Annotation: string(raw)}
	f := newScripted(w)
	st, err := (&Engine{Reader: f, Lease: f, Workload: f, Etcd: f}).Status(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := "paused by cp-rollout since 2026-01-01T10:00:00Z, last run failed: machine m1: etcd member n1 is unhealthy"
	if st.ControlPlane.State != want {
		t.Errorf("state %q, want %q", st.ControlPlane.State, want)
	}
	out, _ := json.Marshal(st)
	if !strings.Contains(string(out), `"lastFailure":{"reason":"machine m1: etcd member n1 is unhealthy","time":"2026-01-01T10:05:00Z","exitCode":3}`) ||
		!strings.Contains(string(out), `"state":"`+want+`"`) {
		t.Errorf("JSON without the failure: %s", out)
	}

	w.CP.KCP.Annotations[record.Annotation] = `{"operation":"upgrade","target":"v1.36.3","who":"ops","started":"2026-01-01T10:00:00Z"}`
	if st, err = (&Engine{Reader: f, Lease: f, Workload: f, Etcd: f}).Status(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if st.ControlPlane.State != "paused by cp-rollout since 2026-01-01T10:00:00Z" || st.Operation.LastFailure != nil {
		t.Errorf("an older record: state %q, failure %+v", st.ControlPlane.State, st.Operation.LastFailure)
	}
}

// TestAfterFailureHandsBackHalfWayThroughADeletion: a run stopped while a
// machine deletes (its hook held: what stays was not safe enough for the
// tool, nor will it be for KCP until it is) hands back with --on-failure
// handback: KCP serves the hook by the same rules and replaces the machine.
func TestAfterFailureHandsBackHalfWayThroughADeletion(t *testing.T) {
	e, f, _ := failedOn(pausedByUs(world(machineSpec{outdated: true, deleting: true, preTermOK: true, unhealthy: true}, machineSpec{unhealthy: true}, machineSpec{})))
	a := e.AfterFailure(context.Background(), upgrade, exitcode.Unsafef("not releasing machine m0"), true)
	if !f.resumed || a.HandedBack == nil || a.Paused {
		t.Fatalf("aftermath %+v, resumed %v: want handed back with m0 deleting", a, f.resumed)
	}
}
