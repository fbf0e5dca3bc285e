package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// The operator's gate fails from the second new machine on (it reads the
// machine step from its environment): the run stops there, exit 4, with
// the pause explained, the gate's command, the machine and the gate's last
// line named; the first old machine is gone, the others are not deleted.
func TestGateStopsTheRun(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	before := mustMachines(t, e)
	gate := `case "$CP_ROLLOUT_STEP" in 1/*) echo "smoke ok on $CP_ROLLOUT_NODE";; *) echo "smoke failed on $CP_ROLLOUT_NODE of $CP_ROLLOUT_CLUSTER"; exit 1;; esac`
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--gate", gate, "--gate-timeout", "5s")

	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var added []clusterv1.Machine
	gone, deleting := 0, 0
	for _, name := range before {
		found := false
		for _, m := range machines {
			if m.Name == name {
				found = true
				if !m.DeletionTimestamp.IsZero() {
					deleting++
				}
			}
		}
		if !found {
			gone++
		}
	}
	for _, m := range machines {
		if m.Spec.Version == to {
			added = append(added, m)
		}
	}
	if gone != 1 || deleting != 0 || len(added) != 2 {
		t.Fatalf("machines %s (before %v): want the first old machine gone, the other two intact, two new ones", names(machines), before)
	}
	second := added[1]
	if added[0].CreationTimestamp.After(added[1].CreationTimestamp.Time) {
		second = added[0]
	}
	says := []string{"gate `" + gate + "` did not pass", "machine " + second.Name, "smoke failed on " + second.Status.NodeRef.Name + " of demo",
		"stays paused by cp-rollout", "Re-run the same command to resume"}
	if r.Code != 4 {
		t.Errorf("exit %d, want 4", r.Code)
	}
	for _, s := range says {
		if !strings.Contains(r.Stderr, s) {
			t.Errorf("stderr does not say %q:\n%s", s, simtest.Tail(r.Stderr, 10))
		}
	}
	// The gate's own output goes to stderr, beside the progress.
	if !strings.Contains(r.Stderr, "smoke ok on ") {
		t.Errorf("stderr lacks the first gate's output:\n%s", simtest.Tail(r.Stderr, 30))
	}
}

// --gate-count 2 and --soak show in the run's step times: two gate passes
// and a soak of at least its length for the new machine, after its
// DaemonSets' wait and before the old machine goes.
func TestGateCountAndSoakInStepTimes(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 1, Version: from, ProvisionDelay: time.Second, DeleteDelay: 500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--gate", `echo "checked $CP_ROLLOUT_MACHINE"`, "--gate-count", "2", "--soak", "5s", "-o", "json")
	if r.Code != 0 {
		t.Fatalf("exit %d", r.Code)
	}
	// Every line of stdout is an event (Events fails on any other), and the
	// gate's output went to stderr.
	evs := simtest.Events(t, r.Stdout)
	if strings.Count(r.Stderr, "checked ") != 2 {
		t.Errorf("stderr does not carry the gate's output once a pass:\n%s", simtest.Tail(r.Stderr, 20))
	}
	summary := evs[len(evs)-1]
	steps, _ := summary["steps"].([]any)
	var seq []string
	var soak float64
	for _, s := range steps {
		step := s.(map[string]any)
		switch a := step["action"].(string); a {
		case "await-join", "await-daemonsets", "gate", "soak", "delete":
			seq = append(seq, a)
			if a == "soak" {
				soak = step["durationMs"].(float64)
			}
		}
	}
	if got, want := strings.Join(seq, " "), "await-join await-daemonsets gate gate soak delete"; got != want {
		t.Errorf("step times %q, want %q", got, want)
	}
	if soak < 5000 {
		t.Errorf("soak took %.0fms in the step times, want at least 5s", soak)
	}
	passes := 0
	for _, ev := range evs {
		if ev["action"] == "gate" && ev["phase"] == "done" {
			passes++
			if want := fmt.Sprintf("passed %d of 2 in a row", passes); ev["message"] != want {
				t.Errorf("gate done %q, want %q", ev["message"], want)
			}
		}
	}
	assertConverged(t, e, 1, to)
}

// kube-proxy never Ready on the nodes that join (the simulator's
// addon-unready): the run stops after the first new machine, exit 4,
// naming kube-proxy and the new node, no old machine deleted.
func TestGateDaemonSetsUnready(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cluster := &clusterv1.Cluster{}
	cluster.Namespace, cluster.Name = e.Sim.ClusterKey().Namespace, e.Sim.ClusterKey().Name
	applyFaults(t, e.Sim.ManagementClient(), cluster, sim.FaultAddonUnready)
	before := mustMachines(t, e)
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--health-timeout", "45s")
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var added *clusterv1.Machine
	intact := 0
	for i, m := range machines {
		switch {
		case m.Spec.Version == to:
			added = &machines[i]
		case m.DeletionTimestamp.IsZero():
			intact++
		}
	}
	if added == nil || intact != len(before) {
		t.Fatalf("machines %s (before %v): want one new machine and every old one intact", names(machines), before)
	}
	node := added.Status.NodeRef.Name
	if r.Code != 4 {
		t.Errorf("exit %d, want 4", r.Code)
	}
	for _, s := range []string{"DaemonSet kube-system/kube-proxy", "on node " + node, "Running, not Ready", "machine " + added.Name, "stays paused by cp-rollout"} {
		if !strings.Contains(r.Stderr, s) {
			t.Errorf("stderr does not say %q:\n%s", s, simtest.Tail(r.Stderr, 10))
		}
	}
}
