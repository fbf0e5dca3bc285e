package progress

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestJSONEventsCarryTheDocumentedFields(t *testing.T) {
	var out, errOut bytes.Buffer
	r := New("json", &out, &errOut)
	at := time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	r.Report(Event{Time: at, Cluster: "demo", Namespace: "default", Step: 2, Total: 3, Action: "create", Machine: "cp-x2k9", Phase: Started, Message: "why", ElapsedMs: 5})
	r.Summary(Event{Time: at, Cluster: "demo", Namespace: "default", ElapsedMs: 61000, Requests: &Requests{Management: 7, Workload: 5, Etcd: 3}},
		[]StepTime{{Action: "create", Machine: "cp-x2k9", Duration: 1500 * time.Millisecond}})
	if errOut.Len() != 0 {
		t.Fatalf("JSON mode wrote to stderr: %q", errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got %d: %q", len(lines), out.String())
	}
	for _, l := range lines {
		var ev map[string]any
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"time", "cluster", "namespace", "step", "total", "action", "phase", "message", "elapsedMs"} {
			if _, ok := ev[k]; !ok {
				t.Errorf("event %s lacks %q", l, k)
			}
		}
	}
	if !strings.Contains(lines[1], `"action":"summary"`) || !strings.Contains(lines[1], `"durationMs":1500`) ||
		!strings.Contains(lines[1], `"requests":{"management":7,"workload":5,"etcd":3}`) {
		t.Errorf("summary: %s", lines[1])
	}
}

func TestLinesAreTimestampedOnStderr(t *testing.T) {
	var out, errOut bytes.Buffer
	r := New("text", &out, &errOut) // buffers are not terminals: plain lines
	r.Report(Event{Time: time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC), Step: 1, Total: 3, Action: "delete", Machine: "cp-a", Phase: Done, ElapsedMs: 1200})
	if out.Len() != 0 {
		t.Fatalf("progress went to stdout: %q", out.String())
	}
	if got, want := errOut.String(), "2026-11-30T01:02:03Z [1/3] cp-a delete done (1.2s)\n"; got != want {
		t.Fatalf("line %q, want %q", got, want)
	}
}

func TestSpinnerLineFitsTheTerminal(t *testing.T) {
	line := " [1/3] machine-with-a-long-name await-deletion waiting: the Machine controller reports DrainingNode: evicting pods"
	for _, cols := range []int{10, 40, 80} {
		got := fit(line, cols)
		if n := len([]rune(got)); n > cols {
			t.Fatalf("fit to %d columns gave %d: %q", cols, n, got)
		}
		if !strings.HasSuffix(got, "…") {
			t.Fatalf("a cut line must say it was cut: %q", got)
		}
	}
	if got := fit(line, 0); got != line {
		t.Fatalf("unknown width cut the line: %q", got)
	}
	if got := fit("short", 80); got != "short" {
		t.Fatalf("a line that fits was changed: %q", got)
	}
}
