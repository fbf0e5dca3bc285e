package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// This file is status -w. It polls: every interval it reads the status
// afresh, as status without -w does, and shows it. The tool's rule is a live
// read before every decision and no caches, and a person watching a rollout
// decides from what is shown: no informer or watch cache stands between the
// clusters and the screen, and a read costs what one status costs.

// clearScreen moves the cursor home and clears the screen. A terminal frame
// is the whole view redrawn after it, as watch(1) does, rather than the
// lines that changed rewritten in place: the view is a few dozen lines every
// few seconds, and a full redraw cannot leave stale characters behind when a
// line gets shorter, a table's columns narrow or the terminal is resized.
const clearScreen = "\x1b[H\x1b[2J"

// watcher shows what read returns again and again, until its context ends.
type watcher struct {
	interval time.Duration
	// terminal redraws the whole view every interval (AGE and the lock's
	// renewal move even when nothing else does); otherwise a block is
	// printed only when the status changed.
	terminal bool
	// json prints each document that changed as one compact line (JSON
	// Lines), on a terminal too: a program reads it.
	json        bool
	out, errOut io.Writer
	now         func() time.Time
	print       func(io.Writer, *statusView, time.Time) error

	printed map[string]string // each document's steady form as last printed, by id
	block   string            // the whole view's steady form as last printed
	blocks  int               // how many blocks were printed (not on a terminal)
	lastErr string            // the last read's error, said once
}

// watcher is the status -w of these options, on stdout.
func (o *StatusOptions) watcher() *watcher {
	return &watcher{
		interval: o.Interval,
		terminal: progress.IsTerminal(o.Streams.Out),
		json:     o.output.format == "json",
		out:      o.Streams.Out,
		errOut:   o.Streams.ErrOut,
		now:      time.Now,
		print:    o.print,
	}
}

// run reads and shows until ctx ends, which is how a watch is meant to end
// (Ctrl-C): that is no error. A first read that fails is the command's
// error, as without -w; a later one is a warning on stderr (said once while
// it stays the same), and the next read tries again.
func (w *watcher) run(ctx context.Context, read func(context.Context) (*statusView, error)) error {
	w.printed = map[string]string{}
	for first := true; ; first = false {
		v, err := read(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && first:
			return err
		case err != nil:
			if msg := err.Error(); msg != w.lastErr {
				fmt.Fprintf(w.errOut, "warning: reading the status again: %v\n", err)
				w.lastErr = msg
			}
		default:
			w.lastErr = ""
			if err := w.show(v); err != nil {
				return err
			}
		}
		timer := time.NewTimer(w.interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// show prints one read as the watcher prints: the documents that changed,
// a terminal frame, or a block headed by its time when the view changed.
func (w *watcher) show(v *statusView) error {
	now := w.now()
	if w.json {
		for _, d := range v.docs() {
			steady, err := steadyForm(d.v)
			if err != nil {
				return err
			}
			if w.printed[d.id] == steady {
				continue
			}
			w.printed[d.id] = steady
			if err := writeJSON(w.out, d.v, true); err != nil {
				return err
			}
		}
		return nil
	}
	var frame bytes.Buffer
	if w.terminal {
		frame.WriteString(clearScreen)
	} else {
		var block bytes.Buffer
		for _, d := range v.docs() {
			steady, err := steadyForm(d.v)
			if err != nil {
				return err
			}
			block.WriteString(d.id + "\n" + steady + "\n")
		}
		if block.String() == w.block {
			return nil
		}
		w.block = block.String()
		if w.blocks > 0 {
			frame.WriteString("\n")
		}
		w.blocks++
	}
	frame.WriteString(now.UTC().Format(time.RFC3339) + "\n")
	if err := w.print(&frame, v, now); err != nil {
		return err
	}
	// One write per frame: a terminal never shows half of one.
	_, err := w.out.Write(frame.Bytes())
	return err
}

// steadyForm is v's JSON without what changes by the clock alone: the lock's
// renewTime, which a run renews every 2 s. A watch compares it to decide
// that the status changed; the lock's holder and whether it is live stay in.
func steadyForm(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	var tree any
	if err := json.Unmarshal(raw, &tree); err != nil {
		return "", err
	}
	dropRenewTime(tree)
	raw, err = json.Marshal(tree)
	return string(raw), err
}

func dropRenewTime(tree any) {
	switch t := tree.(type) {
	case map[string]any:
		delete(t, "renewTime")
		for _, v := range t {
			dropRenewTime(v)
		}
	case []any:
		for _, v := range t {
			dropRenewTime(v)
		}
	}
}
