package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

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

// printer is -o output as a verb with values completes it.
func printer(t *testing.T, values []string, output string) printFlags {
	t.Helper()
	p := printFlags{Output: output, values: values}
	if err := p.complete(); err != nil {
		t.Fatalf("-o %s: %v", output, err)
	}
	return p
}

// plan -l/-A -o json prints each cluster's plan on one line (JSON Lines);
// one cluster's plan stays one indented object.
func TestPlanJSONLinesOverAFleet(t *testing.T) {
	prepared, hops := upgradePlan()
	req := rollout.Request{Operation: "upgrade", Version: "v1.36.3"}
	var one, lines bytes.Buffer
	if err := printPlan(&one, printer(t, planOutputs, "json"), false, req, prepared, hops, nil); err != nil {
		t.Fatal(err)
	}
	if err := printPlan(&lines, printer(t, planOutputs, "json"), true, req, prepared, hops, nil); err != nil {
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
	if err := printPlan(&table, printer(t, planOutputs, "text"), false, req, prepared, hops, nil); err != nil {
		t.Fatal(err)
	}
	want := "#  ACTION  MACHINE      REASON\n1  create  -            replacement for eu1-cp-x2k9 at v1.36.3\n2  delete  eu1-cp-x2k9  eu1-cp-x2k9 is at v1.35.2\n"
	if table.String() != want {
		t.Errorf("plan table:\n%s\nwant:\n%s", table.String(), want)
	}
}

// plan prints one object in every format that reads one: -o yaml is the
// object -o json prints, and jsonpath, go-template and custom-columns read
// it (custom-columns a line per step); -o wide adds the failure domain.
func TestPlanFormats(t *testing.T) {
	prepared, hops := upgradePlan()
	hops[0][0].FailureDomain = "fd-1"
	req := rollout.Request{Operation: "upgrade", Version: "v1.36.3"}
	out := func(output string, jsonLines bool) string {
		t.Helper()
		var b bytes.Buffer
		if err := printPlan(&b, printer(t, planOutputs, output), jsonLines, req, prepared, hops, nil); err != nil {
			t.Fatalf("-o %s: %v", output, err)
		}
		return b.String()
	}
	var fromJSON, fromYAML any
	if err := json.Unmarshal([]byte(out("json", false)), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(out("yaml", false)), &fromYAML); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromJSON, fromYAML) {
		t.Errorf("-o yaml is not the object -o json prints:\njson %v\nyaml %v", fromJSON, fromYAML)
	}
	// Over -l/-A each cluster's yaml is a one-item list: printed in turn,
	// they make one list.
	var list []any
	if err := yaml.Unmarshal([]byte(out("yaml", true)+out("yaml", true)), &list); err != nil || len(list) != 2 || !reflect.DeepEqual(list[0], fromJSON) {
		t.Errorf("-l/-A -o yaml: want a list of the objects, got %v (%v)", list, err)
	}
	for _, tc := range []struct{ output, want string }{
		{"jsonpath={.operation} {.target} {.steps[*].action}", "upgrade v1.36.3 create delete"},
		{`go-template={{range .steps}}{{.index}}:{{.action}} {{end}}`, "1:create 2:delete "},
		{"custom-columns=CLUSTER:.cluster,ACTION:.action,MACHINE:.machine", "CLUSTER  ACTION  MACHINE\neu1      create  <none>\neu1      delete  eu1-cp-x2k9\n"},
		{"wide", "#  ACTION  MACHINE      REASON                                  FAILURE DOMAIN\n1  create  -            replacement for eu1-cp-x2k9 at v1.36.3  fd-1\n2  delete  eu1-cp-x2k9  eu1-cp-x2k9 is at v1.35.2               -\n"},
	} {
		if got := out(tc.output, false); got != tc.want {
			t.Errorf("-o %s:\n%q\nwant:\n%q", tc.output, got, tc.want)
		}
	}
}

// version and wait print one object in every format that reads one.
func TestObjectVerbsFormats(t *testing.T) {
	isolate(t)
	var fromJSON, fromYAML any
	if err := json.Unmarshal([]byte(run(t, "version", "-o", "json").out), &fromJSON); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(run(t, "version", "-o", "yaml").out), &fromYAML); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromJSON, fromYAML) || fromJSON.(map[string]any)["provenKCP"] == nil {
		t.Errorf("version -o yaml is not the object -o json prints:\njson %v\nyaml %v", fromJSON, fromYAML)
	}
	if r := run(t, "version", "-o", "jsonpath={.provenKCP}"); r.err != nil || r.out != fromJSON.(map[string]any)["provenKCP"] {
		t.Errorf("version -o jsonpath={.provenKCP}: %q, %v", r.out, r.err)
	}

	v := waitedDone{Cluster: "eu1", Namespace: "prod", Done: true, Version: "v1.36.3", Waited: "3s"}
	for _, tc := range []struct{ output, want string }{
		{"text", ""},
		{"json", `{"cluster":"eu1","namespace":"prod","done":true,"version":"v1.36.3","waited":"3s"}` + "\n"},
		{"yaml", "cluster: eu1\ndone: true\nnamespace: prod\nversion: v1.36.3\nwaited: 3s\n"},
		{"go-template={{.waited}}", "3s"},
	} {
		p := printer(t, waitOutputs, tc.output)
		var b bytes.Buffer
		if err := p.print(&b, v, p.format == "json", func(tableOptions) error { return nil }); err != nil || b.String() != tc.want {
			t.Errorf("wait -o %s: %v\n%q\nwant %q", tc.output, err, b.String(), tc.want)
		}
	}
}

// reachesRun parses args as the verb args[0] and says whether its options
// passed Validate; what Run would do is not done.
func reachesRun(t *testing.T, args ...string) (bool, result) {
	t.Helper()
	var reached bool
	var r result
	switch args[0] {
	case "upgrade":
		o, res := parse(t, NewCmdUpgrade, args...)
		reached, r = o != nil, res
	case "scale":
		o, res := parse(t, NewCmdScale, args...)
		reached, r = o != nil, res
	case "replace":
		o, res := parse(t, NewCmdReplace, args...)
		reached, r = o != nil, res
	case "rollout":
		o, res := parse(t, NewCmdRollout, args...)
		reached, r = o != nil, res
	case "restart":
		o, res := parse(t, NewCmdRestart, args...)
		reached, r = o != nil, res
	case "plan":
		o, res := parse(t, NewCmdPlan, args...)
		reached, r = o != nil, res
	case "status":
		o, res := parse(t, NewCmdStatus, args...)
		reached, r = o != nil, res
	case "check":
		o, res := parse(t, NewCmdCheck, args...)
		reached, r = o != nil, res
	case "wait":
		o, res := parse(t, NewCmdWait, args...)
		reached, r = o != nil, res
	case "handback":
		o, res := parse(t, NewCmdHandback, args...)
		reached, r = o != nil, res
	case "pause":
		o, res := parse(t, NewCmdPause, args...)
		reached, r = o != nil, res
	case "rbac":
		o, res := parse(t, NewCmdRBAC, args...)
		reached, r = o != nil, res
	case "version":
		o, res := parse(t, func(root *RootOptions, runF func(*VersionOptions) error) *cobra.Command {
			return NewCmdVersion(root.Streams, runF)
		}, args...)
		reached, r = o != nil, res
	default:
		t.Fatalf("no seam for %s", args[0])
	}
	return reached, r
}

// outputVerbs are every verb with what it needs to pass Validate, and the
// -o values it takes (none: it has no -o).
var outputVerbs = []struct {
	args   []string
	values []string
}{
	{[]string{"upgrade", "demo", "--version", "v1.36.3"}, []string{"text", "json"}},
	{[]string{"scale", "demo", "--replicas", "3"}, []string{"text", "json"}},
	{[]string{"replace", "demo", "demo-cp-a"}, []string{"text", "json"}},
	{[]string{"rollout", "demo"}, []string{"text", "json"}},
	{[]string{"restart", "demo"}, []string{"text", "json"}},
	{[]string{"plan", "demo", "--version", "v1.36.3"}, []string{"text", "wide", "json", "yaml", "jsonpath=", "go-template=", "custom-columns="}},
	{[]string{"status", "demo"}, []string{"text", "wide", "json", "yaml", "name", "jsonpath=", "go-template=", "custom-columns="}},
	{[]string{"check", "demo", "--version", "v1.36.3"}, []string{"text", "wide", "json", "yaml", "name", "jsonpath=", "go-template=", "custom-columns="}},
	{[]string{"wait", "demo", "--for", "done"}, []string{"text", "json", "yaml", "jsonpath=", "go-template="}},
	{[]string{"handback", "demo"}, []string{"text", "json", "yaml", "jsonpath=", "go-template="}},
	{[]string{"version"}, []string{"text", "json", "yaml", "jsonpath=", "go-template="}},
	{[]string{"pause", "demo"}, nil},
	{[]string{"rbac", "demo"}, nil},
}

// Every verb × every -o value: a verb takes the values its table lists and
// refuses every other typed one, exit 2, naming its values (or -o, which it
// does not have), before anything is read.
func TestEveryVerbsOutputs(t *testing.T) {
	every := map[string]string{"text": "text", "wide": "wide", "json": "json", "yaml": "yaml", "name": "name",
		"jsonpath=": "jsonpath={.cluster}", "go-template=": "go-template={{.cluster}}", "custom-columns=": "custom-columns=A:.cluster"}
	for _, verb := range outputVerbs {
		for format, value := range every {
			t.Run(verb.args[0]+" -o "+format, func(t *testing.T) {
				isolate(t)
				reached, r := reachesRun(t, append(slices.Clone(verb.args), "-o", value)...)
				switch {
				case slices.Contains(verb.values, format) && !reached:
					t.Errorf("-o %s refused: %v", value, r.err)
				case slices.Contains(verb.values, format):
				case verb.values == nil:
					refused(t, r, exitcode.Usage, "unknown shorthand flag: 'o'")
				default:
					refused(t, r, exitcode.Usage, "--output must be one of "+strings.Join(verb.values, ", "), strconv.Quote(value))
				}
			})
		}
	}
}

// output is one setting of the config file and the environment for every
// verb: a value that a verb cannot print (status's wide) is left out for
// that verb, which runs on in its default; typed, the same value is
// refused. A value no verb prints is a mistake in the setting, named.
func TestConfiguredOutputAVerbCannotPrint(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		file       string
		env        map[string]string
	}{
		{name: "config file", want: "wide", file: "output: wide\n"},
		{name: "environment", want: "custom-columns=A:.cluster", env: map[string]string{"CP_ROLLOUT_OUTPUT": "custom-columns=A:.cluster"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isolateWith(t, tc.file, tc.env)
			for _, args := range [][]string{{"upgrade", "demo", "--version", "v1.36.3"}, {"version"}} {
				reached, r := reachesRun(t, args...)
				if !reached {
					t.Errorf("%v: refused a configured -o it cannot print: %v", args, r.err)
				}
			}
			// version runs on, in text.
			if r := run(t, "version"); r.err != nil || !strings.HasPrefix(r.out, "kubectl-cp_rollout ") {
				t.Errorf("version: %v, %q", r.err, r.out)
			}
			// status still takes it.
			if o, r := parse(t, NewCmdStatus, "status", "demo"); o == nil || o.output.Output != tc.want {
				t.Errorf("status: the configured -o not applied: %+v, %v", o, r.err)
			}
		})
	}
	isolateWith(t, "output: wide\n", nil)
	for _, args := range [][]string{{"upgrade", "demo", "--version", "v1.36.3", "-o", "wide"}, {"version", "-o", "wide"}} {
		_, r := reachesRun(t, args...)
		refused(t, r, exitcode.Usage, `not "wide"`)
	}
	isolateWith(t, "output: xml\n", nil)
	refused(t, run(t, "version"), exitcode.Usage, "config file", `"xml"`, "no verb prints it")
	isolateWith(t, "", map[string]string{"CP_ROLLOUT_OUTPUT": "xml"})
	refused(t, run(t, "status", "demo"), exitcode.Usage, "environment variable CP_ROLLOUT_OUTPUT", `"xml"`)
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
		{"yaml", false, "cluster: eu1\ndone:\n- released the lock held by alice@ops/pid-1\n- 'KCP has nothing to do: every machine is up to date'\nnamespace: prod\n"},
		{"jsonpath={.cluster} {.done[0]}", true, "eu1 released the lock held by alice@ops/pid-1"},
		{"json", false, "{\n  \"cluster\": \"eu1\",\n  \"namespace\": \"prod\",\n  \"done\": [\n    \"released the lock held by alice@ops/pid-1\",\n    \"KCP has nothing to do: every machine is up to date\"\n  ]\n}\n"},
	} {
		var out bytes.Buffer
		if err := printHandedBack(&out, printer(t, handbackOutputs, tc.output), tc.inFleet, h); err != nil || out.String() != tc.want {
			t.Errorf("-o %s, fleet %v: %v\n%s\nwant:\n%s", tc.output, tc.inFleet, err, out.String(), tc.want)
		}
	}
	isolate(t)
	refused(t, run(t, "handback", "demo", "-o", "wide"), exitcode.Usage, `--output must be one of text, json, yaml, jsonpath=, go-template=, not "wide"`)
}
