package progress

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
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
	// Cut by columns, not runes: each of these characters takes two.
	if got, want := fit("✓ [1/3] ノードを削除しています", 12), "✓ [1/3] ノ…"; got != want {
		t.Fatalf("wide characters cut to %q, want %q", got, want)
	}
	if got, want := fit("failed: line one\nline two", 40), "failed: line one line two"; got != want {
		t.Fatalf("a multi-line message gave %q, want %q on one line", got, want)
	}
}

// An upgrade through several versions places every event in its hop, and
// the summary gives each hop's time ahead of its steps.
func TestHopsInEventsAndSummary(t *testing.T) {
	var out, errOut bytes.Buffer
	r := New("text", &out, &errOut)
	hop1, hop2 := Hop{Index: 1, Of: 2, Version: "v1.35.2"}, Hop{Index: 2, Of: 2, Version: "v1.36.3"}
	r.Report(Event{Time: time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC), Step: 1, Total: 2, Action: "create", Phase: Started, Hop: hop1})
	r.Summary(Event{ElapsedMs: 9000}, []StepTime{
		{Action: "create", Machine: "a", Duration: 2 * time.Second, Hop: hop1},
		{Action: "delete", Machine: "b", Duration: 3 * time.Second, Hop: hop1},
		{Action: "create", Machine: "c", Duration: 4 * time.Second, Hop: hop2},
	})
	got := errOut.String()
	lines := strings.Split(got, "\n")
	if lines[0] != "2026-11-30T01:02:03Z hop 1/2 v1.35.2 [1/2] create started" {
		t.Errorf("event line %q, want its hop ahead of it", lines[0])
	}
	// Each hop's line, with its time, is followed by its steps, indented.
	var summary []string
	for _, l := range lines[2:] {
		summary = append(summary, strings.Join(strings.Fields(l), " ")+map[bool]string{true: " (step)", false: ""}[strings.HasPrefix(l, "    ")])
	}
	if got, want := strings.Join(summary, "; "), "hop 1/2 v1.35.2 5s; create a 2s (step); delete b 3s (step); hop 2/2 v1.36.3 4s; create c 4s (step); "; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
	var js bytes.Buffer
	New("json", &js, &errOut).Report(Event{Action: "create", Hop: hop2})
	if !strings.Contains(js.String(), `"hop":2,"hops":2,"hopVersion":"v1.36.3"`) {
		t.Errorf("JSON event %s lacks hop, hops and hopVersion", js.String())
	}
}

// steps are three steps that end well, one with a message too long for a
// 40-column terminal, then one that fails.
var steps = []Event{
	{Step: 1, Total: 3, Action: "create", Machine: "cp-a", Phase: Started},
	{Step: 1, Total: 3, Action: "create", Machine: "cp-a", Phase: Done, ElapsedMs: 1200},
	{Step: 2, Total: 3, Action: "delete", Machine: "cp-b", Phase: Started},
	{Step: 2, Total: 3, Action: "delete", Machine: "cp-b", Phase: Done, Message: "drained node-b → evicted 14 pods", ElapsedMs: 65000},
	{Step: 3, Total: 3, Action: "await-kcp", Phase: Started},
	{Step: 3, Total: 3, Action: "await-kcp", Phase: Done, ElapsedMs: 300},
	{Step: 3, Total: 3, Action: "handback", Phase: Started},
	{Step: 3, Total: 3, Action: "handback", Phase: Failed, Message: "forbidden", ElapsedMs: 100},
}

// fakeTerminal is the terminal form drawing on w, cols wide. The spinner
// itself draws only when stdout is a terminal; it is disabled so that it never
// draws into w even when go test's stdout is one, and w holds exactly what the
// reporter writes itself.
func fakeTerminal(w io.Writer, cols int) *spinnerReporter {
	r := newSpinnerReporter(w, func() int { return cols })
	r.s.Disable()
	return r
}

// On a terminal every step that ended stays on screen as one line, in order,
// cut to the terminal's width.
func TestTerminalKeepsALinePerFinishedStep(t *testing.T) {
	const cols = 40
	var w bytes.Buffer
	r := fakeTerminal(&w, cols)
	at := time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	for _, e := range steps {
		e.Time = at
		r.Report(e)
	}
	r.Stop()
	want := []string{
		"✓ [1/3] cp-a create done (1.2s)",
		"✓ [2/3] cp-b delete done: drained node…",
		"✓ [3/3] await-kcp done (300ms)",
		"✗ [3/3] handback failed: forbidden (10…",
	}
	got := strings.Split(strings.TrimSuffix(w.String(), "\n"), "\n")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("terminal lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, l := range got {
		if n := utf8.RuneCountInString(l); n > cols {
			t.Errorf("%q is %d runes, wider than %d columns", l, n, cols)
		}
	}
}

// The spinner's own line is cut to the terminal's columns and to the bytes
// spinner v1.23.2 counts when it erases (see liveSuffix): were it counted
// wider than the terminal, every redraw would erase the ✓ line above it.
func TestSpinnerLineNeverErasesTheLineAbove(t *testing.T) {
	const cols = 60
	r := fakeTerminal(io.Discard, cols)
	r.Report(Event{Time: time.Now(), Step: 2, Total: 3, Action: "await-deletion", Machine: "cp-b", Phase: Waiting,
		Message: "DrainingNode → evicting pods"})
	r.s.PreUpdate(r.s)
	for _, frame := range spinnerFrames {
		if n := len("\r" + frame + r.s.Suffix); n > cols {
			t.Fatalf("the spinner counts %q as %d, wider than %d: it would erase the line above", frame+r.s.Suffix, n, cols)
		}
		if n := utf8.RuneCountInString(frame + r.s.Suffix); n > cols-1 {
			t.Fatalf("the spinner's line %q takes %d columns, more than %d", frame+r.s.Suffix, n, cols-1)
		}
	}
	if !strings.HasPrefix(r.s.Suffix, " [2/3] cp-b await-deletion waiting: DrainingNode →") || !strings.HasSuffix(r.s.Suffix, "…") {
		t.Fatalf("the spinner's line %q", r.s.Suffix)
	}
}

// Pipes and CI logs get every line whole, with its time, as before the
// terminal kept its lines: no mark, nothing cut.
func TestLinesOffATerminalAreUnchanged(t *testing.T) {
	var out, errOut bytes.Buffer
	r := New("text", &out, &errOut)
	at := time.Date(2026, 11, 30, 1, 2, 3, 0, time.UTC)
	for _, e := range steps {
		e.Time = at
		r.Report(e)
	}
	r.Stop()
	want := "2026-11-30T01:02:03Z [1/3] cp-a create started\n" +
		"2026-11-30T01:02:03Z [1/3] cp-a create done (1.2s)\n" +
		"2026-11-30T01:02:03Z [2/3] cp-b delete started\n" +
		"2026-11-30T01:02:03Z [2/3] cp-b delete done: drained node-b → evicted 14 pods (1m5s)\n" +
		"2026-11-30T01:02:03Z [3/3] await-kcp started\n" +
		"2026-11-30T01:02:03Z [3/3] await-kcp done (300ms)\n" +
		"2026-11-30T01:02:03Z [3/3] handback started\n" +
		"2026-11-30T01:02:03Z [3/3] handback failed: forbidden (100ms)\n"
	if out.Len() != 0 || errOut.String() != want {
		t.Fatalf("stdout %q, stderr:\n%s\nwant:\n%s", out.String(), errOut.String(), want)
	}
}
