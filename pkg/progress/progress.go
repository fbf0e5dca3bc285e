// Package progress shows what a run is doing, behind one interface chosen once
// per run: a spinner when a person watches a terminal, timestamped lines when
// output goes to a log, and JSON Lines events for scripts (-o json).
package progress

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/briandowns/spinner"
	"golang.org/x/term"
	textwidth "golang.org/x/text/width"
)

// Phase is where an action stands.
type Phase string

const (
	Started Phase = "started"
	Waiting Phase = "waiting"
	Done    Phase = "done"
	Failed  Phase = "failed"
)

// The events that close a run's stream, besides the steps' own (rollout's
// Action constants): docs/output.md documents each.
const (
	// SummaryAction ends a finished run, with every step's time.
	SummaryAction = "summary"
	// ErrorAction ends the output of a failed run.
	ErrorAction = "error"
	// FleetAction ends a run over several clusters, with each one's result.
	FleetAction = "fleet"
)

// ConnectAction is what the fleet board shows of a cluster whose run has
// reported no step yet: it is connecting. No event carries it.
const ConnectAction = "connect"

// Event is one progress report. Its JSON form is a stable, documented
// interface for scripts: fields are only ever added.
type Event struct {
	Time      time.Time `json:"time"`
	Cluster   string    `json:"cluster"`
	Namespace string    `json:"namespace"`
	// Step counts machines replaced or added/removed so far (1-based); Total is
	// how many the run needs. Both are 0 for events outside a step.
	Step    int    `json:"step"`
	Total   int    `json:"total"`
	Action  string `json:"action"`
	Machine string `json:"machine,omitempty"`
	Phase   Phase  `json:"phase"`
	Message string `json:"message"`
	// ElapsedMs is the time since the action started.
	ElapsedMs int64 `json:"elapsedMs"`
	// HeldMs, on a done event, is the part of the step during which the
	// cluster itself refused it: etcd rejects a membership change until its
	// members have been connected for five seconds, so removing a member
	// right after a replacement joined waits on etcd, not on the tool.
	HeldMs int64 `json:"heldMs,omitempty"`
	// Requests, on the summary alone, counts the run's round trips.
	Requests *Requests `json:"requests,omitempty"`
	// Hop places the event in an upgrade through several versions.
	Hop
}

// Failure is the JSON object that ends the output of a failed run with -o
// json, so that a script reading stdout learns how the run ended without
// parsing stderr: an event under action "error", phase "failed", with the
// exit code and its class (exitcode.Class). Cluster and namespace are there
// when the run acted on one cluster and had resolved them.
type Failure struct {
	Time      time.Time `json:"time"`
	Cluster   string    `json:"cluster,omitempty"`
	Namespace string    `json:"namespace,omitempty"`
	Action    string    `json:"action"`
	Phase     Phase     `json:"phase"`
	// ExitCode is named as in the "fleet" event.
	ExitCode int    `json:"exitCode"`
	Class    string `json:"class"`
	Message  string `json:"message"`
}

// WriteFailure writes f, as action "error" and phase "failed", on one line.
func WriteFailure(w io.Writer, f Failure) error {
	f.Action, f.Phase = ErrorAction, Failed
	return json.NewEncoder(w).Encode(f)
}

// Hop is one rollout of an upgrade through several versions (--via): hop
// Index of Of, to Version. It is zero for a run of one rollout.
type Hop struct {
	Index   int    `json:"hop,omitempty"`
	Of      int    `json:"hops,omitempty"`
	Version string `json:"hopVersion,omitempty"`
}

func (h Hop) String() string { return fmt.Sprintf("hop %d/%d %s", h.Index, h.Of, h.Version) }

// Requests counts a run's round trips: HTTP requests to the management and
// the workload API servers, and etcd RPCs.
type Requests struct {
	Management int64 `json:"management"`
	Workload   int64 `json:"workload"`
	Etcd       int64 `json:"etcd"`
}

// StepTime is one line of the closing summary.
type StepTime struct {
	Action   string        `json:"action"`
	Machine  string        `json:"machine,omitempty"`
	Duration time.Duration `json:"-"`
	Ms       int64         `json:"durationMs"`
	Hop
}

// Reporter receives a run's events.
type Reporter interface {
	Report(Event)
	// Summary closes a run with each action's duration; run carries the
	// event fields (time, cluster, namespace, elapsed) of the whole run.
	Summary(run Event, steps []StepTime)
	// Stop releases the terminal (stops a spinner).
	Stop()
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// New chooses the reporter once: JSON Lines on out for "json"; otherwise a
// spinner on errOut when both out and errOut are terminals, else plain lines
// on errOut (data goes to stdout, progress to stderr).
func New(output string, out, errOut io.Writer) Reporter {
	switch {
	case output == "json":
		return &jsonReporter{enc: json.NewEncoder(out)}
	case IsTerminal(out) && IsTerminal(errOut):
		return newSpinnerReporter(errOut, terminalWidth(errOut))
	default:
		return &lineReporter{mu: &sync.Mutex{}, w: errOut}
	}
}

type jsonReporter struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (r *jsonReporter) Report(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.enc.Encode(e)
}

// The summary is an event like the others (action "summary", phase "done",
// elapsedMs the whole run) with the list of steps added.
func (r *jsonReporter) Summary(run Event, steps []StepTime) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range steps {
		steps[i].Ms = steps[i].Duration.Milliseconds()
	}
	run.Action, run.Phase = SummaryAction, Done
	_ = r.enc.Encode(struct {
		Event
		Steps []StepTime `json:"steps"`
	}{run, steps})
}

func (r *jsonReporter) Stop() {}

// Text renders an event as one line, without the time.
func Text(e Event) string {
	var b strings.Builder
	if e.Hop.Index > 0 {
		b.WriteString(e.Hop.String() + " ")
	}
	if e.Total > 0 {
		fmt.Fprintf(&b, "[%d/%d] ", e.Step, e.Total)
	}
	if e.Machine != "" {
		b.WriteString(e.Machine + " ")
	}
	fmt.Fprintf(&b, "%s %s", e.Action, e.Phase)
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.ElapsedMs > 0 && e.Phase != Started {
		fmt.Fprintf(&b, " (%s)", (time.Duration(e.ElapsedMs) * time.Millisecond).Round(100*time.Millisecond))
	}
	return b.String()
}

// summaryLines are the text summary: each step's duration and, in an
// upgrade through several versions, each hop's ahead of its steps.
func summaryLines(run Event, steps []StepTime) []string {
	lines := []string{fmt.Sprintf("done in %s:", (time.Duration(run.ElapsedMs) * time.Millisecond).Round(100*time.Millisecond))}
	hops := map[int]time.Duration{}
	for _, s := range steps {
		hops[s.Hop.Index] += s.Duration
	}
	indent, current := "  ", 0
	for _, s := range steps {
		if s.Hop.Index > 0 && s.Hop.Index != current {
			current, indent = s.Hop.Index, "    "
			lines = append(lines, fmt.Sprintf("  %-50s %s", s.Hop.String(), hops[current].Round(100*time.Millisecond)))
		}
		what := s.Action
		if s.Machine != "" {
			what += " " + s.Machine
		}
		lines = append(lines, fmt.Sprintf("%s%-*s %s", indent, 52-len(indent), what, s.Duration.Round(100*time.Millisecond)))
	}
	if r := run.Requests; r != nil {
		lines = append(lines, fmt.Sprintf("requests: %d to the management API server, %d to the workload API server, %d to etcd",
			r.Management, r.Workload, r.Etcd))
	}
	return lines
}

// lineReporter writes timestamped lines. Over a fleet every cluster's
// reporter shares one mutex, so lines never interleave, and prefixes its
// lines with the cluster's namespace/name.
type lineReporter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
}

func (r *lineReporter) Report(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.w, "%s %s%s\n", e.Time.UTC().Format(time.RFC3339), r.prefix, Text(e))
}

func (r *lineReporter) Summary(run Event, steps []StepTime) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range summaryLines(run, steps) {
		fmt.Fprintln(r.w, r.prefix+l)
	}
}

func (r *lineReporter) Stop() {}

// spinnerReporter keeps one spinning line for the action in progress and,
// above it, a ✓ or ✗ line for every action that ended, so the run's history
// stays on screen as kind's does.
type spinnerReporter struct {
	mu      sync.Mutex
	w       io.Writer
	s       *spinner.Spinner
	cols    func() int // the terminal's width, read again for each line as it may be resized
	current Event      // the action the spinner shows; zero once it ended
	started time.Time
}

// spinnerFrames are the spinner's characters, all of the same length.
var spinnerFrames = spinner.CharSets[14]

// newSpinnerReporter draws on w, cols wide; tests pass any writer and width.
func newSpinnerReporter(w io.Writer, cols func() int) *spinnerReporter {
	s := spinner.New(spinnerFrames, 100*time.Millisecond, spinner.WithWriter(w))
	r := &spinnerReporter{w: w, s: s, cols: cols}
	// The suffix is refreshed on every tick so the elapsed time runs.
	s.PreUpdate = func(s *spinner.Spinner) {
		r.mu.Lock()
		defer r.mu.Unlock()
		e := r.current
		e.ElapsedMs = time.Since(r.started).Milliseconds()
		e.Phase = Waiting
		s.Suffix = liveSuffix(Text(e), r.cols())
	}
	return r
}

// liveSuffix is what follows the spinner's character: text cut so that the
// line never wraps, as a wrapped line cannot be redrawn in place.
//
// spinner v1.23.2 erases its line before each redraw and on Stop, and when it
// counts the line wider than the terminal it also moves up and erases the line
// above: the ✓ line of the step before. It counts the line's bytes, not its
// columns, so a line cut to the columns is still counted wider (its braille
// character, "→" and "…" are 3 bytes each) and would climb one line per tick
// over the run's history.
// The suffix is therefore cut both to the columns and to the bytes the
// spinner counts ("\r", the character and the suffix).
func liveSuffix(text string, cols int) string {
	// The character takes one column; the last stays free so that the cursor
	// never waits past the edge.
	line := fit(" "+text, cols-2)
	return cut(line, cols-1-len(spinnerFrames[0]), utf8.RuneLen)
}

// terminalWidth is the width in columns of the terminal w, and never more
// than stdin's when stdin is a terminal too: spinner v1.23.2 measures stdin
// when it decides how many lines to erase (see liveSuffix).
func terminalWidth(w io.Writer) func() int {
	return func() int {
		cols := width(w)
		if term.IsTerminal(int(os.Stdin.Fd())) {
			cols = min(cols, width(os.Stdin))
		}
		return cols
	}
}

// width is the terminal's width in columns; 80, the classic terminal's, when
// it cannot be read.
func width(w io.Writer) int {
	if f, ok := w.(*os.File); ok {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols > 0 {
			return cols
		}
	}
	return 80
}

// fit cuts line to at most cols columns, so that it takes one line of the
// terminal: control characters (the newlines of a multi-line message) become
// spaces, and a line that was cut ends with "…". cols <= 0 cuts nothing.
func fit(line string, cols int) string {
	line = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, line)
	return cut(line, cols, columns)
}

// columns is how many columns a terminal gives r: two for the wide characters
// of East Asian scripts and emoji, none for combining marks and format
// characters (zero-width joiner), one otherwise ("→", "…" and the like).
func columns(r rune) int {
	if unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf) {
		return 0
	}
	switch textwidth.LookupRune(r).Kind() {
	case textwidth.EastAsianWide, textwidth.EastAsianFullwidth:
		return 2
	}
	return 1
}

// cut shortens line to at most max, measured rune by rune with size, ending
// it with "…". max <= 0 leaves it whole.
func cut(line string, max int, size func(rune) int) string {
	if max <= 0 {
		return line
	}
	n := 0
	for _, r := range line {
		n += size(r)
	}
	if n <= max {
		return line
	}
	room := max - size('…')
	if room < 0 {
		return ""
	}
	var b strings.Builder
	n = 0
	for _, r := range line {
		if n+size(r) > room {
			break
		}
		b.WriteRune(r)
		n += size(r)
	}
	return b.String() + "…"
}

func (r *spinnerReporter) Report(e Event) {
	r.mu.Lock()
	switch e.Phase {
	case Started, Waiting:
		if e.Phase == Started || r.current.Action != e.Action || r.current.Machine != e.Machine {
			r.started = e.Time.Add(-time.Duration(e.ElapsedMs) * time.Millisecond)
		}
		r.current = e
		r.mu.Unlock()
		r.s.Start()
		return
	}
	// An event may end an action other than the one on the spinner (a lone
	// failed event, as when left-overs cannot be looked for); the spinner
	// comes back for the one still in progress.
	ended := r.current.Action == e.Action && r.current.Machine == e.Machine
	if ended {
		r.current = Event{}
	}
	resume := r.current.Action != ""
	r.mu.Unlock()
	// Stop erases the spinner's line and leaves the cursor at its start, so
	// the mark line replaces it without fragments. It is not the spinner's
	// FinalMSG: Stop writes that only while the spinner runs, and an action
	// may end without one (a lone done event, or stdout is not a terminal).
	// mu is not held: the spinner's tick holds its own lock while it takes mu.
	r.s.Stop()
	mark := "✓ "
	if e.Phase == Failed {
		mark = "✗ "
	}
	// The mark takes the spinner character's column and the space after it,
	// so the text lines up with the spinner's.
	fmt.Fprintln(r.w, fit(mark+Text(e), r.cols()-1))
	if resume {
		r.s.Start()
	}
}

func (r *spinnerReporter) Summary(run Event, steps []StepTime) {
	r.s.Stop()
	for _, l := range summaryLines(run, steps) {
		fmt.Fprintln(r.w, l)
	}
}

func (r *spinnerReporter) Stop() { r.s.Stop() }
