package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// stubRollout stands for each cluster's rollout: it takes a little time,
// notes the order clusters start in, how many run at once, and any that
// starts while a cluster of an earlier stage has not ended; it fails the
// clusters in fail, and calls during[name] while that one runs.
type stubRollout struct {
	took   time.Duration
	fail   map[string]bool
	during map[string]func()

	mu       sync.Mutex
	started  []string
	stages   map[string]int
	ended    map[string]time.Time
	began    map[string]time.Time
	inFlight int
	most     int
	overlaps []string
}

func newStub(took time.Duration) *stubRollout {
	return &stubRollout{took: took, fail: map[string]bool{}, during: map[string]func(){},
		stages: map[string]int{}, ended: map[string]time.Time{}, began: map[string]time.Time{}}
}

func (s *stubRollout) Do(ctx context.Context, m Member) (string, error) {
	s.mu.Lock()
	for name, stage := range s.stages {
		if _, ended := s.ended[name]; stage < m.Stage && !ended {
			s.overlaps = append(s.overlaps, fmt.Sprintf("%s (stage %d) started while %s (stage %d) ran", m.Name, m.Stage, name, stage))
		}
	}
	s.started = append(s.started, m.Name)
	s.stages[m.Name], s.began[m.Name] = m.Stage, time.Now()
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	s.mu.Unlock()
	if f := s.during[m.Name]; f != nil {
		f()
	}
	time.Sleep(s.took)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	s.ended[m.Name] = time.Now()
	if s.fail[m.Name] {
		return "1 of 3 replaced", exitcode.Timeoutf("%s: machine %s-cp-2 did not become ready", m.Name, m.Name)
	}
	return "3 of 3 replaced", nil
}

// ran is the clusters started, by name.
func (s *stubRollout) ran() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ran := slices.Clone(s.started)
	slices.Sort(ran)
	return strings.Join(ran, " ")
}

// health stands for the soak's live read: bad turns unhealthy after its
// first after reads.
type health struct {
	bad   string
	after int

	mu    sync.Mutex
	calls map[string]int
}

func (h *health) Healthy(_ context.Context, c Cluster) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.calls == nil {
		h.calls = map[string]int{}
	}
	h.calls[c.Name]++
	if c.Name == h.bad && h.calls[c.Name] > h.after {
		return errors.New("etcd member " + c.Name + "-cp-1 is not healthy")
	}
	return nil
}

func (h *health) reads(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[name]
}

// watcher notes what a staged run tells.
type watcher struct {
	mu      sync.Mutex
	stages  []string
	skipped []string
}

func (w *watcher) Stage(n int, state, _ string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stages = append(w.stages, fmt.Sprintf("%d %s", n, state))
}

func (w *watcher) Skipped(_, cluster, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.skipped = append(w.skipped, cluster+": "+why)
}

// rings is stages of per clusters each: r0-a, r0-b, … in stage 1.
func rings(stages, per int) []Member {
	var out []Member
	for s := range stages {
		for i := range per {
			out = append(out, Member{Cluster: Cluster{Namespace: "default", Name: fmt.Sprintf("r%d-%c", s, 'a'+i)}, Stage: s + 1, Replicas: 3})
		}
	}
	return out
}

// stagedRun records a new run of members in namespace and is its Staged,
// with stub and h for the rollouts and the soak, 2 at once, no failure
// allowed, no soak.
func stagedRun(t *testing.T, namespace, name string, stages int, members []Member, stub *stubRollout, h *health) (*Records, *Staged) {
	t.Helper()
	_, records := recordsIn(t, namespace)
	rec, err := records.Create(context.Background(), newRun(name, stages, members))
	if err != nil {
		t.Fatal(err)
	}
	return records, &Staged{Record: rec, Stages: stages, Limits: Limits{Parallel: 2}, SoakEvery: 20 * time.Millisecond,
		MachineTime: 10 * time.Minute, Now: time.Now, Do: stub.Do, Healthy: h.Healthy}
}

// states is each cluster's recorded "state/attempts", by name.
func states(t *testing.T, records *Records, run string) (map[string]string, *RunRecord) {
	t.Helper()
	loaded, err := records.Load(context.Background(), run)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, c := range loaded.Clusters {
		out[c.Name] = fmt.Sprintf("%s/%d", c.State, c.Attempts)
	}
	return out, loaded
}

func stageStates(run *RunRecord) string {
	var out []string
	for _, s := range run.Stages {
		out = append(out, s.State)
	}
	return strings.Join(out, " ")
}

func expectStates(t *testing.T, got map[string]string, want map[string]string) {
	t.Helper()
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s is recorded %s, want %s", name, got[name], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("recorded %v, want %v", got, want)
	}
}

func TestStagedRunsTheStagesInOrderWithASoakBetween(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stub, h, w := newStub(150*time.Millisecond), &health{}, &watcher{}
	members := rings(3, 3)
	records, s := stagedRun(t, "staged-order", "order", 3, members, stub, h)
	s.Soak, s.Watch = 100*time.Millisecond, w
	if err := s.Run(ctx, members); err != nil {
		t.Fatal(err)
	}
	if want := "r0-a r0-b r0-c r1-a r1-b r1-c r2-a r2-b r2-c"; stub.ran() != want || len(stub.started) != len(members) {
		t.Errorf("started %v, want each of %s once", stub.started, want)
	}
	for i, name := range stub.started {
		if i > 0 && stub.stages[name] < stub.stages[stub.started[i-1]] {
			t.Errorf("started %v: stage %d's %s after stage %d's", stub.started, stub.stages[name], name, stub.stages[stub.started[i-1]])
		}
	}
	if len(stub.overlaps) > 0 {
		t.Errorf("stages overlapped: %v", stub.overlaps)
	}
	if stub.most != 2 {
		t.Errorf("at most %d clusters ran at once, want 2 (--parallel)", stub.most)
	}
	// The soak: stage 1's clusters, then stage 2's, read live until it
	// ends; stage 3 has none after it.
	for n := 1; n < 3; n++ {
		var lastEnd, firstStart time.Time
		for name, stage := range stub.stages {
			if stage == n && stub.ended[name].After(lastEnd) {
				lastEnd = stub.ended[name]
			}
			if stage == n+1 && (firstStart.IsZero() || stub.began[name].Before(firstStart)) {
				firstStart = stub.began[name]
			}
		}
		if gap := firstStart.Sub(lastEnd); gap < s.Soak {
			t.Errorf("stage %d started %s after stage %d ended, want the soak's %s or more", n+1, gap, n, s.Soak)
		}
	}
	for _, m := range members {
		// How often depends on how long the record's writes take; at the
		// soak's end at least.
		if n := h.reads(m.Name); m.Stage < 3 && n == 0 || m.Stage == 3 && n != 0 {
			t.Errorf("%s (stage %d) was read %d times by the soaks, want some for stages 1 and 2, none for the last", m.Name, m.Stage, n)
		}
	}
	loaded, err := records.Load(ctx, "order")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range loaded.Clusters {
		if c.State != Done || c.Attempts != 1 || c.ExitCode == nil || *c.ExitCode != 0 || c.Machines != "3 of 3 replaced" ||
			c.Started == nil || c.Ended == nil || c.Ended.Before(*c.Started) || c.Message != "" {
			t.Errorf("%s is recorded %+v, want done, once, with its machines and times", c.Cluster, c)
		}
	}
	if loaded.State != RunDone || loaded.Message != "" || stageStates(loaded) != "done done done" {
		t.Errorf("the run is recorded %s %q, stages %s; want done, stages done", loaded.State, loaded.Message, stageStates(loaded))
	}
	if want := "1 running,1 soaking,1 done,2 running,2 soaking,2 done,3 running,3 done"; strings.Join(w.stages, ",") != want {
		t.Errorf("stages told %v, want %s", w.stages, want)
	}
}

func TestStagedStopsOnAClusterUnhealthyDuringTheSoak(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	stub := newStub(10 * time.Millisecond)
	// Healthy at the soak's first two reads, then not.
	h := &health{bad: "r0-b", after: 2}
	members := rings(3, 2)
	records, s := stagedRun(t, "staged-soak", "soak", 3, members, stub, h)
	s.Soak, s.SoakEvery = 300*time.Millisecond, 100*time.Millisecond
	err := s.Run(ctx, members)
	if code := exitcode.Of(err); code != exitcode.Unsafe || !strings.Contains(fmt.Sprint(err), "default/r0-b") ||
		!strings.Contains(fmt.Sprint(err), "etcd member r0-b-cp-1 is not healthy") || !strings.Contains(fmt.Sprint(err), "--resume soak") {
		t.Errorf("Run: exit %d, %v; want 3, naming default/r0-b, its trouble and --resume soak", code, err)
	}
	if h.reads("r0-b") != 3 {
		t.Errorf("r0-b was read %d times, want 3: healthy twice, then not", h.reads("r0-b"))
	}
	if ran := stub.ran(); ran != "r0-a r0-b" {
		t.Errorf("started %s, want only stage 1's r0-a r0-b", ran)
	}
	got, run := states(t, records, "soak")
	expectStates(t, got, map[string]string{"r0-a": "done/1", "r0-b": "done/1",
		"r1-a": "not started/0", "r1-b": "not started/0", "r2-a": "not started/0", "r2-b": "not started/0"})
	if run.State != RunFailed || run.Message != err.Error() || stageStates(run) != "failed pending pending" || !strings.Contains(run.Stages[0].Message, "default/r0-b") {
		t.Errorf("the run is recorded %s %q, stages %s (%q); want failed with the soak's finding", run.State, run.Message, stageStates(run), run.Stages[0].Message)
	}
}

func TestStagedStopsAtTheFailureBudget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		maxFailures int
		ran         string
		states      map[string]string
		stages      string
	}{
		{0, "r0-a r0-b", map[string]string{"r0-a": "failed/1", "r0-b": "done/1",
			"r1-a": "not started/0", "r1-b": "not started/0", "r2-a": "not started/0", "r2-b": "not started/0"}, "failed pending pending"},
		{1, "r0-a r0-b r1-a r1-b r2-a r2-b", map[string]string{"r0-a": "failed/1", "r0-b": "done/1",
			"r1-a": "done/1", "r1-b": "done/1", "r2-a": "done/1", "r2-b": "done/1"}, "done done done"},
	} {
		t.Run(fmt.Sprintf("max-failures %d", tc.maxFailures), func(t *testing.T) {
			stub := newStub(10 * time.Millisecond)
			stub.fail["r0-a"] = true
			members := rings(3, 2)
			run := fmt.Sprintf("budget-%d", tc.maxFailures)
			records, s := stagedRun(t, "staged-"+run, run, 3, members, stub, &health{})
			s.Limits.MaxFailures = tc.maxFailures
			if err := s.Run(context.Background(), members); err != nil {
				t.Errorf("Run: %v; the failures are in the record", err)
			}
			if ran := stub.ran(); ran != tc.ran {
				t.Errorf("started %s, want %s", ran, tc.ran)
			}
			got, loaded := states(t, records, run)
			expectStates(t, got, tc.states)
			for _, c := range loaded.Clusters {
				if c.Name == "r0-a" && (c.ExitCode == nil || *c.ExitCode != exitcode.Timeout || !strings.Contains(c.Message, "did not become ready") || c.Machines != "1 of 3 replaced") {
					t.Errorf("r0-a is recorded %+v, want its exit code 4, error and machines", c)
				}
			}
			if loaded.State != RunFailed || loaded.Message != "1 clusters failed" || stageStates(loaded) != tc.stages || !strings.Contains(loaded.Stages[0].Message, "default/r0-a failed") {
				t.Errorf("the run is recorded %s %q, stages %s (%q); want failed, stages %s, stage 1 naming r0-a", loaded.State, loaded.Message, stageStates(loaded), loaded.Stages[0].Message, tc.stages)
			}
		})
	}
}

// A failure the budget allows does not let the next stage go without its
// soak: the stage's other clusters are read as any stage's are.
func TestStagedSoaksAStageWhoseFailuresTheBudgetAllows(t *testing.T) {
	t.Parallel()
	stub := newStub(10 * time.Millisecond)
	stub.fail["r0-a"] = true
	members := rings(2, 2)
	records, s := stagedRun(t, "staged-budget-soak", "budget-soak", 2, members, stub, &health{bad: "r0-b"})
	s.Limits.MaxFailures, s.Soak = 1, 100*time.Millisecond
	err := s.Run(context.Background(), members)
	if code := exitcode.Of(err); code != exitcode.Unsafe || !strings.Contains(fmt.Sprint(err), "default/r0-b") {
		t.Errorf("Run: exit %d, %v; want 3, the soak finding default/r0-b unhealthy", code, err)
	}
	if ran := stub.ran(); ran != "r0-a r0-b" {
		t.Errorf("started %s, want only stage 1's r0-a r0-b: r0-b is unhealthy", ran)
	}
	got, _ := states(t, records, "budget-soak")
	expectStates(t, got, map[string]string{"r0-a": "failed/1", "r0-b": "done/1", "r1-a": "not started/0", "r1-b": "not started/0"})
}

// A run stopped by a failure is resumed from its record: the clusters done
// are not run again (the soak still reads them), the failed one is.
func TestStagedResumeRunsOnlyWhatIsNotDone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first := newStub(10 * time.Millisecond)
	first.fail["r1-a"] = true
	members := rings(3, 2)
	records, s := stagedRun(t, "staged-resume", "resume", 3, members, first, &health{})
	if err := s.Run(ctx, members); err != nil {
		t.Fatal(err)
	}
	got, run := states(t, records, "resume")
	expectStates(t, got, map[string]string{"r0-a": "done/1", "r0-b": "done/1",
		"r1-a": "failed/1", "r1-b": "done/1", "r2-a": "not started/0", "r2-b": "not started/0"})
	if run.State != RunFailed {
		t.Fatalf("the first run is recorded %s, want failed", run.State)
	}

	rec, err := records.TakeOver(ctx, "resume", func(msg string) { t.Errorf("TakeOver of a failed run waited: %s", msg) })
	if err != nil {
		t.Fatal(err)
	}
	again, h := newStub(10*time.Millisecond), &health{}
	resumed := &Staged{Record: rec, Stages: 3, Limits: Limits{Parallel: 2}, Soak: 40 * time.Millisecond, SoakEvery: 20 * time.Millisecond,
		MachineTime: time.Minute, Now: time.Now, Do: again.Do, Healthy: h.Healthy}
	if err := resumed.Run(ctx, members); err != nil {
		t.Fatal(err)
	}
	if ran := again.ran(); ran != "r1-a r2-a r2-b" {
		t.Errorf("the resumed run started %s, want r1-a r2-a r2-b: the others were done", ran)
	}
	if h.reads("r0-a") == 0 || h.reads("r1-b") == 0 {
		t.Errorf("the soaks read r0-a %d times and r1-b %d times: a cluster done earlier is soaked too", h.reads("r0-a"), h.reads("r1-b"))
	}
	got, run = states(t, records, "resume")
	expectStates(t, got, map[string]string{"r0-a": "done/1", "r0-b": "done/1",
		"r1-a": "done/2", "r1-b": "done/1", "r2-a": "done/1", "r2-b": "done/1"})
	if run.State != RunDone || stageStates(run) != "done done done" {
		t.Errorf("the resumed run is recorded %s, stages %s; want done", run.State, stageStates(run))
	}
}

// A cluster outside its maintenance window is left for a later run, told
// when; the run goes on without it and does not fail.
func TestStagedLeavesAClusterOutsideItsWindow(t *testing.T) {
	t.Parallel()
	window := func(s string) Window {
		w, err := ParseWindow(s)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	members := rings(2, 2)
	// Wednesday 2026-12-09, 12:00 UTC, and on from there.
	wednesday, began := time.Date(2026, 12, 9, 12, 0, 0, 0, time.UTC), time.Now()
	members[1].Window = window("Sat 02:00-06:00 UTC")
	members[2].Window = window("Wed 10:00-14:00 UTC") // 2h left: 3 replicas × 20m fit
	members[3].Window = window("Wed 10:00-12:30 UTC") // 30m left: they do not
	stub, w := newStub(10*time.Millisecond), &watcher{}
	records, s := stagedRun(t, "staged-window", "window", 2, members, stub, &health{})
	s.Soak, s.Watch, s.MachineTime = 40*time.Millisecond, w, 20*time.Minute
	s.Now = func() time.Time { return wednesday.Add(time.Since(began)) }
	if err := s.Run(context.Background(), members); err != nil {
		t.Errorf("Run: %v, want nil: a cluster waiting for its window is no failure", err)
	}
	if ran := stub.ran(); ran != "r0-a r1-a" {
		t.Errorf("started %s, want r0-a r1-a", ran)
	}
	got, run := states(t, records, "window")
	expectStates(t, got, map[string]string{"r0-a": "done/1", "r0-b": "outside window/0", "r1-a": "done/1", "r1-b": "outside window/0"})
	messages := map[string]string{}
	for _, c := range run.Clusters {
		messages[c.Name] = c.Message
	}
	for name, want := range map[string][]string{
		"r0-b": {"outside window: ", "its window is Sat 02:00-06:00 UTC", "next window: Sat 2026-12-12 02:00 UTC (in 2d1"},
		"r1-b": {"outside window: ", "closes at 12:30 UTC, too soon for a rollout of about 1h0m0s", "next window: Wed 2026-12-16 10:00 UTC"},
	} {
		if !strings.HasPrefix(messages[name], want[0]) {
			t.Errorf("%s's message %q does not start %q", name, messages[name], want[0])
		}
		for _, part := range want[1:] {
			if !strings.Contains(messages[name], part) {
				t.Errorf("%s's message %q does not say %q", name, messages[name], part)
			}
		}
	}
	if len(w.skipped) != 2 || !strings.HasPrefix(w.skipped[0], "r0-b: outside window: ") || !strings.HasPrefix(w.skipped[1], "r1-b: outside window: ") {
		t.Errorf("told of skipped clusters %q, want r0-b and r1-b, outside their windows", w.skipped)
	}
	if run.State != RunDone || !strings.Contains(run.Message, "2 clusters wait for their windows") || stageStates(run) != "done done" {
		t.Errorf("the run is recorded %s %q, stages %s; want done, 2 clusters waiting", run.State, run.Message, stageStates(run))
	}
}

// fleet abort, or the board's s key, during stage 1: the clusters in
// flight finish, no cluster of a later stage starts.
func TestStagedStartsNoClusterOnceAborted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, why string
		// During r0-b, the last of stage 1: fleet abort, or else the s key.
		abort bool
	}{
		{"fleet abort", "aborted by fleet abort by bob@ops at ", true},
		{"s key", "aborted by the board's s key", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stub := newStub(50 * time.Millisecond)
			members := rings(3, 2)
			ns := "staged-" + strings.ReplaceAll(tc.name, " ", "-")
			records, s := stagedRun(t, ns, "abort", 3, members, stub, &health{})
			s.Soak = 40 * time.Millisecond
			stop := make(chan struct{})
			s.StopStarting = stop
			stub.during["r0-b"] = func() {
				if !tc.abort {
					close(stop)
				} else if err := records.Abort(context.Background(), "abort", "bob@ops"); err != nil {
					t.Error(err)
				}
			}
			if err := s.Run(context.Background(), members); err != nil {
				t.Errorf("Run: %v", err)
			}
			if ran := stub.ran(); ran != "r0-a r0-b" {
				t.Errorf("started %s, want only stage 1's r0-a r0-b", ran)
			}
			got, run := states(t, records, "abort")
			expectStates(t, got, map[string]string{"r0-a": "done/1", "r0-b": "done/1",
				"r1-a": "not started/0", "r1-b": "not started/0", "r2-a": "not started/0", "r2-b": "not started/0"})
			if run.State != RunAborted || !strings.HasPrefix(run.Message, tc.why) || stageStates(run) != "done failed pending" {
				t.Errorf("the run is recorded %s %q, stages %s; want aborted %q…, stages done failed pending", run.State, run.Message, stageStates(run), tc.why)
			}
			for _, c := range run.Clusters {
				if c.Stage == 2 && !strings.Contains(c.Message, strings.TrimPrefix(tc.why, "aborted by ")) {
					t.Errorf("%s is recorded not started for %q, want %q", c.Name, c.Message, tc.why)
				}
			}
		})
	}
}

// `fleet abort` says a run "may be continued later with the same command
// and --resume": the resumed run starts the clusters the aborted one did not.
func TestStagedResumesARunThatWasAborted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	first := newStub(10 * time.Millisecond)
	members := rings(2, 2)
	records, s := stagedRun(t, "staged-abort-resume", "abort-resume", 2, members, first, &health{})
	first.during["r0-b"] = func() {
		if err := records.Abort(ctx, "abort-resume", "bob@ops"); err != nil {
			t.Error(err)
		}
	}
	if err := s.Run(ctx, members); err != nil {
		t.Fatal(err)
	}
	if _, run := states(t, records, "abort-resume"); run.State != RunAborted {
		t.Fatalf("the first run is recorded %s, want aborted", run.State)
	}
	rec, err := records.TakeOver(ctx, "abort-resume", func(msg string) { t.Errorf("TakeOver of an aborted run waited: %s", msg) })
	if err != nil {
		t.Fatal(err)
	}
	again := newStub(10 * time.Millisecond)
	resumed := &Staged{Record: rec, Stages: 2, Limits: Limits{Parallel: 2}, MachineTime: time.Minute, Now: time.Now, Do: again.Do, Healthy: (&health{}).Healthy}
	if err := resumed.Run(ctx, members); err != nil {
		t.Fatal(err)
	}
	if ran := again.ran(); ran != "r1-a r1-b" {
		t.Errorf("the resumed run started %q, want r1-a r1-b", ran)
	}
	got, run := states(t, records, "abort-resume")
	expectStates(t, got, map[string]string{"r0-a": "done/1", "r0-b": "done/1", "r1-a": "done/1", "r1-b": "done/1"})
	if run.State != RunDone {
		t.Errorf("the resumed run is recorded %s %q, want done", run.State, run.Message)
	}
}
