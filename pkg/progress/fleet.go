package progress

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/briandowns/spinner"
)

// Fleet shows the runs of a command over many clusters, chosen once as New
// chooses: JSON Lines events on out (each already names its cluster);
// timestamped lines on errOut, each prefixed with namespace/cluster; or on a
// terminal a board of one live line per cluster in flight, below the lines
// of the clusters that have finished.
type Fleet struct {
	json  *jsonReporter
	lines *sync.Mutex // shared by every cluster's lineReporter
	w     io.Writer
	board *board
}

// NewFleet chooses how a fleet run is shown.
func NewFleet(output string, out, errOut io.Writer) *Fleet {
	switch {
	case output == "json":
		return &Fleet{json: &jsonReporter{enc: json.NewEncoder(out)}}
	case IsTerminal(out) && IsTerminal(errOut):
		return &Fleet{board: newBoard(errOut)}
	default:
		return &Fleet{lines: &sync.Mutex{}, w: errOut}
	}
}

// For returns the reporter of one cluster's run.
func (f *Fleet) For(namespace, cluster string) Reporter {
	name := namespace + "/" + cluster
	switch {
	case f.json != nil:
		return f.json
	case f.board != nil:
		return f.board.add(name)
	default:
		return &lineReporter{mu: f.lines, w: f.w, prefix: name + " "}
	}
}

// Finished reports that a cluster's run ended, with a one-line outcome: on
// the board its live line gives way to a ✓ or ✗ line; as lines, one more
// line. JSON Lines say nothing more: the cluster's own events did.
func (f *Fleet) Finished(namespace, cluster string, ok bool, outcome string) {
	name := namespace + "/" + cluster
	switch {
	case f.board != nil:
		f.board.finish(name, ok, outcome)
	case f.lines != nil:
		f.lines.Lock()
		defer f.lines.Unlock()
		fmt.Fprintf(f.w, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339), name, outcome)
	}
}

// Stop releases the terminal; the board's last live lines are cleared.
func (f *Fleet) Stop() {
	if f.board != nil {
		f.board.stop()
	}
}

// board redraws one line per cluster in flight below the finished ones.
// briandowns/spinner, which shows a single run, keeps one line only; the
// board moves the cursor up over the lines it drew and draws them again.
type board struct {
	mu       sync.Mutex
	w        io.Writer
	live     []*boardLine // in the order the clusters started
	finished []string     // lines to print above the live ones at the next draw
	drawn    int          // live lines on screen
	frame    int
	ticker   *time.Ticker
	done     chan struct{}
	stopped  sync.Once
}

// boardLine is one cluster's live line; it is the cluster's Reporter.
type boardLine struct {
	b       *board
	name    string
	current Event
	started time.Time
}

var boardFrames = spinner.CharSets[14] // the single run's spinner's frames

func newBoard(w io.Writer) *board {
	b := &board{w: w, ticker: time.NewTicker(100 * time.Millisecond), done: make(chan struct{})}
	go func() {
		for {
			select {
			case <-b.done:
				return
			case <-b.ticker.C:
				b.mu.Lock()
				select {
				case <-b.done: // stopped while this tick waited: stop drew last
				default:
					b.frame++
					b.draw()
				}
				b.mu.Unlock()
			}
		}
	}()
	return b
}

func (b *board) add(name string) *boardLine {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := &boardLine{b: b, name: name, started: time.Now(), current: Event{Action: ConnectAction, Phase: Started}}
	b.live = append(b.live, l)
	return l
}

func (b *board) finish(name string, ok bool, outcome string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, l := range b.live {
		if l.name == name {
			b.live = append(b.live[:i], b.live[i+1:]...)
			break
		}
	}
	mark := "✓"
	if !ok {
		mark = "✗"
	}
	b.finished = append(b.finished, fmt.Sprintf(" %s %s %s", mark, name, outcome))
	b.draw()
}

// draw replaces the live lines on screen with the finished lines not yet
// shown and the live lines as they stand now. The caller holds mu.
func (b *board) draw() {
	var s strings.Builder
	if b.drawn > 0 {
		fmt.Fprintf(&s, "\x1b[%dA", b.drawn) // up to the first live line
	}
	s.WriteString("\r\x1b[J") // and clear from there down
	for _, l := range b.finished {
		s.WriteString(l + "\n")
	}
	b.finished = nil
	cols := width(b.w)
	frame := boardFrames[b.frame%len(boardFrames)]
	for _, l := range b.live {
		e := l.current
		e.ElapsedMs = time.Since(l.started).Milliseconds()
		s.WriteString(fit(frame+" "+l.name+" "+Text(e), cols-1) + "\n")
	}
	b.drawn = len(b.live)
	_, _ = io.WriteString(b.w, s.String())
}

func (b *board) stop() {
	b.stopped.Do(func() {
		b.ticker.Stop()
		close(b.done)
		b.mu.Lock()
		defer b.mu.Unlock()
		b.live = nil
		b.draw()
	})
}

// Report shows the cluster's latest event on its line, timed from when that
// action began.
func (l *boardLine) Report(e Event) {
	l.b.mu.Lock()
	defer l.b.mu.Unlock()
	if e.Phase == Started || l.current.Action != e.Action || l.current.Machine != e.Machine {
		l.started = e.Time.Add(-time.Duration(e.ElapsedMs) * time.Millisecond)
	}
	l.current = e
}

// Summary is left to the fleet's closing table.
func (l *boardLine) Summary(Event, []StepTime) {}

// Stop is the board's, not one cluster's.
func (l *boardLine) Stop() {}
