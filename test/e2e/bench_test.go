package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// The benchmark's simulated infrastructure: every machine takes this long to
// provision and to go away, for the tool and for KCP alike.
const benchProvision, benchDeletion = 2 * time.Second, time.Second

// benchScenario is one rollout the tool and KCP both do.
type benchScenario struct {
	Name           string `json:"name"`
	Replicas       int32  `json:"replicas"`
	MaxSurge       int    `json:"maxSurge"`
	FailureDomains int    `json:"failureDomains"`
}

var benchScenarios = []benchScenario{
	{Name: "upgrade 3, surge 1", Replicas: 3, MaxSurge: 1},
	{Name: "upgrade 3, surge 0", Replicas: 3, MaxSurge: 0},
	{Name: "upgrade 5, surge 1", Replicas: 5, MaxSurge: 1},
	{Name: "upgrade 3 on 3 failure domains", Replicas: 3, MaxSurge: 1, FailureDomains: 3},
}

// BenchmarkRollout times the same upgrade (v1.35.2 → v1.36.3) done by the tool
// and by the real KCP controller, alternating, each on a fresh simulator with a
// management cluster of its own, CP_ROLLOUT_BENCH_RUNS times (default 3) per
// scenario. For the tool it also takes apart where the time went: the
// phases of its summary, the floor (the time the cluster itself spent
// provisioning, joining and deleting machines, seen from a watch of its own),
// round trips per replaced machine, and how fast the tool reacted to the
// changes it awaited. `make bench` runs it and writes bench/results.json and
// bench/results.md (CP_ROLLOUT_BENCH_OUT names the directory).
func BenchmarkRollout(b *testing.B) {
	runs := 3
	if v, err := strconv.Atoi(os.Getenv("CP_ROLLOUT_BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}
	var results []scenarioResult
	for _, sc := range benchScenarios {
		b.Run(strings.NewReplacer(" ", "-", ",", "").Replace(sc.Name), func(b *testing.B) {
			res := scenarioResult{Scenario: sc}
			for i := range runs {
				// Each run is a benchmark of its own, so that its simulator
				// stops when the run ends: left running until the scenario
				// ended, the idle simulators of the earlier runs took the
				// CPU from the later ones.
				var tool toolRun
				var kcp float64
				if !b.Run(fmt.Sprintf("tool-%d", i+1), func(b *testing.B) { tool = benchTool(b, sc) }) ||
					!b.Run(fmt.Sprintf("kcp-%d", i+1), func(b *testing.B) { kcp = benchKCP(b, sc) }) {
					b.FailNow()
				}
				res.Tool = append(res.Tool, tool)
				res.KCP = append(res.KCP, kcp)
			}
			res.summarize()
			b.ReportMetric(res.ToolSeconds.Median, "tool-s")
			b.ReportMetric(res.KCPSeconds.Median, "kcp-s")
			results = append(results, res)
		})
	}
	if dir := os.Getenv("CP_ROLLOUT_BENCH_OUT"); dir != "" {
		writeBenchResults(b, dir, runs, results)
	}
}

// toolRun is what one run of the tool took, and where the time went.
type toolRun struct {
	Seconds float64 `json:"seconds"`
	// Phases sums the summary's step durations by phase, in seconds.
	Phases map[string]float64 `json:"phases"`
	// FloorSeconds is the time the cluster itself spent on its machines:
	// creation to node, deletion to the pre-terminate stage, and hook release
	// to gone, for every replaced machine.
	FloorSeconds float64 `json:"floorSeconds"`
	// Requests are the summary's round trips.
	Requests map[string]float64 `json:"requests"`
	// ReactionMs are the tool's reactions to awaited changes: from the change
	// (seen by the benchmark's own watch) to the tool's event ending the wait.
	ReactionMs []float64 `json:"reactionMs"`
}

func benchOptions(sc benchScenario) sim.Options {
	return sim.Options{Replicas: sc.Replicas, Version: from, FailureDomains: sc.FailureDomains,
		ProvisionDelay: benchProvision, DeleteDelay: benchDeletion}
}

func benchTool(b *testing.B, sc benchScenario) toolRun {
	e := simtest.StartOwn(b, benchOptions(sc))
	e.AwaitKCP = true // both runs end when KCP reports done
	tl := watchTimeline(b, e.Sim)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.Plugin(b, ctx, "upgrade", "demo", "--version", to, "--max-surge", strconv.Itoa(sc.MaxSurge), "-o", "json")
	if r.Code != 0 {
		b.Fatalf("upgrade: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 20))
	}
	tl.stop()
	evs := simtest.Events(b, r.Stdout)
	run := toolRun{Seconds: r.Took.Seconds(), Phases: phasesOf(evs), Requests: map[string]float64{}}
	summary := evs[len(evs)-1]
	if req, ok := summary["requests"].(map[string]any); ok {
		for k, v := range req {
			run.Requests[k] = v.(float64) / float64(sc.Replicas)
		}
	}
	run.FloorSeconds, run.ReactionMs = tl.against(b, evs)
	reactions := slices.Sorted(slices.Values(run.ReactionMs))
	b.Logf("floor %.1fs, overhead %.2fs per machine (hand-over %.2fs), requests per machine %.0f + %.0f, etcd %.0f, reaction p50 %.0f ms, max %.0f ms",
		run.FloorSeconds, (run.Seconds-run.FloorSeconds)/float64(sc.Replicas), (run.Phases["pause"]+run.Phases["await-kcp"])/float64(sc.Replicas),
		run.Requests["management"], run.Requests["workload"], run.Requests["etcd"], percentile(reactions, 50), percentile(reactions, 100))
	return run
}

// phasesOf sums the summary's steps by phase. A machine's deletion is waited
// on twice: up to its pre-terminate stage (after delete) and until it is gone
// (after release); the two are told apart by the step before.
func phasesOf(evs []map[string]any) map[string]float64 {
	phases := map[string]float64{}
	steps, _ := evs[len(evs)-1]["steps"].([]any)
	prev := ""
	for _, s := range steps {
		st := s.(map[string]any)
		action := st["action"].(string)
		phase := action
		switch {
		case action == "await-deletion" && prev == "release":
			phase = "await-deletion (hook released → gone)"
		case action == "await-deletion":
			phase = "await-deletion (→ pre-terminate stage)"
		}
		phases[phase] += st["durationMs"].(float64) / 1000
		prev = action
	}
	return phases
}

// benchKCP sets the version (and the surge) on the KubeadmControlPlane, as a
// user would without the tool, and times the real KCP controller until every
// machine runs it, the control plane is healthy and KCP itself says it is
// done — what the tool waits for after its hand-back (rollout.Unsettled).
func benchKCP(b *testing.B, sc benchScenario) float64 {
	s := simtest.StartOwn(b, benchOptions(sc)).Sim
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := s.ManagementClient().Get(ctx, s.KCPKey(), kcp); err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	patch := client.MergeFrom(kcp.DeepCopy())
	kcp.Spec.Version = to
	surge := intstr.FromInt(sc.MaxSurge)
	kcp.Spec.Rollout.Strategy.Type = controlplanev1.RollingUpdateStrategyType
	kcp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge = &surge
	if err := s.ManagementClient().Patch(ctx, kcp, patch); err != nil {
		b.Fatal(err)
	}
	simtest.Eventually(b, 15*time.Minute, "KCP upgrading every machine to "+to, func(ctx context.Context) (bool, string, error) {
		machines, err := s.Machines(ctx)
		if err != nil {
			return false, "", err
		}
		for _, m := range machines {
			if m.Spec.Version != to {
				return false, "machine " + m.Name + " at " + m.Spec.Version, nil
			}
		}
		if len(machines) != int(sc.Replicas) {
			return false, fmt.Sprintf("%d machines", len(machines)), nil
		}
		if ok, why, err := s.Ready(ctx); !ok || err != nil {
			return ok, why, err
		}
		return kcpAgrees(ctx, s)
	})
	return time.Since(began).Seconds()
}

// timeline is when the benchmark's own watch saw each machine reach each
// stage; the tool's events are set against it.
type timeline struct {
	mu     sync.Mutex
	stages map[string]map[string]time.Time // machine → stage → first seen
	cancel context.CancelFunc
	done   chan struct{}
}

// The stages a timeline records.
const (
	stageCreated      = "created"
	stageNode         = "node"
	stageDeleting     = "deleting"
	stagePreTerminate = "pre-terminate"
	stageGone         = "gone"
)

func watchTimeline(b *testing.B, s *sim.Sim) *timeline {
	wc, err := client.NewWithWatch(s.ManagementConfig(), client.Options{Scheme: sim.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := wc.Watch(ctx, &clusterv1.MachineList{}, client.InNamespace(s.ClusterKey().Namespace))
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	tl := &timeline{stages: map[string]map[string]time.Time{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tl.done)
		defer w.Stop()
		for ev := range w.ResultChan() {
			m, ok := ev.Object.(*clusterv1.Machine)
			if !ok {
				continue
			}
			now := time.Now()
			tl.see(m.Name, stageCreated, now)
			if m.Status.NodeRef.IsDefined() {
				tl.see(m.Name, stageNode, now)
			}
			if !m.DeletionTimestamp.IsZero() {
				tl.see(m.Name, stageDeleting, now)
			}
			if c := conditions.Get(m, clusterv1.MachineDeletingCondition); c != nil && c.Reason == clusterv1.MachineDeletingWaitingForPreTerminateHookReason {
				tl.see(m.Name, stagePreTerminate, now)
			}
			if ev.Type == watch.Deleted {
				tl.see(m.Name, stageGone, now)
			}
		}
	}()
	return tl
}

func (tl *timeline) see(machine, stage string, at time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.stages[machine] == nil {
		tl.stages[machine] = map[string]time.Time{}
	}
	if _, ok := tl.stages[machine][stage]; !ok {
		tl.stages[machine][stage] = at
	}
}

func (tl *timeline) stop() {
	tl.cancel()
	<-tl.done
}

// against sets the tool's events against the timeline. The floor adds up,
// for each machine the tool created, creation to node, and for each it
// deleted, deletion to its pre-terminate stage, the time etcd refused to
// remove its member (heldMs) and hook release to gone.
// A reaction is from a change the tool was waiting for — a node, a
// pre-terminate stage, a machine gone — to the event that ended the wait.
func (tl *timeline) against(b *testing.B, evs []map[string]any) (floor float64, reactionsMs []float64) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	at := func(ev map[string]any) time.Time {
		t, err := time.Parse(time.RFC3339Nano, ev["time"].(string))
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	react := func(change time.Time, ev map[string]any) {
		if !change.IsZero() {
			reactionsMs = append(reactionsMs, float64(at(ev).Sub(change).Microseconds())/1000)
		}
	}
	released := map[string]time.Time{}
	for _, ev := range evs {
		machine, _ := ev["machine"].(string)
		st := tl.stages[machine]
		if st == nil || ev["phase"] != "done" {
			continue
		}
		switch ev["action"] {
		case "create":
			floor += st[stageNode].Sub(st[stageCreated]).Seconds()
		case "delete":
			floor += st[stagePreTerminate].Sub(st[stageDeleting]).Seconds()
		case "remove-member":
			// etcd's five-second rule after a join, as the tool measured it.
			held, _ := ev["heldMs"].(float64)
			floor += held / 1000
		case "release":
			released[machine] = at(ev)
		case "await-deletion":
			if r, ok := released[machine]; ok {
				floor += st[stageGone].Sub(r).Seconds()
				react(st[stageGone], ev)
			} else {
				react(st[stagePreTerminate], ev)
			}
		}
	}
	return floor, reactionsMs
}

// spread is the median and range of a figure over the runs.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return spread{Median: percentile(s, 50), Min: s[0], Max: s[len(s)-1]}
}

// percentile of sorted xs, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

type scenarioResult struct {
	Scenario benchScenario `json:"scenario"`
	Tool     []toolRun     `json:"toolRuns"`
	KCP      []float64     `json:"kcpRunsSeconds"`

	ToolSeconds spread `json:"toolSeconds"`
	KCPSeconds  spread `json:"kcpSeconds"`
	// Ratio is the tool's median over KCP's.
	Ratio float64 `json:"ratio"`
	// FloorSeconds and OverheadPerMachineSeconds: the tool's wall time above
	// the floor, per replaced machine (medians over the runs).
	FloorSeconds              spread `json:"floorSeconds"`
	OverheadPerMachineSeconds spread `json:"overheadPerMachineSeconds"`
	// HandoverPerMachineSeconds is the part of the overhead spent waiting on
	// KCP's own reconciles, at most one a second per object in Cluster API
	// v1.14 (ReconcilerRateLimiting): for it to report Paused, and after the
	// hand-back for it to agree the rollout is done.
	HandoverPerMachineSeconds spread `json:"handoverPerMachineSeconds"`
	// Phases are the medians of each phase's seconds per run.
	Phases map[string]float64 `json:"phases"`
	// RequestsPerMachine are the medians of round trips per replaced machine.
	RequestsPerMachine map[string]float64 `json:"requestsPerMachine"`
	// Reaction is over every reaction of every run.
	ReactionP50Ms float64 `json:"reactionP50Ms"`
	ReactionP99Ms float64 `json:"reactionP99Ms"`
	Reactions     int     `json:"reactions"`
}

func (r *scenarioResult) summarize() {
	var tool, floor, overhead, handover, reactions []float64
	phases, requests := map[string][]float64{}, map[string][]float64{}
	for _, t := range r.Tool {
		tool = append(tool, t.Seconds)
		floor = append(floor, t.FloorSeconds)
		overhead = append(overhead, (t.Seconds-t.FloorSeconds)/float64(r.Scenario.Replicas))
		handover = append(handover, (t.Phases["pause"]+t.Phases["await-kcp"])/float64(r.Scenario.Replicas))
		reactions = append(reactions, t.ReactionMs...)
		for k, v := range t.Phases {
			phases[k] = append(phases[k], v)
		}
		for k, v := range t.Requests {
			requests[k] = append(requests[k], v)
		}
	}
	r.ToolSeconds, r.KCPSeconds = spreadOf(tool), spreadOf(r.KCP)
	if r.KCPSeconds.Median > 0 { // not when a -bench pattern ran the tool alone
		r.Ratio = r.ToolSeconds.Median / r.KCPSeconds.Median
	}
	r.FloorSeconds, r.OverheadPerMachineSeconds = spreadOf(floor), spreadOf(overhead)
	r.HandoverPerMachineSeconds = spreadOf(handover)
	r.Phases, r.RequestsPerMachine = map[string]float64{}, map[string]float64{}
	for k, v := range phases {
		r.Phases[k] = spreadOf(v).Median
	}
	for k, v := range requests {
		r.RequestsPerMachine[k] = spreadOf(v).Median
	}
	slices.Sort(reactions)
	r.Reactions = len(reactions)
	r.ReactionP50Ms, r.ReactionP99Ms = percentile(reactions, 50), percentile(reactions, 99)
}

func writeBenchResults(b *testing.B, dir string, runs int, results []scenarioResult) {
	cpu := "unknown"
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	doc := map[string]any{
		"date":    time.Now().UTC().Format(time.RFC3339),
		"machine": map[string]any{"cpus": runtime.NumCPU(), "cpu": cpu, "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH},
		"runs":    runs,
		"simulatedDelays": map[string]any{
			"provisionSeconds": benchProvision.Seconds(), "deletionSeconds": benchDeletion.Seconds()},
		"scenarios": results,
	}
	raw, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(dir+"/results.json", append(raw, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
	var md strings.Builder
	fmt.Fprintf(&md, "Measured %s on %d × %s (%s), %d runs per scenario, median (min–max).\n\n",
		doc["date"], runtime.NumCPU(), cpu, runtime.Version(), runs)
	md.WriteString("| scenario | tool s | KCP s | tool / KCP | floor s | overhead s per machine (of it KCP's hand-over) | requests per machine (mgmt + workload, etcd) | reaction p50 / p99 ms |\n")
	md.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range results {
		q := r.RequestsPerMachine
		fmt.Fprintf(&md, "| %s | %s | %s | %.2f | %.1f | %.2f (%.2f) | %.0f + %.0f, %.0f | %.0f / %.0f (n=%d) |\n",
			r.Scenario.Name, fmtSpread(r.ToolSeconds), fmtSpread(r.KCPSeconds), r.Ratio, r.FloorSeconds.Median,
			r.OverheadPerMachineSeconds.Median, r.HandoverPerMachineSeconds.Median, q["management"], q["workload"], q["etcd"], r.ReactionP50Ms, r.ReactionP99Ms, r.Reactions)
	}
	md.WriteString("\nThe tool's time by phase, seconds per run (median):\n\n| phase |")
	for _, r := range results {
		md.WriteString(" " + r.Scenario.Name + " |")
	}
	md.WriteString("\n| --- |" + strings.Repeat(" --- |", len(results)) + "\n")
	var names []string
	for _, r := range results {
		for k := range r.Phases {
			if !slices.Contains(names, k) {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	for _, k := range names {
		md.WriteString("| " + k + " |")
		for _, r := range results {
			fmt.Fprintf(&md, " %.2f |", r.Phases[k])
		}
		md.WriteString("\n")
	}
	if err := os.WriteFile(dir+"/results.md", []byte(md.String()), 0o644); err != nil {
		b.Fatal(err)
	}
	fmt.Print(md.String())
}

func fmtSpread(s spread) string { return fmt.Sprintf("%.1f (%.1f–%.1f)", s.Median, s.Min, s.Max) }

// kcpAgrees is rollout.Unsettled read from the simulator: KCP has observed its
// spec and reports every machine at its version and up to date.
func kcpAgrees(ctx context.Context, s *sim.Sim) (bool, string, error) {
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := s.ManagementClient().Get(ctx, s.KCPKey(), kcp); err != nil {
		return false, "", err
	}
	machines, err := s.Machines(ctx)
	if err != nil {
		return false, "", err
	}
	cp := &kcpstate.ControlPlane{KCP: kcp, Machines: collections.New()}
	for i := range machines {
		cp.Machines.Insert(&machines[i])
	}
	if unsettled := rollout.Unsettled(cp); len(unsettled) > 0 {
		return false, unsettled[0], nil
	}
	return true, "", nil
}
