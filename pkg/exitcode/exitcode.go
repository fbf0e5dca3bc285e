// Package exitcode decides the process exit code of every command in one place.
//
// Runbooks branch on these numbers, so they are part of the tool's contract and
// documented in the README. Code deep inside the tool marks an error with the
// class it belongs to (Usage, Unsafe, Timeout, Locked, Forbidden); main alone turns it into
// a number and exits.
package exitcode

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	Interrupted = 130 // stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report it)
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

// severity orders the codes from least to most in need of attention, for a
// command over many clusters, which exits with its worst cluster's code
// (Worst). Codes that may leave a control plane mid-rollout (a failure, a
// wait that ran out) rank above refusals that changed nothing there; an
// interruption outranks them all, as the person who stopped the run decides
// what follows. The README documents this order.
var severity = []int{OK, Usage, Forbidden, Locked, Unsafe, Timeout, Failure, Interrupted}

// Worst returns the code among codes that ranks highest in severity; a code
// outside the documented ones ranks as a Failure. No codes is OK.
func Worst(codes ...int) int {
	rank := func(code int) int {
		for i, c := range severity {
			if c == code {
				return i
			}
		}
		return slices.Index(severity, Failure)
	}
	worst := OK
	for _, c := range codes {
		if rank(c) > rank(worst) {
			worst = c
		}
	}
	return worst
}
