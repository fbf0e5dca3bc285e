package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// printedAt is the moment the printing tests print at.
var printedAt = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// threeMachines is a cluster's status with three machines, created 26h3m12s,
// 2h and 45s before printedAt, and two etcd members.
func threeMachines() *statusView {
	return &statusView{status: &rollout.Status{Cluster: "demo", Namespace: "default", EtcdManaged: true,
		ControlPlane: rollout.ControlPlaneStatus{Name: "demo-cp", Version: "v1.36.3", Replicas: 3, State: "active"},
		Acting:       rollout.ActingStatus{Who: "nobody"},
		Machines: []rollout.MachineStatus{
			{Name: "demo-cp-a", Version: "v1.35.2", Node: "n-a", FailureDomain: "fd-2", Phase: "Running", Created: printedAt.Add(-(26*time.Hour + 3*time.Minute + 12*time.Second))},
			{Name: "demo-cp-b", Version: "v1.36.3", Node: "n-b", FailureDomain: "fd-3", Phase: "Running", UpToDate: true, Created: printedAt.Add(-2 * time.Hour)},
			{Name: "demo-cp-c", Version: "v1.36.3", Node: "n-c", FailureDomain: "fd-1", Phase: "Provisioned", UpToDate: true, Created: printedAt.Add(-45 * time.Second),
				Problem: "node n-c is not ready"},
		},
		EtcdMembers: []rollout.MemberStatus{
			{Name: "n-a", ID: "a1", Leader: true, Healthy: true, DBSize: 20 << 20},
			{Name: "n-b", ID: "b2", Healthy: true, DBSize: 20 << 20},
		}}}
}

// printAs prints view as `status args...` would (status demo unless args
// select with -A), after the options' validation and --sort-by.
func printAs(t *testing.T, view *statusView, args ...string) string {
	t.Helper()
	isolate(t)
	verb := []string{"status", "demo"}
	if len(args) > 0 && args[0] == "-A" {
		verb = verb[:1]
	}
	o, r := parse(t, NewCmdStatus, append(verb, args...)...)
	if o == nil {
		t.Fatalf("status %v: %v", args, r.err)
	}
	if o.output.sortBy != nil {
		var err error
		if view, err = o.sorted(func(context.Context) (*statusView, error) { return view, nil })(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := o.print(&out, view, printedAt); err != nil {
		t.Fatalf("status demo %v: %v", args, err)
	}
	return out.String()
}

// The default table keeps its layout, with kubectl's column vocabulary
// (UP-TO-DATE) and kubectl's AGE (26h, not 26h3m12s); -o wide adds the
// machines' problems; --no-headers drops the tables' header lines.
func TestStatusTables(t *testing.T) {
	out := printAs(t, threeMachines())
	for _, want := range []string{
		"CLUSTER        default/demo\nACTING         nobody\nCONTROL PLANE  demo-cp  v1.36.3  3 replicas  active\nLOCK           free\n\n",
		"MACHINE    VERSION  NODE  FAILURE DOMAIN  PHASE        UP-TO-DATE  DELETING  AGE\n",
		"demo-cp-a  v1.35.2  n-a   fd-2            Running      false       false     26h\n",
		"demo-cp-b  v1.36.3  n-b   fd-3            Running      true        false     120m\n",
		"demo-cp-c  v1.36.3  n-c   fd-1            Provisioned  true        false     45s\n\n",
		"ETCD MEMBER  ID  LEADER  HEALTHY  LEARNER  DB SIZE  ALARMS\nn-a          a1  true    true     false    20Mi     -\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status without %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "PROBLEM") || strings.Contains(out, "not ready") {
		t.Errorf("status without -o wide shows the wide columns:\n%s", out)
	}
	if out := printAs(t, threeMachines(), "-o", "wide"); !strings.Contains(out, "AGE   PROBLEM                HEALTH CHECK\n") ||
		!strings.Contains(out, "45s   node n-c is not ready  -\n") {
		t.Errorf("status -o wide:\n%s", out)
	}
	out = printAs(t, threeMachines(), "--no-headers")
	if strings.Contains(out, "MACHINE ") || strings.Contains(out, "ETCD MEMBER") || !strings.Contains(out, "\ndemo-cp-a  v1.35.2  n-a") ||
		!strings.Contains(out, "LOCK           free\n") {
		t.Errorf("status --no-headers: want the tables without header lines, the rest as it is:\n%s", out)
	}
}

// AGE and the lock's renewal read as kubectl's AGE.
func TestAgeIsKubectls(t *testing.T) {
	for d, want := range map[time.Duration]string{
		45 * time.Second: "45s", 5*time.Minute + 3*time.Second: "5m3s", 2 * time.Hour: "120m",
		26*time.Hour + 3*time.Minute + 12*time.Second: "26h", 50 * time.Hour: "2d2h",
	} {
		if got := age(printedAt.Add(-d), printedAt); got != want {
			t.Errorf("age of %s: %q, want %q", d, got, want)
		}
	}
	if got := age(time.Time{}, printedAt); got != "<unknown>" {
		t.Errorf("age of no time: %q", got)
	}
	renewed := printedAt.Add(-3 * time.Second)
	v := threeMachines()
	v.status.Lock = &rollout.LockStatus{Holder: "alice@ops/pid-1", RenewTime: &renewed, Live: true}
	if out := printAs(t, v); !strings.Contains(out, "LOCK           alice@ops/pid-1 (renewed 3s ago)\n") {
		t.Errorf("lock line:\n%s", out)
	}
}

// jsonpath and go-template read the JSON -o json prints; custom-columns and
// -o name print a line per machine, the status's natural rows; --sort-by
// orders them.
func TestStatusTemplatesColumnsAndNames(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "jsonpath={.machines[*].name}"}, "demo-cp-a demo-cp-b demo-cp-c"},
		{[]string{"-o", `jsonpath={range .etcdMembers[?(@.leader==true)]}{.name} {.dbSize}{"\n"}{end}`}, "n-a 20971520\n"},
		{[]string{"-o", "go-template={{.controlPlane.name}}: {{range .machines}}{{.name}} {{end}}"}, "demo-cp: demo-cp-a demo-cp-b demo-cp-c "},
		{[]string{"-o", "custom-columns=NAME:.name,VERSION:.version,DOMAIN:{.failureDomain},HEALTH:.healthCheck"},
			"NAME       VERSION  DOMAIN  HEALTH\n" +
				"demo-cp-a  v1.35.2  fd-2    <none>\n" +
				"demo-cp-b  v1.36.3  fd-3    <none>\n" +
				"demo-cp-c  v1.36.3  fd-1    <none>\n"},
		{[]string{"-o", "custom-columns=NAME:.name,UP:.upToDate", "--no-headers", "--sort-by", ".failureDomain"},
			"demo-cp-c  true\ndemo-cp-a  false\ndemo-cp-b  true\n"},
		{[]string{"-o", "name"}, "machine.cluster.x-k8s.io/demo-cp-a\nmachine.cluster.x-k8s.io/demo-cp-b\nmachine.cluster.x-k8s.io/demo-cp-c\n"},
		{[]string{"-o", "name", "--sort-by", "{.created}"}, "machine.cluster.x-k8s.io/demo-cp-a\nmachine.cluster.x-k8s.io/demo-cp-b\nmachine.cluster.x-k8s.io/demo-cp-c\n"},
		{[]string{"-o", "jsonpath={.machines[*].name}", "--sort-by", "failureDomain"}, "demo-cp-c demo-cp-a demo-cp-b"},
	} {
		if got := printAs(t, threeMachines(), tc.args...); got != tc.want {
			t.Errorf("status demo %q:\n%s\nwant:\n%s", tc.args, got, tc.want)
		}
	}
	// The default table is sorted too, and -o json keeps its shape.
	out := printAs(t, threeMachines(), "--sort-by", ".failureDomain")
	if a, c := strings.Index(out, "demo-cp-a  "), strings.Index(out, "demo-cp-c  "); c > a {
		t.Errorf("status --sort-by .failureDomain: demo-cp-c after demo-cp-a:\n%s", out)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(printAs(t, threeMachines(), "-o", "json")), &st); err != nil || st["cluster"] != "demo" || len(st["machines"].([]any)) != 3 {
		t.Errorf("status -o json: %v, %v", err, st)
	}
}

// Over -l/-A the rows are the clusters: -o json prints one compact object
// per line (JSON Lines), custom-columns and -o name a line per cluster,
// jsonpath each row in turn.
func TestFleetStatusOutputs(t *testing.T) {
	fleetView := func() *statusView {
		return &statusView{rows: []fleet.Row{
			{Cluster: fleet.Cluster{Namespace: "prod", Name: "eu1"}, Version: "v1.36.3", Replicas: 3, Machines: 3, UpToDate: 3, Acting: &rollout.ActingStatus{Who: "nobody"}},
			{Cluster: fleet.Cluster{Namespace: "prod", Name: "us1"}, Version: "v1.35.2", Replicas: 5, Machines: 5, UpToDate: 1,
				Acting: &rollout.ActingStatus{Who: "KCP", What: "RollingOut"}},
		}}
	}
	out := printAs(t, fleetView(), "-A", "-o", "json")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("status -A -o json: want a line per cluster:\n%s", out)
	}
	for i, name := range []string{"eu1", "us1"} {
		var row fleet.Row
		if err := json.Unmarshal([]byte(lines[i]), &row); err != nil || row.Name != name || row.Namespace != "prod" {
			t.Errorf("line %d: %v: %s", i+1, err, lines[i])
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", "custom-columns=CLUSTER:.cluster,ACTING:.acting.who", "--sort-by", ".upToDate"}, "CLUSTER  ACTING\nus1      KCP\neu1      nobody\n"},
		{[]string{"-o", "name"}, "cluster.cluster.x-k8s.io/eu1\ncluster.cluster.x-k8s.io/us1\n"},
		{[]string{"-o", `jsonpath={.namespace}/{.cluster} {.version}{"\n"}`}, "prod/eu1 v1.36.3\nprod/us1 v1.35.2\n"},
	} {
		if got := printAs(t, fleetView(), append([]string{"-A"}, tc.args...)...); got != tc.want {
			t.Errorf("status -A %q:\n%s\nwant:\n%s", tc.args, got, tc.want)
		}
	}
	out = printAs(t, fleetView(), "-A", "--no-headers")
	if out != "prod/eu1  v1.36.3  3  3/3  nobody            no  free  -  -\nprod/us1  v1.35.2  5  1/5  KCP (RollingOut)  no  free  -  -\n" {
		t.Errorf("status -A --no-headers:\n%s", out)
	}
}

// A bad -o or --sort-by is refused before anything is read, in one line.
func TestBadPrintFlagsAreUsageErrors(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-o", "jsonpath"}, "--output must be one of text, wide, json, yaml, name, jsonpath=, go-template=, custom-columns=, not \"jsonpath\""},
		{[]string{"-o", "jsonpath="}, "-o jsonpath= needs a template"},
		{[]string{"-o", "jsonpath={.machines["}, "-o jsonpath={.machines[:"},
		{[]string{"-o", "go-template={{.name"}, "-o go-template={{.name:"},
		{[]string{"-o", "custom-columns=NAME"}, "want HEADER:FIELD"},
		{[]string{"-o", "custom-columns=NAME:{{.name}}"}, "want a field path"},
		{[]string{"--sort-by", "{.a}{.b}"}, "--sort-by {.a}{.b}: want a field path"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			refused(t, run(t, append([]string{"status", "demo"}, tc.args...)...), exitcode.Usage, tc.says)
		})
	}
}

// plan -l/-A -o json prints each cluster's plan on one line (JSON Lines);
// one cluster's plan stays one indented object.
func TestPlanJSONLinesOverAFleet(t *testing.T) {
	prepared, hops := upgradePlan()
	req := rollout.Request{Operation: "upgrade", Version: "v1.36.3"}
	var one, lines bytes.Buffer
	if err := printPlan(&one, "json", false, req, prepared, hops, nil); err != nil {
		t.Fatal(err)
	}
	if err := printPlan(&lines, "json", true, req, prepared, hops, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Count(lines.String(), "\n") != 1 || !strings.HasPrefix(lines.String(), `{"cluster":"eu1","namespace":"capi-prod","operation":"upgrade"`) {
		t.Errorf("a fleet's plan: want one line:\n%s", lines.String())
	}
	var a, b any
	if json.Unmarshal(one.Bytes(), &a) != nil || json.Unmarshal(lines.Bytes(), &b) != nil || !strings.Contains(one.String(), "\n  \"steps\": [") {
		t.Errorf("one cluster's plan: want the same object, indented:\n%s", one.String())
	}
	var table bytes.Buffer
	if err := printPlan(&table, "text", false, req, prepared, hops, nil); err != nil {
		t.Fatal(err)
	}
	want := "#  ACTION  MACHINE      REASON\n1  create  -            replacement for eu1-cp-x2k9 at v1.36.3\n2  delete  eu1-cp-x2k9  eu1-cp-x2k9 is at v1.35.2\n"
	if table.String() != want {
		t.Errorf("plan table:\n%s\nwant:\n%s", table.String(), want)
	}
}

// handback -o json prints what it did as {cluster, namespace, done}: one
// indented object for a cluster, one line each over -l/-A; the text form
// names the cluster on each line only over -l/-A.
func TestHandbackOutputs(t *testing.T) {
	h := handedBack{Cluster: "eu1", Namespace: "prod", Done: []string{"released the lock held by alice@ops/pid-1", "KCP has nothing to do: every machine is up to date"}}
	for _, tc := range []struct {
		output  string
		inFleet bool
		want    string
	}{
		{"text", false, "released the lock held by alice@ops/pid-1\nKCP has nothing to do: every machine is up to date\n"},
		{"text", true, "prod/eu1: released the lock held by alice@ops/pid-1\nprod/eu1: KCP has nothing to do: every machine is up to date\n"},
		{"json", true, `{"cluster":"eu1","namespace":"prod","done":["released the lock held by alice@ops/pid-1","KCP has nothing to do: every machine is up to date"]}` + "\n"},
		{"json", false, "{\n  \"cluster\": \"eu1\",\n  \"namespace\": \"prod\",\n  \"done\": [\n    \"released the lock held by alice@ops/pid-1\",\n    \"KCP has nothing to do: every machine is up to date\"\n  ]\n}\n"},
	} {
		var out bytes.Buffer
		if err := printHandedBack(&out, tc.output, tc.inFleet, h); err != nil || out.String() != tc.want {
			t.Errorf("-o %s, fleet %v: %v\n%s\nwant:\n%s", tc.output, tc.inFleet, err, out.String(), tc.want)
		}
	}
	isolate(t)
	refused(t, run(t, "handback", "demo", "-o", "yaml"), exitcode.Usage, `--output must be one of text, json, not "yaml"`)
}
