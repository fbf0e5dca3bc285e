package progress

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/briandowns/spinner"
)

// Fleet shows a run over many clusters, chosen once as New chooses: JSON
// Lines events on out (each already names its cluster); timestamped lines on
// errOut, each prefixed with namespace/cluster; or on a terminal a live
// board of every cluster of the run, which also takes keys.
type Fleet struct {
	json   *jsonReporter
	lines  *sync.Mutex // shared by every cluster's lineReporter
	w      io.Writer
	board  *board
	stages int
}

// FleetKeys are what the board's keys do; either may be nil (then the key
// does nothing).
type FleetKeys struct {
	// StopStarting (key "s"): start no new cluster; those in flight finish
	// (the run stays resumable).
	StopStarting func()
	// Quit (key "q" or ctrl+c): stop now, leaving the run resumable (the
	// caller cancels its context).
	Quit func()
}

// FleetRow is one cluster of the run, known before it starts.
type FleetRow struct {
	Namespace, Cluster string
	Stage              int // 1-based
	// Machines is the control plane's replicas: the "of total" until the
	// run's own events say Total.
	Machines int
}

// NewFleet chooses how a fleet run is shown. The board reads its keys from
// in.
func NewFleet(output string, out, errOut io.Writer, in io.Reader, keys FleetKeys) *Fleet {
	switch {
	case output == "json":
		return &Fleet{json: &jsonReporter{enc: json.NewEncoder(out)}}
	case IsTerminal(out) && IsTerminal(errOut):
		return &Fleet{board: newBoard(errOut, in, keys)}
	default:
		return &Fleet{lines: &sync.Mutex{}, w: errOut}
	}
}

// Plan names the run and its clusters, once, before any starts: on the
// board every row starts out waiting.
func (f *Fleet) Plan(run string, stages int, rows []FleetRow) {
	f.stages = stages
	switch {
	case f.json != nil:
		f.json.encode(struct {
			Time     time.Time `json:"time"`
			Action   string    `json:"action"`
			Run      string    `json:"run"`
			Stages   int       `json:"stages"`
			Clusters int       `json:"clusters"`
		}{time.Now(), "fleet-run", run, stages, len(rows)})
	case f.board != nil:
		f.board.send(planMsg{run: run, stages: stages, rows: rows})
	default:
		f.line("fleet run %s: %s in %s", run, plural(len(rows), "cluster"), plural(stages, "stage"))
	}
}

// Stage reports where stage n (1-based) stands: "running", "soaking",
// "done" or "failed", with a message such as when its soak ends.
func (f *Fleet) Stage(n int, state, message string) {
	switch {
	case f.json != nil:
		f.json.encode(struct {
			Time    time.Time `json:"time"`
			Action  string    `json:"action"`
			Stage   int       `json:"stage"`
			Of      int       `json:"of"`
			Phase   string    `json:"phase"`
			Message string    `json:"message"`
		}{time.Now(), "stage", n, f.stages, state, message})
	case f.board != nil:
		f.board.send(stageMsg{n: n, state: state, message: message})
	default:
		if message != "" {
			message = ": " + message
		}
		f.line("stage %d/%d %s%s", n, f.stages, state, message)
	}
}

// For returns the reporter of one cluster's run; on the board the cluster
// starts running now.
func (f *Fleet) For(namespace, cluster string) Reporter {
	name := namespace + "/" + cluster
	switch {
	case f.json != nil:
		return f.json
	case f.board != nil:
		f.board.send(startMsg{name: name, at: time.Now()})
		return &boardReporter{b: f.board, name: name}
	default:
		return &lineReporter{mu: f.lines, w: f.w, prefix: name + " "}
	}
}

// Skipped reports a cluster the run leaves alone, and why ("outside window:
// next opens Sat 02:00 Europe/Berlin").
func (f *Fleet) Skipped(namespace, cluster, why string) {
	switch {
	case f.json != nil:
		f.json.encode(struct {
			Time      time.Time `json:"time"`
			Action    string    `json:"action"`
			Namespace string    `json:"namespace"`
			Cluster   string    `json:"cluster"`
			Message   string    `json:"message"`
		}{time.Now(), "skipped", namespace, cluster, why})
	case f.board != nil:
		f.board.send(skippedMsg{name: namespace + "/" + cluster, why: why})
	default:
		f.line("%s/%s skipped: %s", namespace, cluster, why)
	}
}

// Finished reports that a cluster's run ended, with a one-line outcome. JSON
// Lines say nothing more: the cluster's own events did.
func (f *Fleet) Finished(namespace, cluster string, ok bool, outcome string) {
	switch {
	case f.board != nil:
		f.board.send(finishedMsg{name: namespace + "/" + cluster, ok: ok, outcome: outcome})
	case f.lines != nil:
		f.line("%s/%s %s", namespace, cluster, outcome)
	}
}

// Stop releases the terminal once the board has drawn its last frame, which
// stays in the scrollback above what the caller prints next.
func (f *Fleet) Stop() {
	if f.board != nil {
		f.board.close()
	}
}

// line writes one timestamped line among the clusters' own.
func (f *Fleet) line(format string, args ...any) {
	f.lines.Lock()
	defer f.lines.Unlock()
	fmt.Fprintf(f.w, "%s %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
}

// encode writes v as one line among the clusters' events.
func (r *jsonReporter) encode(v any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.enc.Encode(v)
}

var boardFrames = spinner.CharSets[14] // the single run's spinner's frames

// plural is n things, in words: "1 cluster", "2 clusters".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
