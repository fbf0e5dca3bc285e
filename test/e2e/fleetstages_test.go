package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// Staged fleet runs: --stages, --stage-soak, the run record in the
// management cluster (--run, --resume, fleet status) and maintenance
// windows. Every cluster here has one control-plane machine, so that the
// scenarios, run side by side, fit two cores.

// fleetRings starts one simulated cluster of one machine per entry of rings,
// as fleetOf does (namespace <prefix>-<i>, labelled fleet=<prefix>), each
// also labelled ring=<rings[i]>; an empty entry leaves the ring label out.
func fleetRings(t *testing.T, prefix string, rings ...string) []*env {
	t.Helper()
	envs := make([]*env, len(rings))
	for i, ring := range rings {
		opts := fastOptions(1)
		opts.Namespace = fmt.Sprintf("%s-%d", prefix, i+1)
		opts.Labels = map[string]string{"fleet": prefix}
		if ring != "" {
			opts.Labels["ring"] = ring
		}
		envs[i] = simtest.Start(t, opts)
	}
	return envs
}

// stagedFleetEvent is the closing "fleet" event of a staged run.
type stagedFleetEvent struct {
	Action   string `json:"action"`
	Run      string `json:"run"`
	ExitCode int    `json:"exitCode"`
	Clusters []struct {
		Namespace string `json:"namespace"`
		Cluster   string `json:"cluster"`
		Stage     any    `json:"stage"`
		Result    string `json:"result"`
		ExitCode  *int   `json:"exitCode"`
		Machines  string `json:"machines"`
		Message   string `json:"message"`
	} `json:"clusters"`
}

// closingFleetEvent is the last "fleet" event among evs, decoded.
func closingFleetEvent(t *testing.T, evs []map[string]any) stagedFleetEvent {
	t.Helper()
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i]["action"] != "fleet" {
			continue
		}
		raw, _ := json.Marshal(evs[i])
		var ev stagedFleetEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatalf("the fleet event %s: %v", raw, err)
		}
		return ev
	}
	t.Fatalf("no fleet event among %d events", len(evs))
	return stagedFleetEvent{}
}

// rowOf is the closing event's row of the cluster in namespace ns.
func rowOf(ev stagedFleetEvent, ns string) (result, message string) {
	for _, c := range ev.Clusters {
		if c.Namespace == ns {
			return c.Result, c.Message
		}
	}
	return "(no row)", ""
}

// stampedEvent is an event of a run started with StartPlugin and when it
// arrived (the event's own "time" when it carries one).
type stampedEvent struct {
	ev map[string]any
	at time.Time
}

func stamp(ev map[string]any) stampedEvent {
	at := time.Now()
	if s, ok := ev["time"].(string); ok {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			at = t
		}
	}
	return stampedEvent{ev: ev, at: at}
}

func unstamped(evs []stampedEvent) []map[string]any {
	out := make([]map[string]any, len(evs))
	for i, e := range evs {
		out[i] = e.ev
	}
	return out
}

// stageEvent is a {"action":"stage"} event's stage number and phase; ok is
// false for any other event.
func stageEvent(ev map[string]any) (stage int, phase string, ok bool) {
	if ev["action"] != "stage" {
		return 0, "", false
	}
	n, _ := ev["stage"].(float64)
	return int(n), stringOf(ev["phase"]), true
}

// stageLine describes a run's stage events, in order, for messages.
func stageLine(evs []map[string]any) string {
	var parts []string
	for _, ev := range evs {
		if n, phase, ok := stageEvent(ev); ok {
			parts = append(parts, fmt.Sprintf("%d:%s", n, phase))
		}
	}
	return strings.Join(parts, " ")
}

// fleetRunStatus is `fleet status RUN -o json`.
type fleetRunStatus struct {
	Run       string `json:"run"`
	Namespace string `json:"namespace"`
	Request   any    `json:"request"`
	Command   any    `json:"command"`
	StartedBy string `json:"startedBy"`
	Started   string `json:"started"`
	State     string `json:"state"`
	Stages    []struct {
		Selector string `json:"selector"`
		State    string `json:"state"`
	} `json:"stages"`
	Clusters []struct {
		Namespace string `json:"namespace"`
		Cluster   string `json:"cluster"`
		Stage     any    `json:"stage"`
		State     string `json:"state"`
		ExitCode  *int   `json:"exitCode"`
		Machines  string `json:"machines"`
		Attempts  int    `json:"attempts"`
		Started   string `json:"started"`
		Ended     string `json:"ended"`
		Message   string `json:"message"`
	} `json:"clusters"`
}

func fleetStatus(t *testing.T, ctx context.Context, e *env, run string) fleetRunStatus {
	t.Helper()
	r := e.Plugin(t, ctx, "fleet", "status", run, "-o", "json")
	if r.Code != 0 {
		t.Fatalf("fleet status %s: exit %d\n%s", run, r.Code, simtest.Tail(r.Stderr, 20))
	}
	var st fleetRunStatus
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("fleet status %s -o json: %v\n%s", run, err, r.Stdout)
	}
	return st
}

// clusterStatus is the run record's entry of the cluster in namespace ns.
func (st fleetRunStatus) cluster(t *testing.T, ns string) (state string, attempts int) {
	t.Helper()
	for _, c := range st.Clusters {
		if c.Namespace == ns {
			return c.State, c.Attempts
		}
	}
	t.Errorf("fleet status %s has no cluster in namespace %s: %+v", st.Run, ns, st.Clusters)
	return "", 0
}

// assertKCPUntouched checks that a cluster no run started is as it was: its
// KubeadmControlPlane at from and not paused.
func assertKCPUntouched(t *testing.T, ctx context.Context, e *env) {
	t.Helper()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := e.Sim.ManagementClient().Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused || kcp.Spec.Version != from {
		t.Errorf("%s, never started, was changed: version %s, annotations %v", e.Sim.Options().Namespace, kcp.Spec.Version, kcp.Annotations)
	}
}

// Six clusters in three rings, two at a time, with a soak after each ring.
// The run is killed (SIGKILL) once the second ring has begun; its record in
// the management cluster then says the first ring is done, and --resume
// brings every cluster to the target without running the first ring again.
func TestFleetStagesSoakAndResume(t *testing.T) {
	t.Parallel()
	const prefix, run, soak = "fstage-soak", "fstage-soak-run", 15 * time.Second
	envs := fleetRings(t, prefix, "0", "0", "1", "1", "2", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ns := func(i int) string { return envs[i].Sim.Options().Namespace }
	ring0, ring1 := []string{ns(0), ns(1)}, []string{ns(2), ns(3)}
	base := []string{"upgrade", "-A", "-l", "fleet=" + prefix, "--version", to,
		"--stages", "ring=0;ring=1;ring=2", "--parallel", "2", "--stage-soak", soak.String(), "-o", "json"}

	// The first run, killed once a machine of the second ring is up.
	first := envs[0].StartPlugin(t, append(slices.Clone(base), "--run", run)...)
	var seen []stampedEvent
	killed := false
	for ev := range first.Events {
		seen = append(seen, stamp(ev))
		if ev["action"] == "create" && ev["phase"] == "done" && slices.Contains(ring1, stringOf(ev["namespace"])) {
			first.Kill()
			killed = true
			break
		}
	}
	for ev := range first.Events { // what was printed before the kill
		seen = append(seen, stamp(ev))
	}
	if !killed {
		t.Fatalf("the run ended (exit %d) before a machine of the second ring was created; stages: %s\n%s",
			first.Wait(), stageLine(unstamped(seen)), simtest.Tail(first.Stderr(), 30))
	}
	firstEvs := unstamped(seen)
	if len(firstEvs) == 0 || firstEvs[0]["action"] != "fleet-run" || firstEvs[0]["run"] != run ||
		firstEvs[0]["stages"] != float64(3) || firstEvs[0]["clusters"] != float64(6) {
		t.Errorf("the run's first event %v: want {action: fleet-run, run: %s, stages: 3, clusters: 6}", firstOf(firstEvs), run)
	}
	// Stage 1 ran, soaked for --stage-soak, and only then did stage 2 start;
	// no cluster of ring 1 or 2 began before.
	var soaking1, running2 time.Time
	for _, s := range seen {
		n, phase, ok := stageEvent(s.ev)
		switch {
		case ok && n == 1 && phase == "soaking" && soaking1.IsZero():
			soaking1 = s.at
		case ok && n == 2 && phase == "running" && running2.IsZero():
			running2 = s.at
		case !ok && running2.IsZero() && s.ev["namespace"] != nil && !slices.Contains(ring0, stringOf(s.ev["namespace"])):
			t.Errorf("%s acted before stage 2 began: %v", stringOf(s.ev["namespace"]), s.ev)
		}
	}
	switch {
	case soaking1.IsZero() || running2.IsZero():
		t.Errorf("the killed run's stage events %q lack stage 1 soaking or stage 2 running", stageLine(firstEvs))
	case running2.Sub(soaking1) < soak-time.Second:
		t.Errorf("stage 2 began %s after stage 1 began to soak; --stage-soak %s", running2.Sub(soaking1).Round(100*time.Millisecond), soak)
	default:
		t.Logf("stage 1 soaked %s before stage 2 began", running2.Sub(soaking1).Round(100*time.Millisecond))
	}

	// The record says the first ring is done, each started once.
	st := fleetStatus(t, ctx, envs[0], run)
	t.Logf("after the kill, run %s is %q; stages %+v", run, st.State, st.Stages)
	if len(st.Stages) != 3 {
		t.Errorf("fleet status lists %d stages, want 3: %+v", len(st.Stages), st.Stages)
	}
	for _, n := range ring0 {
		if state, attempts := st.cluster(t, n); state != "done" || attempts != 1 {
			t.Errorf("fleet status: %s %q after %d attempts, want done after 1", n, state, attempts)
		}
	}
	for _, i := range []int{4, 5} {
		if state, attempts := st.cluster(t, ns(i)); state == "done" || attempts != 0 {
			t.Errorf("fleet status: %s (ring 2) %q after %d attempts, want not started", ns(i), state, attempts)
		}
	}
	ring0Machines := map[string][]string{}
	for _, e := range envs[:2] {
		ring0Machines[e.Sim.Options().Namespace] = mustMachines(t, e)
	}
	// The killed run's Leases: their holder is known to be dead.
	for _, e := range envs {
		breakLock(t, e)
	}

	// A request other than the recorded one is refused.
	if r := envs[0].Plugin(t, ctx, "upgrade", "-A", "-l", "fleet="+prefix, "--version", from,
		"--stages", "ring=0;ring=1;ring=2", "--parallel", "2", "--stage-soak", soak.String(), "-o", "json", "--resume", run); r.Code != 2 {
		t.Errorf("--resume %s with another --version: exit %d, want 2 (refused)\n%s", run, r.Code, simtest.Tail(r.Stderr, 10))
	}

	// The same command with --resume finishes the job.
	resumed := envs[0].Plugin(t, ctx, append(slices.Clone(base), "--resume", run)...)
	if resumed.Code != 0 {
		t.Fatalf("--resume %s: exit %d\n%s", run, resumed.Code, simtest.Tail(resumed.Stderr, 40))
	}
	evs := simtest.Events(t, resumed.Stdout)
	for _, e := range envs {
		assertConverged(t, e, 1, to)
	}
	closing := closingFleetEvent(t, evs)
	t.Logf("the resumed run's closing event: %+v", closing)
	for _, n := range ring0 {
		if result, msg := rowOf(closing, n); result != "done" || !strings.Contains(msg, "done earlier") {
			t.Errorf("resumed run: %s %q (%q), want done, done earlier", n, result, msg)
		}
		if got := mustMachines(t, envs[slices.Index(ring0, n)]); !slices.Equal(got, ring0Machines[n]) {
			t.Errorf("resumed run: %s's machines %v, were %v: it was run again", n, got, ring0Machines[n])
		}
	}
	for _, e := range envs[2:] {
		if result, _ := rowOf(closing, e.Sim.Options().Namespace); result != "done" {
			t.Errorf("resumed run: %s %q, want done", e.Sim.Options().Namespace, result)
		}
	}
	for _, ev := range evs {
		if ev["action"] == "create" && slices.Contains(ring0, stringOf(ev["namespace"])) {
			t.Errorf("the resumed run created a machine in %s, done earlier: %v", stringOf(ev["namespace"]), ev)
		}
	}
	// Across both runs: stage 1 soaked before stage 2, stage 2 soaked, and
	// the last stage event is stage 3's done.
	both := append(slices.Clone(firstEvs), evs...)
	soaked := map[int]int{} // stage -> index of its first soaking event
	lastStage, lastPhase := 0, ""
	for i, ev := range both {
		if n, phase, ok := stageEvent(ev); ok {
			if _, dup := soaked[n]; phase == "soaking" && !dup {
				soaked[n] = i
			}
			lastStage, lastPhase = n, phase
		}
	}
	s1, ok1 := soaked[1]
	s2, ok2 := soaked[2]
	if !ok1 || !ok2 || s1 > s2 || lastStage != 3 || lastPhase != "done" {
		t.Errorf("stage events (killed run | resumed run): %s | %s\nwant stage 1 then stage 2 soaking, and stage 3 done last",
			stageLine(firstEvs), stageLine(evs))
	} else {
		t.Logf("stage events (killed run | resumed run): %s | %s", stageLine(firstEvs), stageLine(evs))
	}

	// The record: every cluster done; the first ring still after one attempt.
	st = fleetStatus(t, ctx, envs[0], run)
	t.Logf("after --resume, run %s is %q", run, st.State)
	for _, e := range envs {
		n := e.Sim.Options().Namespace
		state, attempts := st.cluster(t, n)
		switch {
		case state != "done":
			t.Errorf("fleet status after --resume: %s %q, want done", n, state)
		case slices.Contains(ring0, n) && attempts != 1:
			t.Errorf("fleet status after --resume: %s, done by the killed run, has %d attempts, want 1", n, attempts)
		}
	}
	if st.State == "running" {
		t.Errorf("fleet status after --resume: the run is still %q", st.State)
	}
	// A new run may not take an existing run's name.
	if r := envs[0].Plugin(t, ctx, append(slices.Clone(base), "--run", run)...); r.Code != 2 {
		t.Errorf("--run %s, which exists: exit %d, want 2 (refused)\n%s", run, r.Code, simtest.Tail(r.Stderr, 10))
	}
	list := envs[0].Plugin(t, ctx, "fleet", "status")
	if list.Code != 0 || !strings.Contains(list.Stdout, run) {
		t.Errorf("fleet status (the runs): exit %d, want %s listed:\n%s", list.Code, run, list.Stdout)
	}
}

func firstOf(evs []map[string]any) map[string]any {
	if len(evs) == 0 {
		return nil
	}
	return evs[0]
}

// Three rings of one cluster each. While the first ring soaks, its cluster's
// etcd member stops: the run stops there with the refusal's exit code,
// naming the cluster and its member, and no later ring starts.
func TestFleetSoakCatchesABadCluster(t *testing.T) {
	t.Parallel()
	const prefix = "fstage-bad"
	envs := fleetRings(t, prefix, "0", "1", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bad := envs[0]
	run := bad.StartPlugin(t, "upgrade", "-A", "-l", "fleet="+prefix, "--version", to,
		"--stages", "ring=0;ring=1;ring=2", "--stage-soak", "40s", "-o", "json")
	var evs []map[string]any
	for ev := range run.Events {
		evs = append(evs, ev)
		if n, phase, ok := stageEvent(ev); ok && n == 1 && phase == "soaking" {
			break
		}
	}
	if n := len(evs); n == 0 || evs[n-1]["action"] != "stage" {
		t.Fatalf("the run ended (exit %d) before stage 1 soaked; stages: %s\n%s", run.Wait(), stageLine(evs), simtest.Tail(run.Stderr(), 30))
	}
	// The cluster's machine now is the upgrade's new one.
	machines, err := bad.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var node string
	for _, m := range machines {
		if m.DeletionTimestamp.IsZero() && m.Status.NodeRef.Name != "" {
			node = m.Status.NodeRef.Name
		}
	}
	if node == "" {
		t.Fatalf("%s has no machine with a node while it soaks: %s", bad.Sim.Options().Namespace, names(machines))
	}
	if err := bad.Sim.StopMember(node); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped the etcd member of %s on node %s", bad.Sim.Options().Namespace, node)
	for ev := range run.Events {
		evs = append(evs, ev)
	}
	code := run.Wait()
	if code != 3 {
		t.Fatalf("exit %d, want 3 (unsafe); stages: %s\n%s", code, stageLine(evs), simtest.Tail(run.Stderr(), 30))
	}
	badName := bad.Sim.Options().Namespace + "/demo"
	last := evs[len(evs)-1]
	errMsg := stringOf(last["message"])
	t.Logf("the error object: %v", last)
	if last["action"] != "error" || last["exitCode"] != float64(3) {
		t.Errorf("the run's last event %v: want its error object, exit code 3", last)
	}
	for _, where := range []struct{ name, text string }{{"the error object", errMsg}, {"stderr", simtest.Tail(run.Stderr(), 10)}} {
		if !strings.Contains(where.text, badName) || !strings.Contains(where.text, node) {
			t.Errorf("%s does not name the cluster %s and its stopped member %s:\n%s", where.name, badName, node, where.text)
		}
	}
	failed := false
	for _, ev := range evs {
		if n, phase, ok := stageEvent(ev); ok && n == 1 && phase == "failed" {
			failed = true
		}
		if n, _, ok := stageEvent(ev); ok && n > 1 {
			t.Errorf("stage %d began after stage 1's cluster went bad: %v", n, ev)
		}
	}
	if !failed {
		t.Errorf("no stage event says stage 1 failed: %s", stageLine(evs))
	}
	closing := closingFleetEvent(t, evs)
	if result, _ := rowOf(closing, bad.Sim.Options().Namespace); result != "done" {
		t.Errorf("%s, upgraded before it went bad, %q: want done (the soak, not its upgrade, failed)", badName, result)
	}
	for _, e := range envs[1:] {
		n := e.Sim.Options().Namespace
		if result, _ := rowOf(closing, n); result != "not started" {
			t.Errorf("%s %q, want not started", n, result)
		}
		assertKCPUntouched(t, ctx, e)
	}
}

// One cluster's maintenance window is closed (it opens three days from
// now): plan says when it goes, and the run leaves it alone while the other
// cluster is upgraded; a cluster outside its window is no failure.
func TestFleetWindowSkipsACluster(t *testing.T) {
	t.Parallel()
	const prefix = "fstage-win"
	envs := fleetRings(t, prefix, "", "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	closed, open := envs[0], envs[1]
	opens := time.Now().UTC().AddDate(0, 0, 3)
	opens = time.Date(opens.Year(), opens.Month(), opens.Day(), 10, 0, 0, 0, time.UTC)
	window := opens.Weekday().String()[:3] + " 10:00-11:00 UTC"
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"cp-rollout.io/maintenance-window":%q}}}`, window)
	cluster := &clusterv1.Cluster{}
	cluster.Namespace, cluster.Name = closed.Sim.ClusterKey().Namespace, closed.Sim.ClusterKey().Name
	if err := closed.Sim.ManagementClient().Patch(ctx, cluster, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	closedName, openName := closed.Sim.Options().Namespace+"/demo", open.Sim.Options().Namespace+"/demo"
	date := opens.Format("2006-01-02")
	t.Logf("%s: maintenance window %q, next opening %s", closedName, window, opens.Format(time.RFC3339))

	// plan: the schedule before the per-cluster plans.
	p := envs[0].Plugin(t, ctx, "plan", "-A", "-l", "fleet="+prefix, "--version", to, "--stages", "fleet="+prefix)
	if p.Code != 0 {
		t.Fatalf("plan: exit %d\n%s", p.Code, simtest.Tail(p.Stderr, 20))
	}
	t.Logf("plan:\n%s", simtest.Tail(p.Stdout, 200))
	if !regexp.MustCompile(`(?m)^CLUSTER\s+STAGE\s+WINDOW\s+GOES\b`).MatchString(p.Stdout) {
		t.Errorf("plan has no CLUSTER STAGE WINDOW GOES table:\n%s", p.Stdout)
	}
	rowFor := func(name string) string {
		for _, line := range strings.Split(p.Stdout, "\n") {
			if strings.HasPrefix(line, name+" ") {
				return line
			}
		}
		return ""
	}
	if row := rowFor(closedName); !strings.Contains(row, "next window:") || !strings.Contains(row, date) {
		t.Errorf("plan's row of %s %q: want GOES next window: %s…\n%s", closedName, row, date, p.Stdout)
	}
	if row := rowFor(openName); !regexp.MustCompile(`\snow\s*$`).MatchString(row) {
		t.Errorf("plan's row of %s %q: want GOES now\n%s", openName, row, p.Stdout)
	}
	if i, j := strings.Index(p.Stdout, "GOES"), strings.LastIndex(p.Stdout, closedName); i < 0 || j <= i {
		t.Errorf("plan does not print the schedule before the per-cluster plans:\n%s", p.Stdout)
	}

	// The run: the other cluster is upgraded, this one left alone.
	r := envs[0].Plugin(t, ctx, "upgrade", "-A", "-l", "fleet="+prefix, "--version", to, "--stages", "fleet="+prefix, "-o", "json")
	evs := simtest.Events(t, r.Stdout)
	if r.Code != 0 {
		t.Errorf("upgrade: exit %d, want 0 (a cluster outside its window is skipped, not failed)\n%s", r.Code, simtest.Tail(r.Stderr, 20))
	}
	if len(evs) == 0 || evs[0]["action"] != "fleet-run" || stringOf(evs[0]["run"]) == "" {
		t.Errorf("the run's first event %v: want fleet-run with the generated run name", firstOf(evs))
	}
	skipped := false
	for _, ev := range evs {
		if ev["action"] == "skipped" && ev["namespace"] == closed.Sim.Options().Namespace {
			skipped = strings.HasPrefix(stringOf(ev["message"]), "outside window: ")
		}
		if ev["namespace"] == closed.Sim.Options().Namespace && ev["action"] != "skipped" {
			t.Errorf("%s, outside its window, had an event: %v", closedName, ev)
		}
	}
	if !skipped {
		t.Errorf("no skipped event for %s with message \"outside window: …\"", closedName)
	}
	closing := closingFleetEvent(t, evs)
	for _, ev := range evs {
		if ev["action"] == "skipped" {
			t.Logf("skipped event: %v", ev)
		}
	}
	t.Logf("closing event: %+v", closing)
	if result, msg := rowOf(closing, closed.Sim.Options().Namespace); result != "outside window" || !strings.Contains(msg, date) {
		t.Errorf("%s: %q (%q), want outside window, naming the next opening (%s)", closedName, result, msg, date)
	}
	if result, _ := rowOf(closing, open.Sim.Options().Namespace); result != "done" {
		t.Errorf("%s: %q, want done", openName, result)
	}
	assertConverged(t, open, 1, to)
	assertKCPUntouched(t, ctx, closed)

	// Without --stages, the window holds all the same.
	r = envs[0].Plugin(t, ctx, "upgrade", "-A", "-l", "fleet="+prefix, "--version", to, "-o", "json")
	if r.Code != 0 {
		t.Errorf("upgrade without --stages: exit %d, want 0\n%s", r.Code, simtest.Tail(r.Stderr, 20))
	}
	if result, msg := rowOf(closingFleetEvent(t, simtest.Events(t, r.Stdout)), closed.Sim.Options().Namespace); result != "outside window" {
		t.Errorf("upgrade without --stages: %s %q (%q), want outside window", closedName, result, msg)
	}
	assertKCPUntouched(t, ctx, closed)
}
