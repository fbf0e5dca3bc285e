package fleet

import (
	"strings"
	"testing"
	"time"
)

// at is a fixed instant in UTC, "2006-01-02 15:04"; 2026-12-07 is a Monday.
func at(t *testing.T, s string) time.Time {
	t.Helper()
	now, err := time.Parse("2006-01-02 15:04", s)
	if err != nil {
		t.Fatal(err)
	}
	return now
}

func mustWindow(t *testing.T, s string) Window {
	t.Helper()
	w, err := ParseWindow(s)
	if err != nil {
		t.Fatalf("ParseWindow(%q): %v", s, err)
	}
	return w
}

func TestParseWindowRefusesWhatIsNotAWeeklySpanNamingTheBadPart(t *testing.T) {
	for _, tc := range []struct {
		value string
		// The error names the span and its bad part.
		want []string
	}{
		{"Sat 02:00-06:00", []string{`"Sat 02:00-06:00"`, "2 fields, want 3"}},
		{"Sat 02:00-06:00 UTC extra", []string{"4 fields, want 3"}},
		{"Saturday 02:00-06:00 UTC", []string{`"saturday" is not a day`}},
		{"Mon-Frx 22:00-02:00 UTC", []string{`"frx" is not a day`}},
		{"Mon- 22:00-02:00 UTC", []string{`"" is not a day`}},
		{"Sat 02:00 UTC", []string{`"02:00" is not HH:MM-HH:MM`}},
		{"Sat 02:00-25:00 UTC", []string{`"25:00" is not a time of day HH:MM`}},
		{"Sat 2-6 UTC", []string{`"2" is not a time of day HH:MM`}},
		{"Sat 02:00-06:00 Mars/Olympus_Mons", []string{`zone "Mars/Olympus_Mons"`}},
		// The bad span of several is the one named.
		{"Sat 02:00-06:00 UTC; Sun 03:00-07:00 Europe/Nowhere", []string{`"Sun 03:00-07:00 Europe/Nowhere"`, `zone "Europe/Nowhere"`}},
	} {
		t.Run(tc.value, func(t *testing.T) {
			w, err := ParseWindow(tc.value)
			if err == nil {
				t.Fatalf("ParseWindow(%q) = %q, want an error", tc.value, w)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error %q is more than one line", msg)
			}
			want := append([]string{WindowAnnotation, "want DAYS HH:MM-HH:MM ZONE"}, tc.want...)
			for _, part := range want {
				if !strings.Contains(msg, part) {
					t.Errorf("error %q does not say %q", msg, part)
				}
			}
		})
	}
}

func TestParseWindowReadsDaysTimesAndZones(t *testing.T) {
	for _, tc := range []struct {
		value string
		spans int
		// A day and a time inside, and one outside; both UTC.
		in, out string
	}{
		{"Sat 02:00-06:00 UTC", 1, "2026-12-12 02:00", "2026-12-12 06:00"},
		{"  sat 02:00-06:00 UTC  ", 1, "2026-12-12 05:59", "2026-12-13 03:00"},
		{"Sat,Tue 02:00-06:00 UTC", 1, "2026-12-08 03:00", "2026-12-09 03:00"},
		{"Mon-Wed 10:00-11:00 UTC", 1, "2026-12-08 10:30", "2026-12-10 10:30"},
		// 00:00-00:00 and 00:00-24:00 are the whole day.
		{"Sun 00:00-00:00 UTC", 1, "2026-12-13 23:59", "2026-12-14 00:00"},
		{"Sun 00:00-24:00 UTC", 1, "2026-12-13 00:00", "2026-12-12 23:59"},
		{"Sat 02:00-04:00 UTC; Wed 20:00-23:00 UTC;", 2, "2026-12-09 22:00", "2026-12-09 23:00"},
		// Europe/Berlin is an hour ahead of UTC in December.
		{"Sat 02:00-06:00 Europe/Berlin", 1, "2026-12-12 01:00", "2026-12-12 05:00"},
	} {
		t.Run(tc.value, func(t *testing.T) {
			w := mustWindow(t, tc.value)
			if w.IsZero() || len(w.spans) != tc.spans {
				t.Fatalf("%d spans, want %d", len(w.spans), tc.spans)
			}
			if w.String() != strings.TrimSpace(tc.value) {
				t.Errorf("String() = %q, want the value as given, trimmed", w.String())
			}
			if d := w.Decide(at(t, tc.in), 0); !d.Now {
				t.Errorf("at %s: %+v, want inside", tc.in, d)
			}
			if d := w.Decide(at(t, tc.out), 0); d.Now {
				t.Errorf("at %s: inside, want outside", tc.out)
			}
		})
	}
	for _, none := range []string{"", "  ", ";"} {
		if w, err := ParseWindow(none); err != nil || !w.IsZero() {
			t.Errorf("ParseWindow(%q) = %v, %v: want no window", none, w.spans, err)
		}
	}
}

func TestWindowDecideSaysWhenAClusterMayStart(t *testing.T) {
	const weeknights = "Mon-Fri 22:00-02:00 UTC"
	for _, tc := range []struct {
		name, window, now string
		need              time.Duration
		wantNow           bool
		wantNext          string // UTC; "" for none
		wantWhy           string // a part of Why
		wantWhen          string
	}{
		{
			name: "Saturday 01:00 is inside Friday's opening", window: weeknights, now: "2026-12-12 01:00", need: 30 * time.Minute,
			wantNow: true, wantWhen: "now",
		},
		{
			name: "inside, but it closes too soon", window: weeknights, now: "2026-12-12 01:00", need: 2 * time.Hour,
			wantNext: "2026-12-14 22:00", wantWhy: "its window Mon-Fri 22:00-02:00 UTC closes at 02:00 UTC, too soon for a rollout of about 2h0m0s",
			wantWhen: "next window: Mon 2026-12-14 22:00 UTC (in 2d21h)",
		},
		{
			name: "inside with exactly enough left", window: weeknights, now: "2026-12-11 23:00", need: 3 * time.Hour,
			wantNow: true, wantWhen: "now",
		},
		{
			name: "Saturday noon waits for Monday night", window: weeknights, now: "2026-12-12 12:00", need: time.Hour,
			wantNext: "2026-12-14 22:00", wantWhy: "its window is Mon-Fri 22:00-02:00 UTC",
			wantWhen: "next window: Mon 2026-12-14 22:00 UTC (in 2d10h)",
		},
		{
			// Sunday night is not an opening: Monday 01:00 is outside.
			name: "Monday 01:00 waits for Monday night", window: weeknights, now: "2026-12-07 01:00", need: time.Hour,
			wantNext: "2026-12-07 22:00", wantWhy: "its window is", wantWhen: "next window: Mon 2026-12-07 22:00 UTC (in 21h)",
		},
		{
			name: "a window shorter than the rollout never lets it go", window: weeknights, now: "2026-12-08 23:00", need: 5 * time.Hour,
			wantWhy:  "its window Mon-Fri 22:00-02:00 UTC is shorter than a rollout of about 5h0m0s",
			wantWhen: "never: its window Mon-Fri 22:00-02:00 UTC is shorter than a rollout of about 5h0m0s (--machine-time × replicas)",
		},
		{
			name: "Fri-Mon wraps the week: Sunday is inside", window: "Fri-Mon 10:00-12:00 UTC", now: "2026-12-13 11:00", need: time.Hour,
			wantNow: true, wantWhen: "now",
		},
		{
			name: "Fri-Mon wraps the week: Monday is inside", window: "Fri-Mon 10:00-12:00 UTC", now: "2026-12-07 10:00", need: 2 * time.Hour,
			wantNow: true, wantWhen: "now",
		},
		{
			name: "Fri-Mon wraps the week: Tuesday waits for Friday", window: "Fri-Mon 10:00-12:00 UTC", now: "2026-12-08 11:00", need: time.Hour,
			wantNext: "2026-12-11 10:00", wantWhy: "its window is", wantWhen: "next window: Fri 2026-12-11 10:00 UTC (in 2d23h)",
		},
		{
			name: "several spans: the nearest", window: "Sat 02:00-04:00 UTC; Wed 20:00-23:00 UTC", now: "2026-12-08 12:00", need: time.Hour,
			wantNext: "2026-12-09 20:00", wantWhy: "its window is", wantWhen: "next window: Wed 2026-12-09 20:00 UTC (in 32h)",
		},
		{
			name: "several spans: the nearest after Wednesday's", window: "Sat 02:00-04:00 UTC; Wed 20:00-23:00 UTC", now: "2026-12-10 12:00", need: time.Hour,
			wantNext: "2026-12-12 02:00", wantWhy: "its window is", wantWhen: "next window: Sat 2026-12-12 02:00 UTC (in 38h)",
		},
		{
			// Saturday's two hours are too few: the next Wednesday's three.
			name: "several spans: the nearest that fits", window: "Sat 02:00-04:00 UTC; Wed 20:00-23:00 UTC", now: "2026-12-10 12:00", need: 150 * time.Minute,
			wantNext: "2026-12-16 20:00", wantWhy: "its window is", wantWhen: "next window: Wed 2026-12-16 20:00 UTC (in 6d8h)",
		},
		{
			name: "no window: now", window: "", now: "2026-12-10 12:00", need: 100 * time.Hour,
			wantNow: true, wantWhen: "now",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := at(t, tc.now)
			d := mustWindow(t, tc.window).Decide(now, tc.need)
			if d.Now != tc.wantNow {
				t.Errorf("Now = %v, want %v: %+v", d.Now, tc.wantNow, d)
			}
			switch {
			case tc.wantNext == "" && !d.Next.Start.IsZero():
				t.Errorf("Next = %v, want none", d.Next)
			case tc.wantNext != "" && !d.Next.Start.Equal(at(t, tc.wantNext)):
				t.Errorf("Next starts %v, want %s UTC", d.Next.Start, tc.wantNext)
			case tc.wantNext != "" && d.Next.End.Sub(d.Next.Start) < tc.need:
				t.Errorf("Next %v is shorter than %s", d.Next, tc.need)
			}
			if tc.wantNow && d.Why != "" || !tc.wantNow && !strings.Contains(d.Why, tc.wantWhy) {
				t.Errorf("Why = %q, want %q", d.Why, tc.wantWhy)
			}
			if got := d.When(now); got != tc.wantWhen {
				t.Errorf("When = %q\nwant   %q", got, tc.wantWhen)
			}
		})
	}
}

// A window names local time: its opening is at the same local hours in
// winter and in summer, so at other UTC hours.
func TestWindowKeepsLocalTimeAcrossDaylightSaving(t *testing.T) {
	w := mustWindow(t, "Sun 02:00-06:00 Europe/Berlin")
	for _, tc := range []struct {
		now, start, end, when string
	}{
		// CET, UTC+1.
		{"2026-03-21 12:00", "2026-03-22 01:00", "2026-03-22 05:00", "next window: Sun 2026-03-22 02:00 CET (in 13h)"},
		// CEST, UTC+2.
		{"2026-04-04 12:00", "2026-04-05 00:00", "2026-04-05 04:00", "next window: Sun 2026-04-05 02:00 CEST (in 12h)"},
		{"2026-10-17 12:00", "2026-10-18 00:00", "2026-10-18 04:00", "next window: Sun 2026-10-18 02:00 CEST (in 12h)"},
		// CET again.
		{"2026-10-31 12:00", "2026-11-01 01:00", "2026-11-01 05:00", "next window: Sun 2026-11-01 02:00 CET (in 13h)"},
	} {
		now := at(t, tc.now)
		d := w.Decide(now, time.Hour)
		if d.Now || !d.Next.Start.Equal(at(t, tc.start)) || !d.Next.End.Equal(at(t, tc.end)) {
			t.Errorf("from %s UTC: %+v, want the opening %s-%s UTC", tc.now, d, tc.start, tc.end)
		}
		if got := d.When(now); got != tc.when {
			t.Errorf("from %s UTC: When = %q, want %q", tc.now, got, tc.when)
		}
	}
}

// On the Sundays the clocks change (2026-03-29: 02:00 CET becomes 03:00
// CEST; 2026-10-25: 03:00 CEST becomes 02:00 CET) a window still opens and
// closes at the local times it names.
func TestWindowKeepsLocalTimeOnTheDaysTheClocksChange(t *testing.T) {
	for _, tc := range []struct {
		window, now string
		start, end  string // UTC; start "" when not checked (02:00 is not, or twice, a local time)
	}{
		// 20:00-22:00 CEST is 18:00-20:00 UTC.
		{"Sun 20:00-22:00 Europe/Berlin", "2026-03-29 12:00", "2026-03-29 18:00", "2026-03-29 20:00"},
		// 20:00-22:00 CET is 19:00-21:00 UTC.
		{"Sun 20:00-22:00 Europe/Berlin", "2026-10-25 12:00", "2026-10-25 19:00", "2026-10-25 21:00"},
		// Closes at 06:00 CEST, 04:00 UTC.
		{"Sun 02:00-06:00 Europe/Berlin", "2026-03-28 12:00", "", "2026-03-29 04:00"},
		// Closes at 06:00 CET, 05:00 UTC.
		{"Sun 02:00-06:00 Europe/Berlin", "2026-10-24 12:00", "", "2026-10-25 05:00"},
	} {
		d := mustWindow(t, tc.window).Decide(at(t, tc.now), time.Minute)
		local := func(t time.Time) string { return t.In(d.Next.Start.Location()).Format("15:04 MST") }
		if tc.start != "" && !d.Next.Start.Equal(at(t, tc.start)) || !d.Next.End.Equal(at(t, tc.end)) {
			t.Errorf("%s from %s UTC: the opening is %s to %s UTC (%s to %s local), want %q to %q UTC", tc.window, tc.now,
				d.Next.Start.UTC().Format("01-02 15:04"), d.Next.End.UTC().Format("01-02 15:04"), local(d.Next.Start), local(d.Next.End), tc.start, tc.end)
		}
	}
}
