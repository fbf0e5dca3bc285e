// Package exitcode decides the process exit code of every command in one place.
//
// Runbooks branch on these numbers, so they are part of the tool's contract and
// documented in the README and docs/usage.md. Code deep inside the tool marks an error with the
// class it belongs to (Usage, Unsafe, Timeout, Locked, Forbidden, Unreachable);
// main alone turns it into a number and exits.
package exitcode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
)

// The exit codes. Their values are stable: scripts depend on them.
const (
	OK          = 0   // success, or nothing to do
	Failure     = 1   // anything not classified below
	Usage       = 2   // bad usage or input; nothing was changed
	Unsafe      = 3   // refused because the cluster is in an unsafe state
	Timeout     = 4   // a wait ran out of time
	Locked      = 5   // another run holds the cluster's lock
	Forbidden   = 6   // the identity lacks permissions the operation needs; nothing was changed
	Unreachable = 7   // the management cluster could not be reached or would not authenticate us; nothing was changed
	Interrupted = 130 // stopped by SIGINT (128 + 2, as shells report it), or by a no to --interactive's question
	Terminated  = 143 // stopped by SIGTERM (128 + 15)
)

// Error carries an exit code alongside the error that explains it.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// New marks err with code. A nil err stays nil so callers can wrap unconditionally.
func New(code int, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Code: code, Err: err}
}

// Usagef reports bad usage or input.
func Usagef(format string, a ...any) error { return New(Usage, fmt.Errorf(format, a...)) }

// Unsafef reports a refusal because of the cluster's state; the message names the
// machine or member at fault.
func Unsafef(format string, a ...any) error { return New(Unsafe, fmt.Errorf(format, a...)) }

// Timeoutf reports a wait that ran out of time; the message says what was awaited
// and what was last seen.
func Timeoutf(format string, a ...any) error { return New(Timeout, fmt.Errorf(format, a...)) }

// Lockedf reports that another run holds the lock; the message names the holder.
func Lockedf(format string, a ...any) error { return New(Locked, fmt.Errorf(format, a...)) }

// Forbiddenf reports permissions the operation needs and the identity lacks;
// the message lists each of them.
func Forbiddenf(format string, a ...any) error { return New(Forbidden, fmt.Errorf(format, a...)) }

// Unreachablef reports that the management cluster could not be reached, or
// did not accept the credentials, before anything was read or changed; the
// message names the server and what failed.
func Unreachablef(format string, a ...any) error {
	return New(Unreachable, fmt.Errorf(format, a...))
}

// Stopped is the cause with which main cancels a run's context when sig
// arrives. It carries the code a shell reports for a process that sig ends
// (130 for SIGINT, 143 for SIGTERM), so that a runbook can tell a person's
// Ctrl-C from a supervisor's stop, and it is context.Canceled, so that code
// which treats a cancelled context as a stop keeps doing so.
func Stopped(sig os.Signal) error {
	code, name := Interrupted, "SIGINT"
	if sig == syscall.SIGTERM {
		code, name = Terminated, "SIGTERM"
	}
	return New(code, fmt.Errorf("stopped by %s: %w", name, context.Canceled))
}

// Of returns the exit code for err: the outermost explicit code wins, a bare
// context deadline counts as a timeout, everything else is a failure.
func Of(err error) int {
	if err == nil {
		return OK
	}
	var coded *Error
	if errors.As(err, &coded) {
		return coded.Code
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Timeout
	}
	return Failure
}

// IsStop reports whether code says a signal stopped the run.
func IsStop(code int) bool { return code == Interrupted || code == Terminated }

// StopOf is the code of a run whose context ended because it was stopped:
// the signal's (Stopped), or Interrupted when the cause does not say which.
func StopOf(ctx context.Context) int {
	if code := Of(context.Cause(ctx)); IsStop(code) {
		return code
	}
	return Interrupted
}

// Class names a code for scripts, in the JSON object that ends a failed run
// with -o json: a small vocabulary that stays stable as messages change.
// Codes outside the documented ones are failures.
func Class(code int) string {
	switch code {
	case Usage:
		return "usage"
	case Unsafe:
		return "unsafe"
	case Timeout:
		return "timeout"
	case Locked:
		return "locked"
	case Forbidden:
		return "forbidden"
	case Unreachable:
		return "unreachable"
	case Interrupted, Terminated:
		return "interrupted"
	}
	return "failure"
}

// severity orders the codes from least to most in need of attention, for a
// command over many clusters, which exits with its worst cluster's code
// (Worst); codes in one entry rank the same. Codes that may leave a control
// plane mid-rollout (a failure, a wait that ran out) rank above refusals that
// changed nothing there. Among those refusals, the more a code says about the
// cluster itself, the higher it ranks: bad usage and an unreachable or
// unauthenticated management cluster say nothing about it, a missing
// permission little, a lock that someone else is at work, an unsafe state
// that it needs a person. An interruption outranks them all, as the person or
// supervisor who stopped the run decides what follows. docs/usage.md documents
// this order.
var severity = [][]int{{OK}, {Usage}, {Unreachable}, {Forbidden}, {Locked}, {Unsafe}, {Timeout}, {Failure}, {Interrupted, Terminated}}

// rank is code's place in severity; a code outside the documented ones ranks
// as a Failure.
func rank(code int) int {
	if i := slices.IndexFunc(severity, func(codes []int) bool { return slices.Contains(codes, code) }); i >= 0 {
		return i
	}
	return rank(Failure)
}

// Worst returns the code among codes that ranks highest in severity; of
// codes that rank the same, the first. No codes is OK.
func Worst(codes ...int) int {
	worst := OK
	for _, c := range codes {
		if rank(c) > rank(worst) {
			worst = c
		}
	}
	return worst
}
