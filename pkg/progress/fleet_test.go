package progress

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestFleetLinesNameTheirCluster(t *testing.T) {
	var out, errOut bytes.Buffer
	f := NewFleet("text", &out, &errOut, nil, FleetKeys{}) // buffers are not terminals: lines
	at := time.Date(2026, 12, 2, 1, 2, 3, 0, time.UTC)
	f.For("default", "demo-1").Report(Event{Time: at, Step: 1, Total: 3, Action: "create", Machine: "cp-a", Phase: Done, ElapsedMs: 1200})
	f.For("prod", "eu-2").Report(Event{Time: at, Action: "pause", Phase: Started})
	f.Finished("default", "demo-1", true, "done: 3 replaced in 40s")
	f.Stop()
	if out.Len() != 0 {
		t.Fatalf("progress went to stdout: %q", out.String())
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	want := []string{
		"2026-12-02T01:02:03Z default/demo-1 [1/3] cp-a create done (1.2s)",
		"2026-12-02T01:02:03Z prod/eu-2 pause started",
	}
	for i, w := range want {
		if lines[i] != w {
			t.Errorf("line %d: %q, want %q", i, lines[i], w)
		}
	}
	if len(lines) != 3 || !strings.HasSuffix(lines[2], " default/demo-1 done: 3 replaced in 40s") {
		t.Errorf("the cluster's end: %q", lines)
	}
}

func TestFleetLinesTellThePlanStagesAndSkips(t *testing.T) {
	var out, errOut bytes.Buffer
	f := NewFleet("text", &out, &errOut, nil, FleetKeys{})
	f.Plan("nightly-7", 3, []FleetRow{{Namespace: "a", Cluster: "one", Stage: 1}, {Namespace: "b", Cluster: "two", Stage: 2}})
	f.Stage(2, "soaking", "soak until 07:42:10")
	f.Stage(3, "running", "")
	f.Skipped("prod", "eu-2", "outside window: next opens Sat 02:00 Europe/Berlin")
	f.Stop()
	if out.Len() != 0 {
		t.Fatalf("progress went to stdout: %q", out.String())
	}
	stamp := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ `)
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	want := []string{
		"fleet run nightly-7: 2 clusters in 3 stages",
		"stage 2/3 soaking: soak until 07:42:10",
		"stage 3/3 running",
		"prod/eu-2 skipped: outside window: next opens Sat 02:00 Europe/Berlin",
	}
	if len(lines) != len(want) {
		t.Fatalf("lines %q, want %d", lines, len(want))
	}
	for i, w := range want {
		if !stamp.MatchString(lines[i]) || stamp.ReplaceAllString(lines[i], "") != w {
			t.Errorf("line %d: %q, want a timestamp and %q", i, lines[i], w)
		}
	}
}

func TestFleetJSONEventsAreTheClustersOwn(t *testing.T) {
	var out, errOut bytes.Buffer
	f := NewFleet("json", &out, &errOut, nil, FleetKeys{})
	f.For("default", "demo-1").Report(Event{Cluster: "demo-1", Namespace: "default", Action: "pause", Phase: Done})
	f.Finished("default", "demo-1", true, "done")
	f.Stop()
	if errOut.Len() != 0 || strings.Count(out.String(), "\n") != 1 || !strings.Contains(out.String(), `"cluster":"demo-1"`) {
		t.Fatalf("stdout %q, stderr %q: want the one event, naming its cluster", out.String(), errOut.String())
	}
}

func TestFleetJSONTellsThePlanStagesAndSkips(t *testing.T) {
	var out, errOut bytes.Buffer
	f := NewFleet("json", &out, &errOut, nil, FleetKeys{})
	f.Plan("nightly-7", 3, []FleetRow{{Namespace: "a", Cluster: "one", Stage: 1}, {Namespace: "b", Cluster: "two", Stage: 2}})
	f.Stage(2, "soaking", "soak until 07:42:10")
	f.Skipped("prod", "eu-2", "outside window: next opens Sat 02:00 Europe/Berlin")
	f.Stop()
	if errOut.Len() != 0 {
		t.Fatalf("JSON mode wrote to stderr: %q", errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		`{"action":"fleet-run","run":"nightly-7","stages":3,"clusters":2}`,
		`{"action":"stage","stage":2,"of":3,"phase":"soaking","message":"soak until 07:42:10"}`,
		`{"action":"skipped","namespace":"prod","cluster":"eu-2","message":"outside window: next opens Sat 02:00 Europe/Berlin"}`,
	}
	if len(lines) != len(want) {
		t.Fatalf("lines %q, want %d", lines, len(want))
	}
	for i, l := range lines {
		var fields map[string]any
		if err := json.Unmarshal([]byte(l), &fields); err != nil {
			t.Fatal(err)
		}
		if _, err := time.Parse(time.RFC3339Nano, fields["time"].(string)); err != nil {
			t.Errorf("line %d: time: %v", i, err)
		}
		// The documented fields in their order, time aside.
		if rest := `{` + l[strings.Index(l, `"action"`):]; strings.TrimSpace(rest) != want[i] {
			t.Errorf("line %d: %s, want %s", i, rest, want[i])
		}
	}
}
