package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// TestStatusShowsLastOperation: the operation that last finished on the
// cluster is shown, with who ran it and when it finished; a cluster this
// tool never finished anything on shows no such line.
func TestStatusShowsLastOperation(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	finished := now.Add(-time.Minute)
	st := &rollout.Status{Cluster: "demo", Namespace: "default", EtcdManaged: true,
		LastOperation: &controlplane.Record{Operation: "upgrade", Target: "v1.36.3", Who: "ops@bastion/pid-7",
			Started: now.Add(-3 * time.Minute), Finished: &finished}}
	var out bytes.Buffer
	if err := printStatus(&out, st, false, now); err != nil {
		t.Fatal(err)
	}
	want := "LAST OPERATION  upgrade to v1.36.3 by ops@bastion/pid-7, started 2026-12-01T11:57:00Z, finished 2026-12-01T11:59:00Z"
	if !strings.Contains(out.String(), want) {
		t.Errorf("status without %q:\n%s", want, out.String())
	}
	st.LastOperation = nil
	out.Reset()
	if err := printStatus(&out, st, false, now); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "LAST OPERATION") {
		t.Errorf("a last operation shown where there is none:\n%s", out.String())
	}
}

// TestStatusManagementOnly: without the workload cluster, status says that
// etcd was not read instead of showing an empty member table.
func TestStatusManagementOnly(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	st := &rollout.Status{Cluster: "demo", Namespace: "default", EtcdManaged: true, ManagementOnly: true,
		Machines: []rollout.MachineStatus{{Name: "demo-cp-1", Version: "v1.36.3", Node: "n1", Phase: "Running", UpToDate: true, Created: now}}}
	var out bytes.Buffer
	if err := printStatus(&out, st, false, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "demo-cp-1") || !strings.Contains(out.String(), "ETCD  not read") || strings.Contains(out.String(), "ETCD MEMBER") {
		t.Errorf("management-only status:\n%s", out.String())
	}
}
