package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"

	// A management host or a container may lack the system's zoneinfo; the
	// windows name IANA zones, so the binary carries the database.
	_ "time/tzdata"
)

// WindowAnnotation names a Cluster's maintenance window: the weekly times in
// which a fleet run may start its rollout, as "DAYS HH:MM-HH:MM ZONE", for
// example "Sat 02:00-06:00 Europe/Berlin" or "Mon-Fri 22:00-02:00 UTC"
// (a window that ends before it starts ends the next day); ";" separates
// several.
const WindowAnnotation = "cp-rollout.io/maintenance-window"

// Window is a parsed maintenance window: one or more weekly spans.
type Window struct {
	text  string
	spans []span
}

// span is one weekly opening: on each of days, from start for length, in loc.
type span struct {
	days   [7]bool // by time.Weekday
	start  time.Duration
	length time.Duration
	loc    *time.Location
}

func (w Window) String() string { return w.text }

// IsZero is true for a cluster without a window: it may start at any time.
func (w Window) IsZero() bool { return len(w.spans) == 0 }

var weekdays = map[string]time.Weekday{"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday}

// ParseWindow parses the annotation's value; "" is no window.
//
// No library is used: cron expressions name instants, not spans, and the
// recurrence libraries (RFC 5545) bring far more than a weekly schedule.
func ParseWindow(s string) (Window, error) {
	w := Window{text: strings.TrimSpace(s)}
	for part := range strings.SplitSeq(s, ";") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		sp, err := parseSpan(part)
		if err != nil {
			return Window{}, fmt.Errorf("%s %q: %w (want DAYS HH:MM-HH:MM ZONE, for example \"Sat 02:00-06:00 Europe/Berlin\" or \"Mon-Fri 22:00-02:00 UTC\")", WindowAnnotation, strings.TrimSpace(part), err)
		}
		w.spans = append(w.spans, sp)
	}
	return w, nil
}

func parseSpan(s string) (span, error) {
	fields := strings.Fields(s)
	if len(fields) != 3 {
		return span{}, fmt.Errorf("%d fields, want 3", len(fields))
	}
	var sp span
	for d := range strings.SplitSeq(strings.ToLower(fields[0]), ",") {
		from, to, isRange := strings.Cut(d, "-")
		a, ok := weekdays[from]
		if !ok {
			return span{}, fmt.Errorf("%q is not a day (Mon … Sun)", from)
		}
		b := a
		if isRange {
			if b, ok = weekdays[to]; !ok {
				return span{}, fmt.Errorf("%q is not a day (Mon … Sun)", to)
			}
		}
		for day := a; ; day = (day + 1) % 7 {
			sp.days[day] = true
			if day == b {
				break
			}
		}
	}
	from, to, ok := strings.Cut(fields[1], "-")
	if !ok {
		return span{}, fmt.Errorf("%q is not HH:MM-HH:MM", fields[1])
	}
	start, err := clock(from)
	if err != nil {
		return span{}, err
	}
	end, err := clock(to)
	if err != nil {
		return span{}, err
	}
	sp.start, sp.length = start, end-start
	if sp.length <= 0 { // ends the next day; 00:00-00:00 is the whole day
		sp.length += 24 * time.Hour
	}
	if fields[2] == "Local" { // the zone of whichever machine runs the tool
		return span{}, fmt.Errorf("zone Local means the zone of the machine running the tool: name the cluster's own, such as UTC or Europe/Berlin")
	}
	if sp.loc, err = time.LoadLocation(fields[2]); err != nil {
		return span{}, fmt.Errorf("zone %q: %w", fields[2], err)
	}
	return sp, nil
}

func clock(s string) (time.Duration, error) {
	if s == "24:00" {
		return 24 * time.Hour, nil
	}
	t, err := time.Parse("15:04", s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a time of day HH:MM", s)
	}
	return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute, nil
}

// Opening is one occurrence of a window.
type Opening struct {
	Start, End time.Time
}

// openings lists the window's occurrences that end after now, for the next
// eight days, in start order. Each is computed on the calendar of its zone,
// so that a daylight-saving change moves the hours as people expect.
func (w Window) openings(now time.Time) []Opening {
	var out []Opening
	for _, sp := range w.spans {
		local := now.In(sp.loc)
		midnight := time.Date(local.Year(), local.Month(), local.Day(), 0, 0, 0, 0, sp.loc)
		// From yesterday: yesterday's opening may run past midnight into now.
		for d := -1; d <= 8; d++ {
			day := midnight.AddDate(0, 0, d)
			if !sp.days[day.Weekday()] {
				continue
			}
			// Wall-clock minutes, which time.Date normalises on the zone's
			// calendar: 02:00-06:00 stays 02:00-06:00 on the night the
			// clocks change, though it lasts three or five hours.
			start := time.Date(day.Year(), day.Month(), day.Day(), 0, int(sp.start/time.Minute), 0, 0, sp.loc)
			end := time.Date(day.Year(), day.Month(), day.Day(), 0, int((sp.start+sp.length)/time.Minute), 0, 0, sp.loc)
			if end.After(now) {
				out = append(out, Opening{Start: start, End: end})
			}
		}
	}
	slices.SortFunc(out, func(a, b Opening) int { return a.Start.Compare(b.Start) })
	return out
}

// Decision is whether a cluster may start now, and otherwise when it may.
type Decision struct {
	Now bool
	// Next is the next opening in which the cluster's rollout fits; zero
	// when none does (the window is shorter than the rollout needs).
	Next Opening
	// Why says why not now; empty when Now.
	Why string
}

// Decide says whether a rollout that needs need may start at now: inside an
// opening, with need left before it closes. No window always may.
func (w Window) Decide(now time.Time, need time.Duration) Decision {
	if w.IsZero() {
		return Decision{Now: true}
	}
	var inside *Opening
	for _, o := range w.openings(now) {
		open := !o.Start.After(now)
		if open && inside == nil {
			inside = &o
		}
		if open && o.End.Sub(now) >= need {
			return Decision{Now: true}
		}
		if !open && o.End.Sub(o.Start) >= need {
			why := "its window is " + w.text
			if inside != nil {
				why = fmt.Sprintf("its window %s closes at %s, too soon for a rollout of about %s", w.text, inside.End.Format("15:04 MST"), need)
			}
			return Decision{Next: o, Why: why}
		}
	}
	return Decision{Why: fmt.Sprintf("its window %s is shorter than a rollout of about %s (--machine-time × replicas)", w.text, need)}
}

// When says when a decision lets the cluster go, for plans and records.
func (d Decision) When(now time.Time) string {
	switch {
	case d.Now:
		return "now"
	case d.Next.Start.IsZero():
		return "never: " + d.Why
	}
	return fmt.Sprintf("next window: %s (in %s)", d.Next.Start.Format("Mon 2006-01-02 15:04 MST"), duration.HumanDuration(d.Next.Start.Sub(now)))
}
