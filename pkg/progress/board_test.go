package progress

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

var boardNow = time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)

// testBoard is a board model on a fixed clock, fed the messages of a run.
func testBoard(keys FleetKeys, width, height int, msgs ...tea.Msg) *boardModel {
	m := newBoardModel(keys)
	m.now = func() time.Time { return boardNow }
	m.Update(tea.WindowSizeMsg{Width: width, Height: height})
	for _, msg := range msgs {
		m.Update(msg)
	}
	return m
}

func plan(n, stages int) planMsg {
	p := planMsg{run: "nightly-7", stages: stages}
	for i := range n {
		p.rows = append(p.rows, FleetRow{Namespace: "fleet", Cluster: fmt.Sprintf("c%04d", i), Stage: 1 + i*stages/n, Machines: 3})
	}
	return p
}

func started(name string, ago time.Duration) startMsg {
	return startMsg{name: name, at: boardNow.Add(-ago)}
}

func viewLines(m *boardModel) []string {
	return strings.Split(strings.TrimSuffix(m.View(), "\n"), "\n")
}

// rowOf is the line of the row named name, or "".
func rowOf(m *boardModel, name string) string {
	for _, l := range viewLines(m) {
		if strings.Contains(l, " "+name+" ") {
			return l
		}
	}
	return ""
}

func TestBoardSummaryCountsEveryRow(t *testing.T) {
	m := testBoard(FleetKeys{StopStarting: func() {}, Quit: func() {}}, 160, 40,
		plan(8, 3),
		stageMsg{n: 2, state: "soaking", message: "soak until 07:42:10"},
		started("fleet/c0000", time.Minute), finishedMsg{name: "fleet/c0000", ok: true, outcome: "done: 3 replaced in 1m0s"},
		started("fleet/c0001", time.Minute), finishedMsg{name: "fleet/c0001", outcome: "failed (exit 3): member cp-a unhealthy"},
		started("fleet/c0002", 72*time.Second),
		eventMsg{name: "fleet/c0002", e: Event{Step: 1, Total: 3, Action: "await-healthy", Machine: "cp-a", Phase: Waiting, Message: "etcd member joining"}},
		skippedMsg{name: "fleet/c0007", why: "outside window: next opens Sat 02:00 Europe/Berlin"},
	)
	lines := viewLines(m)
	if want := "fleet run nightly-7 · stage 2/3 soaking · 1 done · 1 running · 1 failed · 4 waiting · 1 outside window · soak until 07:42:10"; lines[0] != want {
		t.Errorf("summary %q, want %q", lines[0], want)
	}
	if len(lines) != 2+8+1 {
		t.Fatalf("want the summary, the header, 8 rows and the help: %q", lines)
	}
	// With room for all, the rows keep the plan's order.
	for i, l := range lines[2:10] {
		if !strings.Contains(l, fmt.Sprintf("fleet/c%04d", i)) {
			t.Errorf("row %d: %q", i, l)
		}
	}
	for name, want := range map[string][]string{
		"fleet/c0000": {"done: 3 replaced", "3/3", "1m0s", "done"},
		"fleet/c0001": {"failed (exit 3)", "0/3", "failed"},
		"fleet/c0002": {"cp-a await-healthy waiting: etcd member joining", "0/3", "1m12s", "running"},
		"fleet/c0003": {"0/3", "waiting"},
		"fleet/c0007": {"outside window: next opens Sat 02:00", "outside window"},
	} {
		row := rowOf(m, name)
		for _, w := range want {
			if !strings.Contains(row, w) {
				t.Errorf("row %s %q lacks %q", name, row, w)
			}
		}
	}
	if want := "s stop starting new clusters · q quit (the run stays resumable: --resume nightly-7)"; lines[len(lines)-1] != want {
		t.Errorf("help %q, want %q", lines[len(lines)-1], want)
	}
	// The last frame stays in the scrollback: no keys to offer, no spinner.
	if _, cmd := m.Update(finalMsg{}); cmd == nil || cmd() != tea.Quit() {
		t.Error("the final message does not quit the program")
	}
	last := viewLines(m)
	if len(last) != len(lines)-1 || strings.Contains(m.View(), "quit") || !strings.HasSuffix(rowOf(m, "fleet/c0002"), "  running") {
		t.Errorf("the last frame: %q", last)
	}
}

func TestBoardFitsTheTerminalHeight(t *testing.T) {
	msgs := []tea.Msg{plan(1000, 3),
		started("fleet/c0000", time.Minute), finishedMsg{name: "fleet/c0000", ok: true},
		started("fleet/c0001", time.Minute), finishedMsg{name: "fleet/c0001"},
		started("fleet/c0500", time.Second),
		started("fleet/c0900", time.Second),
	}
	m := testBoard(FleetKeys{Quit: func() {}}, 120, 12, msgs...)
	lines := viewLines(m)
	if len(lines)+1 > 12 { // and the line the cursor rests on
		t.Fatalf("%d lines on a terminal of 12: %q", len(lines), lines)
	}
	if want := "fleet run nightly-7 · 1 done · 2 running · 1 failed · 996 waiting"; lines[0] != want {
		t.Errorf("summary %q, want %q", lines[0], want)
	}
	// Running first, then failed, then waiting in plan order; done ones wait
	// for room.
	order := []string{"fleet/c0500", "fleet/c0900", "fleet/c0001", "fleet/c0002", "fleet/c0003", "fleet/c0004", "fleet/c0005"}
	rows := lines[2 : 2+len(order)]
	for i, name := range order {
		if !strings.Contains(rows[i], name) {
			t.Errorf("row %d: %q, want %s", i, rows[i], name)
		}
	}
	if got, want := lines[2+len(order)], "… 993 more"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	// Taller, everything fits in plan order, without "more".
	m.Update(tea.WindowSizeMsg{Width: 120, Height: 2000})
	if v := m.View(); strings.Contains(v, "more") || !strings.Contains(viewLines(m)[2], "fleet/c0000") {
		t.Errorf("a tall terminal still cuts the board: %q", viewLines(m)[:4])
	}
}

func TestBoardTrimsRowsToTheWidth(t *testing.T) {
	long := strings.Repeat("a-very-long-cluster-name-", 4)
	m := testBoard(FleetKeys{StopStarting: func() {}, Quit: func() {}}, 50, 20, plan(2, 1),
		started("fleet/c0000", time.Second), started("ns/"+long, time.Second),
		eventMsg{name: "fleet/c0000", e: Event{Action: "await-deletion", Machine: "machine-with-a-long-name", Phase: Waiting, Message: strings.Repeat("drain ", 30)}},
	)
	for _, l := range viewLines(m) {
		if n := len([]rune(l)); n > 50 {
			t.Errorf("%d columns on a terminal of 50: %q", n, l)
		}
	}
}

func TestBoardCountsMachinesDone(t *testing.T) {
	name := "fleet/c0000"
	m := testBoard(FleetKeys{}, 160, 20, plan(1, 1))
	machines := func() string {
		f := strings.Fields(rowOf(m, name))
		for _, w := range f {
			if strings.Count(w, "/") == 1 && w[0] >= '0' && w[0] <= '9' {
				return w
			}
		}
		return ""
	}
	steps := []struct {
		e    tea.Msg
		want string
	}{
		{started(name, 0), "0/3"},
		{eventMsg{name, Event{Action: "pause", Phase: Done}}, "0/3"},
		{eventMsg{name, Event{Step: 1, Total: 4, Action: "create", Machine: "cp-a", Phase: Done}}, "0/4"},
		{eventMsg{name, Event{Step: 1, Total: 4, Action: "delete", Machine: "cp-x", Phase: Done}}, "0/4"},
		{eventMsg{name, Event{Step: 1, Total: 4, Action: "await-deletion", Machine: "cp-x", Phase: Waiting}}, "0/4"},
		{eventMsg{name, Event{Step: 2, Total: 4, Action: "create", Machine: "cp-b", Phase: Started}}, "1/4"},
		{eventMsg{name, Event{Step: 3, Total: 4, Action: "create", Machine: "cp-c", Phase: Started}}, "2/4"},
		{finishedMsg{name: name, ok: true}, "4/4"},
	}
	for i, s := range steps {
		m.Update(s.e)
		if got := machines(); got != s.want {
			t.Errorf("after message %d (%+v): machines %q, want %q", i, s.e, got, s.want)
		}
	}
}

func TestBoardKeys(t *testing.T) {
	var stops, quits int
	m := testBoard(FleetKeys{StopStarting: func() { stops++ }, Quit: func() { quits++ }}, 160, 20,
		plan(2, 1), started("fleet/c0000", time.Second))
	press := func(k tea.KeyMsg) {
		if _, cmd := m.Update(k); cmd != nil {
			cmd() // bubbletea would run it off the event loop
		}
	}
	help := func() string { l := viewLines(m); return l[len(l)-1] }

	press(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{'x'}})
	press(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{'s'}})
	press(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{'s'}})
	if stops != 1 || quits != 0 {
		t.Errorf("after x, s, s: StopStarting called %d times, Quit %d; want 1 and 0", stops, quits)
	}
	if h := help(); !strings.HasPrefix(h, "no new cluster will start") || !strings.Contains(h, "q quit") {
		t.Errorf("help after s: %q", h)
	}

	press(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune{'q'}})
	press(tea.KeyMsg{Type: tea.KeyCtrlC})
	if quits != 1 {
		t.Errorf("after q and ctrl+c: Quit called %d times, want 1", quits)
	}
	if h := help(); !strings.HasPrefix(h, "quitting") || !strings.Contains(h, "--resume nightly-7") {
		t.Errorf("help after q: %q", h)
	}
	// A cluster cut short by the quit was stopped, not failed.
	m.Update(finishedMsg{name: "fleet/c0000", outcome: "failed (exit 130): context canceled"})
	if row := rowOf(m, "fleet/c0000"); !strings.HasSuffix(row, "stopped") {
		t.Errorf("row after q: %q", row)
	}

	// Without callbacks the keys do nothing.
	m = testBoard(FleetKeys{}, 160, 20, plan(1, 1))
	for _, k := range []tea.KeyMsg{{Type: tea.KeyRunes, Runes: []rune{'s'}}, {Type: tea.KeyRunes, Runes: []rune{'q'}}, {Type: tea.KeyCtrlC}} {
		if _, cmd := m.Update(k); cmd != nil {
			t.Errorf("%s without a callback returns a command", k)
		}
	}
	if strings.Contains(m.View(), "quit") {
		t.Errorf("the help offers keys that do nothing: %q", m.View())
	}
}

// syncBuffer is a bytes.Buffer the program's renderer may write while the
// test reads it.
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

// The program itself, on a writer that is no terminal: keys come from in,
// Stop draws the last frame and returns, and a report after Stop does not
// block.
func TestBoardProgramReadsKeysAndStops(t *testing.T) {
	var w syncBuffer
	stopped := make(chan struct{})
	b := newBoard(&w, strings.NewReader("s"), FleetKeys{StopStarting: func() { close(stopped) }})
	f := &Fleet{board: b}
	f.Plan("nightly-7", 1, []FleetRow{{Namespace: "fleet", Cluster: "one", Stage: 1, Machines: 3}})
	r := f.For("fleet", "one")
	r.Report(Event{Step: 1, Total: 3, Action: "delete", Machine: "cp-a", Phase: Done})
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("key s from in never called StopStarting")
	}
	f.Finished("fleet", "one", true, "done: 3 replaced in 1s")
	ended := make(chan struct{})
	go func() {
		f.Stop()
		r.Report(Event{Action: "late", Phase: Done})
		f.Stop()
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop, or a report after it, blocks")
	}
	// The frames are diffs of one another, so only what reached the screen
	// is certain: the finished row, then the terminal given back.
	out := w.String()
	if !strings.Contains(out, "1 done") || !strings.Contains(out, "3/3") || !strings.HasSuffix(out, "\x1b[?1006l") {
		t.Errorf("the board's output: %q", out)
	}
}
