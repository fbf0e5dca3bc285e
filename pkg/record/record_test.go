package record

import (
	"regexp"
	"testing"
)

// TestWhoDiffersPerProcess: two processes with the same user, host name and
// PID (containers) still name different holders (who is what each process
// computes once), and one process always names itself the same.
func TestWhoDiffersPerProcess(t *testing.T) {
	if Who() != Who() {
		t.Fatalf("Who changed within one process: %s, %s", Who(), Who())
	}
	if !regexp.MustCompile(`^.+@.*/pid-\d+-[a-z0-9]{5}$`).MatchString(Who()) {
		t.Errorf("Who() = %q, want user@host/pid-N-random", Who())
	}
	seen := map[string]bool{}
	for range 20 {
		seen[who()] = true
	}
	if len(seen) != 20 {
		t.Errorf("20 identities computed on one host with one PID: %d distinct, want 20", len(seen))
	}
}
