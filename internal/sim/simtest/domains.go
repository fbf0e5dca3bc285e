package simtest

import (
	"context"
	"testing"

	"github.com/cp-rollout/cp-rollout/internal/sim"
)

// AssertOnePerDomain fails the test unless the control-plane machines are
// spread one per failure domain, every domain used, as KCP places them and
// keeps them. Losing one domain then loses one etcd member, never quorum.
func AssertOnePerDomain(t testing.TB, s *sim.Sim) {
	t.Helper()
	machines, err := s.Machines(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	in := map[string][]string{}
	for _, m := range machines {
		in[m.Spec.FailureDomain] = append(in[m.Spec.FailureDomain], m.Name)
	}
	for fd, names := range in {
		if fd == "" || len(names) != 1 {
			t.Errorf("failure domain %q holds %v: want one machine in each", fd, names)
		}
	}
	if want := s.Options().FailureDomains; len(in) != want {
		t.Errorf("machines in %d failure domains (%v), want %d", len(in), in, want)
	}
}
