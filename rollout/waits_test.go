package rollout

import (
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// TestZeroWaitLimitIsNoLimit: --provision-timeout, --health-timeout and
// --delete-timeout 0 mean no limit, as --timeout 0 does: a wait that began
// hours ago has not expired, where the same wait under a limit has (exit 4).
// A wait to read the clusters keeps the default --health-timeout under
// --health-timeout 0.
func TestZeroWaitLimitIsNoLimit(t *testing.T) {
	longAgo := time.Now().Add(-3 * time.Hour)
	cases := []struct {
		name string
		kind waitKind
		zero func(*Timeouts)
	}{
		{"provision", waitProvision, func(t *Timeouts) { t.Provision = 0 }},
		{"health", waitHealth, func(t *Timeouts) { t.Health = 0 }},
		{"daemonsets", waitDaemonSets, func(t *Timeouts) { t.Health = 0 }},
		{"delete", waitDeletion, func(t *Timeouts) { t.Delete = 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := wait{kind: tc.kind, reason: "waiting", since: longAgo}
			if err := w.expired(DefaultTimeouts, Step{}, nil); exitcode.Of(err) != exitcode.Timeout {
				t.Fatalf("under the default limit, a wait of 3h: %v, want a timeout", err)
			}
			unlimited := DefaultTimeouts
			tc.zero(&unlimited)
			if err := w.expired(unlimited, Step{}, nil); err != nil {
				t.Fatalf("with a limit of 0, a wait of 3h expired: %v", err)
			}
		})
	}

	t.Run("read", func(t *testing.T) {
		unlimited := DefaultTimeouts
		unlimited.Health = 0
		w := wait{kind: waitRead, reason: "unreachable", since: longAgo}
		if err := w.expired(unlimited, Step{}, nil); exitcode.Of(err) != exitcode.Timeout {
			t.Fatalf("--health-timeout 0, 3h without a read: %v, want a timeout after the default", err)
		}
		w.since = time.Now().Add(-DefaultTimeouts.Health / 2)
		if err := w.expired(unlimited, Step{}, nil); err != nil {
			t.Fatalf("--health-timeout 0, half the default without a read: %v", err)
		}
	})
}
