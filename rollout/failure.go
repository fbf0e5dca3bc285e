package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"sigs.k8s.io/cluster-api/util/annotations"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// A run that fails leaves its pause standing, so that a re-run resumes where
// it stopped. A paused KubeadmControlPlane is frozen for everyone else too,
// which is easy to forget on a cluster nobody watches: so the failure is
// said where people look — on the Cluster and the KubeadmControlPlane as
// Warning Events, in the operation record that status shows — or, when the
// user asked for it and no step is in flight, the control plane is handed
// back at once.

// PausedHint is the one sentence that says what a pause this tool left
// standing blocks, and the two ways on. The CLI prints it after a run that
// stopped, and the Warning Events of a failed run carry it. operation is
// what the pause is for ("upgrade to v1.36.3").
func PausedHint(namespace, cluster, kcp, operation string) string {
	return fmt.Sprintf("KubeadmControlPlane %s stays paused by cp-rollout (%s). While it is paused, KCP neither remediates "+
		"(no MachineHealthCheck remediation of control-plane machines) nor renews certificates, and Cluster API's MachineSet "+
		"preflight ControlPlaneIsStable holds back the cluster's worker MachineSets (scale-ups, MachineDeployment rollouts) "+
		"while the control plane's spec.version is above its status.version. Re-run the same command to resume, or "+
		"`kubectl cp-rollout handback %s -n %s` to let KCP continue.", kcp, operation, cluster, namespace)
}

// Failed reports whether err ends a run as a failure whose pause is
// explained (and, asked to, handed back): an unsafe state (exit 3) or a wait
// that ran out (exit 4). Other stops are a person's (a signal), another
// run's (a lock) or the connection's, and are left as they are.
func Failed(err error) bool {
	code := exitcode.Of(err)
	return code == exitcode.Unsafe || code == exitcode.Timeout
}

// Aftermath is what AfterFailure found and did.
type Aftermath struct {
	// Paused is true when the KubeadmControlPlane KCP stays paused under a
	// record of this tool; Hint then says what that blocks and the ways on.
	Paused bool
	KCP    string
	Hint   string
	// HandedBack, when the control plane was handed back after the failure,
	// is what that did and what KCP will do now.
	HandedBack *HandedBack
	// Stayed says why a hand-back that was asked for was not made.
	Stayed string
}

// StayPaused is the action of the Warning Events that say a failed run's
// pause stays (reason PausedAfterFailure). It names no step: no progress
// event carries it.
const StayPaused Action = "stay-paused"

// afterFailureLimit bounds what a failed run still does on its way out:
// read, take the lock again, record the failure or hand back.
const afterFailureLimit = 2 * time.Minute

// AfterFailure is what follows a run of r that ended with runErr (Prepare's
// or Run's). ctx must be live: the run's own may have ended with --timeout.
//
// On a failure (Failed) under a pause of r's own operation: with handBack,
// when no machine is in flight (InFlight), the control plane is handed back
// as the handback verb does; otherwise the failure goes into the operation
// record and a Warning Event on the Cluster and on the KubeadmControlPlane
// says what the pause blocks and the ways on. On any other stop it only
// looks whether the pause stands. A pause of another operation (this run was
// refused because of it) is not this run's: nothing is said of it here (the
// refusal names it), recorded on it or handed back.
func (e *Engine) AfterFailure(ctx context.Context, r Request, runErr error, handBack bool) Aftermath {
	if runErr == nil {
		return Aftermath{}
	}
	// The look reads even after ctx ended: an interrupted run says what it
	// left too.
	readCtx, cancelRead := cleanupContext(ctx)
	cluster, kcp, err := e.Reader.ReadKCP(readCtx)
	cancelRead()
	if err != nil {
		return Aftermath{}
	}
	rec, err := record.Of(kcp)
	if err != nil || rec == nil || !annotations.HasPaused(kcp) || rec.Operation != string(r.Operation) || rec.Target != r.TargetString() {
		return Aftermath{}
	}
	operation := rec.Operation + " to " + rec.Target
	a := Aftermath{Paused: true, KCP: kcp.Name, Hint: PausedHint(cluster.Namespace, cluster.Name, kcp.Name, operation)}
	if !Failed(runErr) {
		return a
	}
	ctx, cancel := context.WithTimeout(ctx, afterFailureLimit)
	defer cancel()
	code := exitcode.Of(runErr)
	if handBack {
		done, why := e.handBackAfterFailure(ctx, operation, code)
		if why == "" {
			return Aftermath{KCP: kcp.Name, HandedBack: done}
		}
		a.Stayed = why
	}
	e.recordFailure(ctx, record.Failure{Reason: runErr.Error(), Time: time.Now(), ExitCode: code})
	if e.Audit != nil {
		e.Audit.Warn(string(StayPaused), "PausedAfterFailure", failureNote(operation, code, runErr, a.Hint), cluster, kcp)
	}
	return a
}

// handBackAfterFailure hands the control plane back unless a machine is in
// flight; it returns what the hand-back did, or why it was not made.
func (e *Engine) handBackAfterFailure(ctx context.Context, operation string, code int) (done *HandedBack, stayed string) {
	s, err := e.Read(ctx)
	if err != nil {
		return nil, "what is in flight could not be read: " + err.Error()
	}
	if inFlight := InFlight(s); inFlight.Len() > 0 {
		var why []string
		for _, m := range inFlight.SortedByCreationTimestamp() {
			why = append(why, "machine "+m.Name+" is still joining")
		}
		return nil, strings.Join(why, ", ") + ": KCP would find a step it did not start"
	}
	if done, err = e.Handback(ctx, false); err != nil {
		return nil, "handing back failed: " + err.Error()
	}
	e.note(HandBack, fmt.Sprintf("%s failed (exit %d) with no machine in flight: KubeadmControlPlane handed back to KCP (--on-failure handback)", operation, code))
	return done, ""
}

// recordFailure adds f to the operation record, under the lock, as every
// write to the KubeadmControlPlane is made; a record it cannot write is said
// and left as it was.
func (e *Engine) recordFailure(ctx context.Context, f record.Failure) {
	err := e.holding(ctx, func(ctx context.Context, _ Lock) error {
		_, kcp, err := e.Reader.ReadKCP(ctx)
		if err != nil {
			return err
		}
		return e.HandOver.RecordFailure(ctx, kcp, f)
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		e.report(RecordFailure, "", progress.Failed, "the failure was not recorded on the KubeadmControlPlane: "+err.Error(), time.Now())
	}
}

// failureNote is the note of a failed run's Warning Events: what failed and
// why, then the hint whole; the reason is cut first to fit an Event's note.
func failureNote(operation string, code int, runErr error, hint string) string {
	const noteLimit = 1024
	head := fmt.Sprintf("%s failed (exit %d, %s): ", operation, code, exitcode.Class(code))
	reason := strings.TrimRight(strings.Join(strings.Fields(runErr.Error()), " "), ".")
	if room := noteLimit - len(head) - len(hint) - 2; len(reason) > room {
		reason = strings.ToValidUTF8(reason[:max(room-3, 0)], "") + "..." // not cut inside a character
	}
	return head + reason + ". " + hint
}
