package simtest

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// pollInterval is how often Eventually looks again: often enough that a test
// sees a state that lasts a second, rarely enough not to load the API servers
// it asks.
const pollInterval = 100 * time.Millisecond

// Eventually polls check until it reports true and fails the test, naming what
// it waited for and the last thing check said, when timeout passes first. An
// error from check is not fatal (API servers restart, machines go away under
// a Get): it is remembered as the latest reason and polling goes on.
func Eventually(t testing.TB, timeout time.Duration, what string, check func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	last := "not checked yet"
	err := wait.PollUntilContextTimeout(context.Background(), pollInterval, timeout, true, func(ctx context.Context) (bool, error) {
		ok, why, err := check(ctx)
		if err != nil {
			why = err.Error()
		}
		if !ok {
			last = why
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("%s: still not after %s: %s", what, timeout, last)
	}
}
