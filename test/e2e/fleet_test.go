package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// fleetOf starts n simulated clusters on the shared management cluster, each
// in a namespace of its own (<prefix>-1 …, so that they sort in start order)
// and labelled fleet=<prefix>: what `-A -l fleet=<prefix>` selects, and no
// other scenario's cluster. replicas gives each cluster's control-plane size.
func fleetOf(t *testing.T, prefix string, replicas ...int32) []*env {
	t.Helper()
	envs := make([]*env, len(replicas))
	for i, r := range replicas {
		opts := fastOptions(r)
		opts.Namespace = fmt.Sprintf("%s-%d", prefix, i+1)
		opts.Labels = map[string]string{"fleet": prefix}
		envs[i] = simtest.Start(t, opts)
	}
	return envs
}

// pausedPeak watches the fleet's KubeadmControlPlanes every 100 ms and
// records the most that were paused at once.
type pausedPeak struct {
	stop func() int
}

func watchPaused(t *testing.T, envs []*env) *pausedPeak {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := envs[0].Sim.ManagementClient()
	peak, done := 0, make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			paused := 0
			for _, e := range envs {
				kcp := &controlplanev1.KubeadmControlPlane{}
				if err := c.Get(ctx, e.Sim.KCPKey(), kcp); err == nil {
					if _, ok := kcp.Annotations[clusterv1.PausedAnnotation]; ok {
						paused++
					}
				}
			}
			peak = max(peak, paused)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return &pausedPeak{stop: func() int { cancel(); <-done; return peak }}
}

// fleetEvent is the closing "fleet" event of a run with -o json.
type fleetEvent struct {
	Action   string `json:"action"`
	ExitCode int    `json:"exitCode"`
	Clusters []struct {
		Namespace string `json:"namespace"`
		Cluster   string `json:"cluster"`
		Result    string `json:"result"`
		ExitCode  *int   `json:"exitCode"`
		Machines  string `json:"machines"`
		Message   string `json:"message"`
	} `json:"clusters"`
}

// lastFleetEvent is the fleet event that closes stdout, or, when the run
// failed, the one just before the error object that then ends it.
func lastFleetEvent(t *testing.T, stdout string) fleetEvent {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	last := lines[len(lines)-1]
	if errorObject(last) != nil && len(lines) > 1 {
		last = lines[len(lines)-2]
	}
	var ev fleetEvent
	if err := json.Unmarshal([]byte(last), &ev); err != nil || ev.Action != "fleet" {
		t.Fatalf("the last line is not the fleet event (%v): %q", err, last)
	}
	return ev
}

// runError is the object that ends a failed run's -o json output.
type runError struct {
	Action   string `json:"action"`
	Phase    string `json:"phase"`
	ExitCode int    `json:"exitCode"`
	Class    string `json:"class"`
	Message  string `json:"message"`
}

// errorObject is line as the error object, or nil when it is another event.
func errorObject(line string) *runError {
	var e runError
	if json.Unmarshal([]byte(line), &e) != nil || e.Action != "error" {
		return nil
	}
	return &e
}

func resultsOf(ev fleetEvent) map[string]string {
	out := map[string]string{}
	for _, c := range ev.Clusters {
		out[c.Namespace] = c.Result
	}
	return out
}

// Four clusters upgraded two at a time: all reach the target, never more than
// two KubeadmControlPlanes are paused at once, and every cluster keeps the
// rollout's invariants throughout.
func TestFleetUpgradeTwoAtATime(t *testing.T) {
	t.Parallel()
	envs := fleetOf(t, "fleet-two", 3, 3, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var monitors []*monitor
	for _, e := range envs {
		replicas := int(e.Sim.Options().Replicas)
		monitors = append(monitors, watchInvariants(t, e, replicas+1, (replicas+1)/2))
	}
	paused := watchPaused(t, envs)
	r := envs[0].Plugin(t, ctx, "upgrade", "-A", "-l", "fleet=fleet-two", "--version", to, "--parallel", "2", "-o", "json")
	peak := paused.stop()
	t.Logf("at most %d KubeadmControlPlanes were paused at once", peak)
	for _, m := range monitors {
		m.check(t)
	}
	if r.Code != 0 {
		t.Fatalf("fleet upgrade: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 30))
	}
	if peak > 2 {
		t.Errorf("%d KubeadmControlPlanes were paused at once; --parallel 2 allows 2", peak)
	}
	if peak < 2 {
		t.Errorf("at most %d KubeadmControlPlane was paused at once: the clusters did not run two at a time", peak)
	}
	ev := lastFleetEvent(t, r.Stdout)
	for _, c := range ev.Clusters {
		if c.Result != "done" || c.ExitCode == nil || *c.ExitCode != 0 {
			t.Errorf("%s/%s: %s, exit %v, want done with exit 0", c.Namespace, c.Cluster, c.Result, c.ExitCode)
		}
	}
	for _, e := range envs {
		assertConverged(t, e, int(e.Sim.Options().Replicas), to)
	}
	// Each run's events name their cluster, and each cluster's steps are on
	// its own KubeadmControlPlane's audit trail.
	seen := map[string]bool{}
	for _, ev := range simtest.Events(t, r.Stdout) {
		if ev["action"] == "create" && ev["phase"] == "done" {
			seen[stringOf(ev["namespace"])] = true
		}
	}
	if len(seen) != len(envs) {
		t.Errorf("create events came from %v, want every cluster's namespace", seen)
	}

	// The table a person reads, and the fleet's rows in status.
	again := envs[0].Plugin(t, ctx, "upgrade", "-A", "-l", "fleet=fleet-two", "--version", to)
	if again.Code != 0 || strings.Count(again.Stdout, "  done ") != len(envs) {
		t.Errorf("re-run: exit %d, table:\n%s\nwant every cluster done (nothing to do)", again.Code, again.Stdout)
	}
	st := envs[0].Plugin(t, ctx, "status", "-A", "-l", "fleet=fleet-two", "--etcd")
	if st.Code != 0 {
		t.Fatalf("status -A: exit %d\n%s", st.Code, st.Stderr)
	}
	for _, e := range envs {
		n := e.Sim.Options().Replicas
		row := fmt.Sprintf("%s/demo  %s", e.Sim.Options().Namespace, to)
		health := fmt.Sprintf("%d/%d healthy", n, n)
		if !strings.Contains(st.Stdout, row) || !strings.Contains(st.Stdout, health) {
			t.Errorf("status -A --etcd lacks %q with %q:\n%s", row, health, st.Stdout)
		}
	}
}

// One of four clusters cannot be upgraded (an etcd member is stopped). With
// --max-failures 0 the cluster in flight beside it finishes and no new one
// starts; with --max-failures 1 all the others finish. Either way the
// summary names the failure and the exit code is the refusal's.
func TestFleetMaxFailures(t *testing.T) {
	t.Parallel()
	envs := fleetOf(t, "fleet-fail", 1, 3, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	broken := envs[1]
	machines, err := broken.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := broken.Sim.StopMember(machines[0].Status.NodeRef.Name); err != nil {
		t.Fatal(err)
	}
	args := []string{"upgrade", "-A", "-l", "fleet=fleet-fail", "--version", to, "--parallel", "2", "-o", "json"}

	r := envs[0].Plugin(t, ctx, append(args, "--max-failures", "0")...)
	if r.Code != 3 {
		t.Fatalf("--max-failures 0: exit %d, want 3 (the refusal)\n%s", r.Code, simtest.Tail(r.Stderr, 30))
	}
	got := resultsOf(lastFleetEvent(t, r.Stdout))
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if e := errorObject(lines[len(lines)-1]); e == nil || e.ExitCode != 3 || e.Class != "unsafe" || e.Phase != "failed" || !strings.Contains(e.Message, "1 of 4 clusters failed") {
		t.Errorf("the failed fleet run's stdout does not end with its error object (exit 3, class unsafe): %q", lines[len(lines)-1])
	}
	want := map[string]string{"fleet-fail-1": "done", "fleet-fail-2": "failed", "fleet-fail-3": "not started", "fleet-fail-4": "not started"}
	for ns, w := range want {
		if got[ns] != w {
			t.Errorf("--max-failures 0: %s %q, want %q (all: %v)", ns, got[ns], w, got)
		}
	}
	if !strings.Contains(r.Stderr, "1 of 4 clusters failed") || !strings.Contains(r.Stderr, "2 not started (--max-failures 0)") {
		t.Errorf("the error does not say what failed and what did not start:\n%s", simtest.Tail(r.Stderr, 5))
	}
	assertConverged(t, envs[0], 1, to)
	for _, e := range envs[2:] {
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := e.Sim.ManagementClient().Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
			t.Fatal(err)
		}
		if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused || kcp.Spec.Version != from {
			t.Errorf("%s, never started, was changed: version %s, annotations %v", e.Sim.Options().Namespace, kcp.Spec.Version, kcp.Annotations)
		}
	}

	r = envs[0].Plugin(t, ctx, append(args, "--max-failures", "1")...)
	if r.Code != 3 {
		t.Fatalf("--max-failures 1: exit %d, want 3\n%s", r.Code, simtest.Tail(r.Stderr, 30))
	}
	got = resultsOf(lastFleetEvent(t, r.Stdout))
	want = map[string]string{"fleet-fail-1": "done", "fleet-fail-2": "failed", "fleet-fail-3": "done", "fleet-fail-4": "done"}
	for ns, w := range want {
		if got[ns] != w {
			t.Errorf("--max-failures 1: %s %q, want %q (all: %v)", ns, got[ns], w, got)
		}
	}
	for _, e := range []*env{envs[0], envs[2], envs[3]} {
		assertConverged(t, e, 1, to)
	}
}

// Ctrl-C stops every cluster in flight; the same command then brings every
// cluster to the target.
func TestFleetInterruptedThenResumed(t *testing.T) {
	t.Parallel()
	envs := fleetOf(t, "fleet-int", 1, 1, 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	args := []string{"upgrade", "-A", "-l", "fleet=fleet-int", "--version", to, "--parallel", "2", "-o", "json"}
	run := envs[0].StartPlugin(t, args...)
	run.Until(t, func(ev map[string]any) bool { return ev["action"] == "create" && ev["phase"] == "done" })
	if code := run.Interrupt(); code != 130 {
		t.Fatalf("interrupted fleet run: exit %d, want 130\n%s", code, simtest.Tail(run.Stderr(), 20))
	}
	// Its closing event says which clusters were stopped mid-run.
	var closing, last map[string]any
	for ev := range run.Events {
		if ev["action"] == "fleet" {
			closing = ev
		}
		last = ev
	}
	if closing == nil || closing["exitCode"] != float64(130) || !strings.Contains(fmt.Sprint(closing["clusters"]), "result:stopped") {
		t.Errorf("the interrupted run's fleet event %v: want exit code 130 and stopped clusters", closing)
	}
	// After it, the object that ends every failed run's -o json output.
	if last["action"] != "error" || last["exitCode"] != float64(130) || last["class"] != "interrupted" {
		t.Errorf("the interrupted run's last event %v: want its error object, exit code 130, class interrupted", last)
	}
	paused := 0
	for _, e := range envs {
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := e.Sim.ManagementClient().Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
			t.Fatal(err)
		}
		if _, ok := kcp.Annotations[clusterv1.PausedAnnotation]; ok {
			paused++
		}
	}
	if paused == 0 {
		t.Fatalf("no KubeadmControlPlane was left paused by the interrupted run: it did not stop mid-rollout")
	}
	r := envs[0].Plugin(t, ctx, args...)
	if r.Code != 0 {
		t.Fatalf("re-run: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 30))
	}
	for _, e := range envs {
		assertConverged(t, e, 1, to)
	}
}
