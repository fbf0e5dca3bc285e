package progress

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFleetLinesNameTheirCluster(t *testing.T) {
	var out, errOut bytes.Buffer
	f := NewFleet("text", &out, &errOut) // buffers are not terminals: lines
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

func TestFleetJSONEventsAreTheClustersOwn(t *testing.T) {
	var out, errOut bytes.Buffer
	f := NewFleet("json", &out, &errOut)
	f.For("default", "demo-1").Report(Event{Cluster: "demo-1", Namespace: "default", Action: "pause", Phase: Done})
	f.Finished("default", "demo-1", true, "done")
	f.Stop()
	if errOut.Len() != 0 || strings.Count(out.String(), "\n") != 1 || !strings.Contains(out.String(), `"cluster":"demo-1"`) {
		t.Fatalf("stdout %q, stderr %q: want the one event, naming its cluster", out.String(), errOut.String())
	}
}

// syncBuffer is a bytes.Buffer the board's ticker may write while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The board redraws one line per cluster in flight, and a finished cluster's
// line is printed above them once, for good.
func TestBoardKeepsALiveLinePerClusterInFlight(t *testing.T) {
	var w syncBuffer
	b := newBoard(&w)
	one, two := b.add("default/demo-1"), b.add("default/demo-2")
	one.Report(Event{Time: time.Now(), Step: 1, Total: 3, Action: "await-healthy", Machine: "cp-a", Phase: Waiting})
	two.Report(Event{Time: time.Now(), Action: "pause", Phase: Started})
	b.mu.Lock()
	b.draw()
	first := w.String()
	b.mu.Unlock()
	for _, want := range []string{"default/demo-1 [1/3] cp-a await-healthy waiting", "default/demo-2 pause started"} {
		if !strings.Contains(first, want) {
			t.Errorf("the board %q lacks %q", first, want)
		}
	}
	b.finish("default/demo-1", false, "failed (exit 3): member cp-a unhealthy")
	b.stop()
	all := w.String()
	if strings.Count(all, "✗ default/demo-1 failed (exit 3)") != 1 {
		t.Errorf("the finished cluster's line is not printed exactly once: %q", all)
	}
	// Every redraw moves up over the live lines it replaces: two, then one.
	after := all[len(first):]
	if !strings.Contains(after, "\x1b[2A") || !strings.HasSuffix(all, "\x1b[1A\r\x1b[J") {
		t.Errorf("the board does not redraw over its live lines and clear them at the end: %q", after)
	}
}
