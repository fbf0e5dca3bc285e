package progress

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

// board is the fleet's live view on a terminal: a bubbletea program that
// owns the terminal from NewFleet to Stop. The rollout goroutines only send
// it messages; the model is touched by the program's event loop alone.
type board struct {
	p    *tea.Program
	done chan struct{} // closed once the program has exited and restored the terminal
	stop sync.Once
}

func newBoard(errOut io.Writer, in io.Reader, keys FleetKeys) *board {
	if keys.StopStarting == nil && keys.Quit == nil {
		// No key does anything: leave the terminal cooked, so ctrl+c stays
		// the shell's interrupt.
		in = nil
	}
	m := newBoardModel(keys)
	// No signal handler: the caller owns SIGINT and SIGTERM, cancels its
	// run and calls Stop, so the board's last frame is drawn and kept.
	p := tea.NewProgram(m, tea.WithOutput(errOut), tea.WithInput(in), tea.WithoutSignalHandler())
	b := &board{p: p, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		_, _ = p.Run()
	}()
	return b
}

// send hands msg to the program. Send itself returns once the program has
// shut down; done also skips a program that never started (Run failed).
func (b *board) send(msg tea.Msg) {
	select {
	case <-b.done:
	default:
		b.p.Send(msg)
	}
}

func (b *board) close() {
	b.stop.Do(func() {
		b.send(finalMsg{})
		<-b.done
	})
}

// boardReporter moves one cluster's row.
type boardReporter struct {
	b    *board
	name string
}

func (r *boardReporter) Report(e Event) { r.b.send(eventMsg{name: r.name, e: e}) }

// Summary is left to the fleet's closing table.
func (r *boardReporter) Summary(Event, []StepTime) {}

// Stop is the board's, not one cluster's.
func (r *boardReporter) Stop() {}

// The board's messages, one per Fleet call, and its own clock.
type (
	planMsg struct {
		run    string
		stages int
		rows   []FleetRow
	}
	stageMsg struct {
		n              int
		state, message string
	}
	startMsg struct {
		name string
		at   time.Time
	}
	eventMsg struct {
		name string
		e    Event
	}
	skippedMsg  struct{ name, why string }
	finishedMsg struct {
		name    string
		ok      bool
		outcome string
	}
	tickMsg  struct{}
	finalMsg struct{}
)

// The rows' results.
const (
	resultWaiting       = "waiting"
	resultRunning       = "running"
	resultDone          = "done"
	resultFailed        = "failed"
	resultStopped       = "stopped"
	resultSkipped       = "skipped"
	resultOutsideWindow = "outside window"
)

type boardRow struct {
	name     string // namespace/cluster
	stage    int
	machines int
	result   string
	last     Event  // the latest event; Action is empty before the first
	note     string // why it was skipped, or how it ended
	started  time.Time
	ended    time.Time
}

// progress is how many of the row's machines are done, of how many: the
// steps before the one in flight (a step is one machine; which of its
// actions ends it is the rollout's to say, not the board's), and all of
// them once the run ended well.
func (r *boardRow) progress() (done, total int) {
	total = r.machines
	if r.last.Total > 0 {
		total = r.last.Total
	}
	if r.result == resultDone {
		return total, total
	}
	return max(r.last.Step-1, 0), total
}

type boardModel struct {
	keys   FleetKeys
	now    func() time.Time
	run    string
	stages int
	stage  stageMsg
	rows   []*boardRow
	byName map[string]*boardRow
	// nameWidth is the CLUSTER column's, kept as rows come.
	nameWidth     int
	width, height int // of the terminal; 0 until the program learns them
	frame         int
	stopping      bool // "s": no new cluster starts
	quitting      bool // "q": the run is being stopped
	final         bool
}

func newBoardModel(keys FleetKeys) *boardModel {
	return &boardModel{keys: keys, now: time.Now, byName: map[string]*boardRow{}, nameWidth: len("CLUSTER")}
}

func tick() tea.Cmd {
	return tea.Tick(100*time.Millisecond, func(time.Time) tea.Msg { return tickMsg{} })
}

func (m *boardModel) Init() tea.Cmd { return tick() }

// row is the cluster's row; a cluster the plan did not name gets one at
// the end rather than going unseen.
func (m *boardModel) row(name string) *boardRow {
	if r, ok := m.byName[name]; ok {
		return r
	}
	r := &boardRow{name: name, result: resultWaiting}
	m.rows = append(m.rows, r)
	m.byName[name] = r
	m.nameWidth = max(m.nameWidth, min(len(name), 40))
	return r
}

func (m *boardModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tea.KeyMsg:
		return m, m.key(msg.String())
	case tickMsg:
		if m.final {
			return m, nil
		}
		m.frame++
		return m, tick()
	case finalMsg:
		m.final = true
		return m, tea.Quit
	case planMsg:
		m.run, m.stages = msg.run, msg.stages
		for _, p := range msg.rows {
			r := m.row(p.Namespace + "/" + p.Cluster)
			r.stage, r.machines = p.Stage, p.Machines
		}
	case stageMsg:
		m.stage = msg
	case startMsg:
		r := m.row(msg.name)
		r.result, r.started = resultRunning, msg.at
	case eventMsg:
		r := m.row(msg.name)
		r.last = msg.e
	case skippedMsg:
		r := m.row(msg.name)
		r.result, r.note = resultSkipped, msg.why
		if strings.HasPrefix(msg.why, resultOutsideWindow) {
			r.result = resultOutsideWindow
		}
	case finishedMsg:
		r := m.row(msg.name)
		r.note, r.ended = msg.outcome, m.now()
		switch {
		case msg.ok:
			r.result = resultDone
		case m.quitting:
			r.result = resultStopped
		default:
			r.result = resultFailed
		}
	}
	return m, nil
}

// key runs a key's callback as a command, off the event loop: a callback
// that calls back into the Fleet would otherwise wait on the loop itself.
func (m *boardModel) key(k string) tea.Cmd {
	var call func()
	switch k {
	case "s":
		if m.stopping || m.quitting || m.keys.StopStarting == nil {
			return nil
		}
		m.stopping, call = true, m.keys.StopStarting
	case "q", "ctrl+c":
		if m.quitting || m.keys.Quit == nil {
			return nil
		}
		m.quitting, call = true, m.keys.Quit
	default:
		return nil
	}
	return func() tea.Msg { call(); return nil }
}

// order ranks the rows shown when not all fit: what moves first, then what
// went wrong, then what is still to come.
func order(result string) int {
	switch result {
	case resultRunning:
		return 0
	case resultFailed, resultStopped:
		return 1
	case resultWaiting:
		return 2
	case resultDone:
		return 3
	}
	return 4
}

const (
	stageWidth    = len("STAGE")
	machinesWidth = len("MACHINES")
	elapsedWidth  = len("1h02m03s")
)

func (m *boardModel) View() string {
	width := m.width
	if width <= 0 {
		width = 80
	}
	lines := []string{m.summary()}
	lines = append(lines, m.line(width, "STAGE", "CLUSTER", "STEP", "MACHINES", "ELAPSED", "RESULT"))

	rows := m.rows
	more := 0
	if m.height > 0 {
		// The summary, the header, "… N more", the help line and the empty
		// line the cursor rests on (bubbletea erases it when it stops).
		room := max(m.height-5, 0)
		if len(rows) > room+1 { // "… 1 more" would take the row's own line
			rows = slices.Clone(rows)
			slices.SortStableFunc(rows, func(a, b *boardRow) int { return order(a.result) - order(b.result) })
			rows, more = rows[:room], len(rows)-room
		}
	}
	for _, r := range rows {
		lines = append(lines, m.rowLine(width, r))
	}
	if more > 0 {
		lines = append(lines, fmt.Sprintf("… %d more", more))
	}
	if help := m.help(); help != "" {
		lines = append(lines, help)
	}
	for i, l := range lines {
		lines[i] = fit(l, width)
	}
	return strings.Join(lines, "\n") + "\n"
}

func (m *boardModel) rowLine(width int, r *boardRow) string {
	stage := "-"
	if r.stage > 0 {
		stage = fmt.Sprint(r.stage)
	}
	step, elapsed := r.note, "-"
	switch r.result {
	case resultRunning:
		e := r.last
		if e.Action == "" {
			e = Event{Action: ConnectAction, Phase: Started}
		}
		// MACHINES and ELAPSED have the step count and the time.
		e.Step, e.Total, e.ElapsedMs = 0, 0, 0
		step = Text(e)
		elapsed = m.now().Sub(r.started).Round(time.Second).String()
	case resultDone, resultFailed, resultStopped:
		if !r.started.IsZero() {
			elapsed = r.ended.Sub(r.started).Round(time.Second).String()
		}
	}
	done, total := r.progress()
	result := r.result
	if result == resultRunning && !m.final {
		result = boardFrames[m.frame%len(boardFrames)] + " " + result
	}
	return m.line(width, stage, r.name, step, fmt.Sprintf("%d/%d", done, total), elapsed, result)
}

// line lays out one row: STEP takes what the other columns leave.
func (m *boardModel) line(width int, stage, name, step, machines, elapsed, result string) string {
	stepWidth := max(width-(stageWidth+m.nameWidth+machinesWidth+elapsedWidth+len(resultOutsideWindow)+5*2), 10)
	return fmt.Sprintf("%-*s  %-*s  %-*s  %-*s  %-*s  %s",
		stageWidth, stage, m.nameWidth, fit(name, m.nameWidth), stepWidth, fit(step, stepWidth),
		machinesWidth, machines, elapsedWidth, elapsed, result)
}

// summary counts every row, shown or not.
func (m *boardModel) summary() string {
	counts := map[string]int{}
	for _, r := range m.rows {
		counts[r.result]++
	}
	parts := []string{"fleet"}
	if m.run != "" {
		parts[0] = "fleet run " + m.run
	}
	if m.stage.n > 0 {
		parts = append(parts, fmt.Sprintf("stage %d/%d %s", m.stage.n, m.stages, m.stage.state))
	}
	for _, r := range []string{resultDone, resultRunning, resultFailed, resultWaiting} {
		parts = append(parts, fmt.Sprintf("%d %s", counts[r], r))
	}
	for _, r := range []string{resultStopped, resultSkipped, resultOutsideWindow} {
		if counts[r] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[r], r))
		}
	}
	// The stage's message goes last: a narrow terminal cuts it, not a count.
	if m.stage.n > 0 && m.stage.message != "" {
		parts = append(parts, m.stage.message)
	}
	return strings.Join(parts, " · ")
}

// help says what the keys do, and what they did.
func (m *boardModel) help() string {
	if m.final {
		return ""
	}
	resume := "the run stays resumable"
	if m.run != "" {
		resume += ": --resume " + m.run
	}
	var parts []string
	switch {
	case m.quitting:
		return "quitting: the clusters in flight stop; " + resume
	case m.stopping:
		parts = append(parts, "no new cluster will start; those in flight finish")
	case m.keys.StopStarting != nil:
		parts = append(parts, "s stop starting new clusters")
	}
	if m.keys.Quit != nil {
		parts = append(parts, "q quit ("+resume+")")
	}
	return strings.Join(parts, " · ")
}
