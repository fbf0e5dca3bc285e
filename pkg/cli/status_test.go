package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// TestStatusShowsLastOperation: the operation that last finished on the
// cluster is shown, with who ran it and when it finished; a cluster this
// tool never finished anything on shows no such line.
func TestStatusShowsLastOperation(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	finished := now.Add(-time.Minute)
	st := &rollout.Status{Cluster: "demo", Namespace: "default", EtcdManaged: true,
		LastOperation: &record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "ops@bastion/pid-7",
			Started: now.Add(-3 * time.Minute), Finished: &finished}}
	var out bytes.Buffer
	if err := printStatus(&out, st, tableOptions{}, now); err != nil {
		t.Fatal(err)
	}
	want := "LAST OPERATION  upgrade to v1.36.3 by ops@bastion/pid-7, started 2026-12-01T11:57:00Z, finished 2026-12-01T11:59:00Z"
	if !strings.Contains(out.String(), want) {
		t.Errorf("status without %q:\n%s", want, out.String())
	}
	st.LastOperation = nil
	out.Reset()
	if err := printStatus(&out, st, tableOptions{}, now); err != nil {
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
	if err := printStatus(&out, st, tableOptions{}, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "demo-cp-1") || !strings.Contains(out.String(), "ETCD  not read") || strings.Contains(out.String(), "ETCD MEMBER") {
		t.Errorf("management-only status:\n%s", out.String())
	}
}

// TestStatusWithoutKubeadmConfigs: a machine whose up-to-dateness status
// could not judge without its KubeadmConfig shows unknown, not false; and
// the warning names what was not read, in which namespace, who lacks it,
// the Role that grants it, and what UP-TO-DATE shows instead.
func TestStatusWithoutKubeadmConfigs(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	st := &rollout.Status{Cluster: "demo", Namespace: "default", EtcdManaged: true, ManagementOnly: true, KubeadmConfigsNotRead: true,
		Machines: []rollout.MachineStatus{
			{Name: "demo-cp-1", Version: "v1.36.3", UpToDate: true, Created: now},
			{Name: "demo-cp-2", Version: "v1.36.3", UpToDateUnknown: true, Created: now},
			{Name: "demo-cp-3", Version: "v1.35.2", Created: now}}}
	var out bytes.Buffer
	if err := printStatus(&out, st, tableOptions{}, now); err != nil {
		t.Fatal(err)
	}
	verdicts := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 5 && strings.HasPrefix(f[0], "demo-cp-") {
			verdicts[f[0]] = f[5] // NODE, FAILURE DOMAIN and PHASE are "-"
		}
	}
	if want := map[string]string{"demo-cp-1": "true", "demo-cp-2": "unknown", "demo-cp-3": "false"}; fmt.Sprint(verdicts) != fmt.Sprint(want) {
		t.Errorf("UP-TO-DATE %v, want %v:\n%s", verdicts, want, out.String())
	}

	o := NewStatusOptions(genericiooptions.IOStreams{})
	o.conn.Namespace, o.conn.Cluster = "default", "demo"
	warning := o.kubeadmConfigsWarning(context.Background(), authorizerFor(readOnlyAccess))
	for _, want := range []string{"warning: KubeadmConfigs not read", "node-join token", "kubeadmconfigs.bootstrap.cluster.x-k8s.io in namespace default",
		"which oncall lacks", "Role cp-rollout-operate-demo grants it", "`kubectl cp-rollout rbac demo -n default`", "unknown where KCP has not judged"} {
		if !strings.Contains(warning, want) {
			t.Errorf("the warning does not say %q: %s", want, warning)
		}
	}
}

// TestStatusShowsAFailedRun: a control plane a failed run left paused says
// so on its one CONTROL PLANE line, and the operation's own line says who
// ran it and when it failed.
func TestStatusShowsAFailedRun(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rec := &record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "ops@bastion/pid-7", Started: now.Add(-time.Hour),
		LastFailure: &record.Failure{Reason: "machine demo-cp-1: etcd member n1 is unhealthy", Time: now.Add(-time.Minute), ExitCode: 3}}
	st := &rollout.Status{Cluster: "demo", Namespace: "default", EtcdManaged: true, Operation: rec,
		ControlPlane: rollout.ControlPlaneStatus{Name: "demo-cp", Version: "v1.36.3", Replicas: 3, Paused: true, PausedByUs: true}}
	var out bytes.Buffer
	if err := printStatus(&out, st, tableOptions{}, now); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"CONTROL PLANE  demo-cp  v1.36.3  3 replicas  paused by cp-rollout since 2026-12-01T11:00:00Z, last run failed: machine demo-cp-1: etcd member n1 is unhealthy\n",
		"OPERATION      upgrade to v1.36.3 by ops@bastion/pid-7, started 2026-12-01T11:00:00Z; last run failed 2026-12-01T11:59:00Z (exit 3)\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status without %q:\n%s", want, out.String())
		}
	}

	// Resumed and running again: no failure to tell.
	rec.LastFailure = nil
	out.Reset()
	if err := printStatus(&out, st, tableOptions{}, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "paused by cp-rollout since 2026-12-01T11:00:00Z\n") || strings.Contains(out.String(), "failed") {
		t.Errorf("status of a pause without a failure:\n%s", out.String())
	}
}

// TestFleetStatusMarksAFailedRun: over a fleet, an operation whose last run
// failed says so in its column, without the reason, which status CLUSTER
// shows.
func TestFleetStatusMarksAFailedRun(t *testing.T) {
	rec := &record.Record{Operation: "upgrade", Target: "v1.36.3"}
	if got := operation(rec); got != "upgrade to v1.36.3" {
		t.Errorf("operation %q", got)
	}
	rec.LastFailure = &record.Failure{Reason: "machine m1: etcd member n1 is unhealthy", ExitCode: 4}
	if got := operation(rec); got != "upgrade to v1.36.3, last run failed (exit 4)" {
		t.Errorf("operation whose run failed: %q", got)
	}
}

// TestStatusShowsPause: a pause set by `pause` says who set it, since when
// and why; one a run set names the run's operation; a record written before
// reasons existed reads as it did.
func TestStatusShowsPause(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		rec  record.Record
		want string
	}{
		{record.Record{Operation: "pause", Who: "ops@bastion/pid-7", Started: now.Add(-time.Hour), Reason: "CHG-1234: audit flags"},
			"paused by cp-rollout pause (ops@bastion/pid-7, since 2026-12-01T11:00:00Z, reason: CHG-1234: audit flags)"},
		{record.Record{Operation: "pause", Who: "ops@bastion/pid-7", Started: now.Add(-time.Hour)},
			"paused by cp-rollout pause (ops@bastion/pid-7, since 2026-12-01T11:00:00Z)"},
		{record.Record{Operation: "restart", Target: "every machine", Who: "ops@bastion/pid-7", Started: now.Add(-time.Hour)},
			"OPERATION      restart to every machine by ops@bastion/pid-7, started 2026-12-01T11:00:00Z"},
	} {
		rec := tc.rec
		st := &rollout.Status{Cluster: "demo", Namespace: "default", Operation: &rec,
			ControlPlane: rollout.ControlPlaneStatus{Name: "demo-cp", Paused: true, PausedByUs: true}}
		var out bytes.Buffer
		if err := printStatus(&out, st, tableOptions{}, now); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("status without %q:\n%s", tc.want, out.String())
		}
	}
}

// TestStatusShowsTheKCPController: the line after CONTROL PLANE gives the KCP
// controller's version and whether this tool is proven with it, or, when it
// could not be read, a short reason and nothing of the advice to pass
// --kcp-version, which status does not take; -o json says the same.
func TestStatusShowsTheKCPController(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	first, last := rollout.ProvenKCPMinors[0], rollout.ProvenKCPMinors[len(rollout.ProvenKCPMinors)-1]
	proven := fmt.Sprintf("v%d.%d.6", first.Major, first.Minor)
	newer := fmt.Sprintf("v%d.%d.0", last.Major, last.Minor+1)
	provenRange := rollout.ProvenKCPRange()
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "deployments"}, controlplane.KCPControllerDeployment, errors.New("RBAC"))
	for _, tc := range []struct {
		name     string
		version  string
		err      error
		line     string
		wantJSON string
	}{
		{"proven", proven, nil, proven + " (proven: " + provenRange + ")",
			`{"version":"` + proven + `","proven":true}`},
		{"not proven", newer, nil, newer + " (not proven: this tool is proven with " + provenRange + "; upgrade, scale, replace, restart and rollout refuse it)",
			`{"version":"` + newer + `","proven":false}`},
		{"get and list refused", "", exitcode.Unsafef("no KCP controller Deployment, and Deployments elsewhere may not be listed (%w): pass --kcp-version", forbidden),
			"unknown (forbidden)", `{"proven":false,"error":"forbidden"}`},
		{"not found", "", exitcode.Unsafef("no KubeadmControlPlane controller Deployment found: pass --kcp-version for a custom install"),
			"unknown (not found)", `{"proven":false,"error":"not found"}`},
		{"no answer", "", fmt.Errorf("finding the KCP controller: %w", &url.Error{Op: "Get", URL: "https://mgmt:6443/apis/apps/v1", Err: errors.New("connection refused")}),
			"unknown (connection refused)", `{"proven":false,"error":"connection refused"}`},
	} {
		st := &rollout.Status{Cluster: "demo", Namespace: "default", EtcdManaged: true,
			ControlPlane:  rollout.ControlPlaneStatus{Name: "demo-cp", Version: "v1.36.3", Replicas: 3},
			KCPController: kcpController(tc.version, tc.err)}
		var out bytes.Buffer
		if err := printStatus(&out, st, tableOptions{}, now); err != nil {
			t.Fatal(err)
		}
		want := "CONTROL PLANE   demo-cp  v1.36.3  3 replicas  active\nKCP CONTROLLER  " + tc.line + "\n"
		if !strings.Contains(out.String(), want) {
			t.Errorf("%s: status without %q:\n%s", tc.name, want, out.String())
		}
		raw, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		if got := `"kcpController":` + tc.wantJSON; !strings.Contains(string(raw), got) {
			t.Errorf("%s: JSON without %s:\n%s", tc.name, got, raw)
		}
	}

	// Not looked for: no line, no field.
	st := &rollout.Status{Cluster: "demo", Namespace: "default", ControlPlane: rollout.ControlPlaneStatus{Name: "demo-cp"}}
	var out bytes.Buffer
	if err := printStatus(&out, st, tableOptions{}, now); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(st)
	if strings.Contains(out.String(), "KCP CONTROLLER") || strings.Contains(string(raw), "kcpController") {
		t.Errorf("a KCP controller shown that was not looked for:\n%s\n%s", out.String(), raw)
	}
}
