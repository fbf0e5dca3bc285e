package rollout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// gated are fast limits with the operator's gate set to command: attempts
// a millisecond apart.
func gated(command string, count int) Timeouts {
	limits := fast
	limits.Gates = Gates{Command: command, Count: count, Interval: time.Millisecond}
	return limits
}

// counted is a gate command that passes or fails by script, one letter an
// attempt (P passes, F fails), counting its attempts in a file under dir;
// past the script's end it passes. Each attempt says which it is.
func counted(t *testing.T, script string) (command, counter string) {
	counter = filepath.Join(t.TempDir(), "attempts")
	command = fmt.Sprintf(`n=$(cat %[1]s 2>/dev/null || echo 0); n=$((n+1)); echo $n > %[1]s; c=$(echo %[2]sP | cut -c$n); echo "attempt $n: $c"; [ "$c" != F ]`, counter, script)
	return command, counter
}

func attempts(t *testing.T, counter string) int {
	t.Helper()
	raw, err := os.ReadFile(counter)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := fmt.Sscan(string(raw), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// newMachine is a machine with a node, as a gate is given one.
func newMachine(name string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	m.Status.NodeRef.Name = "node-" + name
	return m
}

// After each new machine is healthy, and before the next step, the loop
// waits for its DaemonSets, passes the operator's gate --gate-count times,
// each pass a step of its own, then soaks; an old machine goes only after
// that.
func TestGatesBetweenMachines(t *testing.T) {
	old := machineSpec{outdated: true}
	f := newScripted(world(old, old, old))
	limits := gated("echo checked", 2)
	limits.Settle = time.Millisecond
	e, ev := engineFor(f, limits)
	e.GateOutput = &bytes.Buffer{}
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	ev.paired(t)
	var seq []string
	for _, x := range ev.all {
		if x.Phase == progress.Done && slices.Contains([]string{"await-join", "await-daemonsets", "gate", "soak", "delete"}, x.Action) {
			seq = append(seq, x.Action+" "+x.Machine+" "+x.Message)
		}
	}
	var want []string
	for i, r := range []string{"r1", "r2", "r3"} {
		want = append(want,
			"await-join "+r+" healthy",
			"await-daemonsets "+r+" every DaemonSet Ready on node node-"+r,
			"gate "+r+" passed 1 of 2 in a row",
			"gate "+r+" passed 2 of 2 in a row",
			"soak  soaked 1ms",
			fmt.Sprintf("delete m%d deletion started", i))
	}
	if got := strings.Join(seq, "\n"); got != strings.Join(want, "\n") {
		t.Fatalf("steps between machines:\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	if out := e.GateOutput.(*bytes.Buffer).String(); strings.Count(out, "checked\n") != 6 {
		t.Errorf("gate output %q: want the command's output once per pass, 6 passes", out)
	}
}

// A failure sets the count of passes in a row back to zero: with
// --gate-count 2, pass-fail-pass-pass takes four attempts, and a fail
// between every pass never lets the gate through.
func TestGateCountResetsOnFailure(t *testing.T) {
	for _, tc := range []struct {
		script   string
		attempts int
		passes   int // gate steps done
	}{
		{script: "PP", attempts: 2, passes: 2},
		{script: "PFPP", attempts: 4, passes: 3},
		{script: "FFPFPP", attempts: 6, passes: 3},
	} {
		t.Run(tc.script, func(t *testing.T) {
			command, counter := counted(t, tc.script)
			f := newScripted(world(machineSpec{}))
			e, ev := engineFor(f, gated(command, 2))
			e.GateOutput = &bytes.Buffer{}
			if err := (&loop{Engine: e}).passGate(t.Context(), newMachine("r1")); err != nil {
				t.Fatal(err)
			}
			ev.paired(t)
			if n := attempts(t, counter); n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
			if n := len(ev.of("gate", progress.Done)); n != tc.passes {
				t.Errorf("%d gate steps, want %d (one per pass)", n, tc.passes)
			}
			if last := ev.of("gate", progress.Done); len(last) == 0 || last[len(last)-1].Message != "passed 2 of 2 in a row" {
				t.Errorf("last gate step %v, want passed 2 of 2 in a row", last)
			}
			if strings.Contains(tc.script, "F") && !ev.find("gate", progress.Waiting, "0 of 2 passes in a row") {
				t.Errorf("no waiting event tells the count went back to 0: %v", ev.all)
			}
		})
	}
	t.Run("a fail between every pass", func(t *testing.T) {
		command, _ := counted(t, strings.Repeat("PF", 1000))
		limits := gated(command, 2)
		limits.Gates.Timeout = 300 * time.Millisecond
		e, _ := engineFor(newScripted(world(machineSpec{})), limits)
		e.GateOutput = &bytes.Buffer{}
		err := (&loop{Engine: e}).passGate(t.Context(), newMachine("r1"))
		if exitcode.Of(err) != exitcode.Timeout || !strings.Contains(err.Error(), "did not pass 2 times in a row") {
			t.Fatalf("got %v, want exit 4: never two passes in a row", err)
		}
	})
}

// A gate that does not pass within its bound stops the run, exit 4, naming
// the command, the machine and the command's last line; an attempt that
// hangs is killed at the bound with what it started.
func TestGateTimeout(t *testing.T) {
	t.Run("fails until the bound", func(t *testing.T) {
		command := `echo "checking etcd"; echo "etcd: 2 of 3 members healthy" >&2; exit 1`
		limits := gated(command, 1)
		limits.Gates.Timeout = 100 * time.Millisecond
		e, ev := engineFor(newScripted(world(machineSpec{})), limits)
		out := &bytes.Buffer{}
		e.GateOutput = out
		err := (&loop{Engine: e}).passGate(t.Context(), newMachine("r1"))
		if exitcode.Of(err) != exitcode.Timeout {
			t.Fatalf("got %v (exit %d), want exit 4", err, exitcode.Of(err))
		}
		for _, says := range []string{"gate `" + command + "` did not pass for machine r1", "--gate-timeout 100ms", "exit status 1: etcd: 2 of 3 members healthy", "a re-run passes this machine through the gates again"} {
			if !strings.Contains(err.Error(), says) {
				t.Errorf("error %q does not say %q", err, says)
			}
		}
		if !strings.Contains(out.String(), "checking etcd\n") || !strings.Contains(out.String(), "etcd: 2 of 3 members healthy\n") {
			t.Errorf("gate output %q: want its stdout and stderr", out)
		}
		if fails := ev.of("gate", progress.Failed); len(fails) != 1 {
			t.Errorf("gate failed events %v, want the one step failed", fails)
		}
		ev.paired(t)
	})
	t.Run("an attempt that hangs", func(t *testing.T) {
		marker := filepath.Join(t.TempDir(), "still-running")
		// The shell starts a child that would outlive it: the kill must
		// reach that too, or its pipe would hold the attempt open.
		command := fmt.Sprintf(`echo waiting; (sleep 1; touch %s) & wait`, marker)
		limits := gated(command, 1)
		limits.Gates.Timeout = 300 * time.Millisecond
		e, _ := engineFor(newScripted(world(machineSpec{})), limits)
		e.GateOutput = &bytes.Buffer{}
		began := time.Now()
		err := (&loop{Engine: e}).passGate(t.Context(), newMachine("r1"))
		took := time.Since(began)
		if exitcode.Of(err) != exitcode.Timeout || !strings.Contains(err.Error(), "did not finish within") || !strings.Contains(err.Error(), "waiting") {
			t.Fatalf("got %v, want exit 4 naming the killed attempt and its last line", err)
		}
		if took > 2*time.Second {
			t.Errorf("gave up after %s with a 300ms bound", took)
		}
		time.Sleep(1500 * time.Millisecond)
		if _, err := os.Stat(marker); err == nil {
			t.Error("the attempt's child outlived the kill")
		}
	})
}

// The gate's environment names the cluster, the namespace, the new machine,
// its node and the machine step.
func TestGateEnv(t *testing.T) {
	// The gate's variables alone: the test's own environment may hold
	// others of the tool's (make test sets CP_ROLLOUT_PLUGIN_DIR).
	dump := filepath.Join(t.TempDir(), "env")
	old := machineSpec{outdated: true}
	f := newScripted(world(old, old, old))
	e, _ := engineFor(f, gated(`env | grep -E '^CP_ROLLOUT_(CLUSTER|NAMESPACE|MACHINE|NODE|STEP)=' | sort >> `+dump, 1))
	e.GateOutput = &bytes.Buffer{}
	e.steps.total = 3
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, r := range []string{"r1", "r2", "r3"} {
		want = append(want, "CP_ROLLOUT_CLUSTER=demo", fmt.Sprintf("CP_ROLLOUT_MACHINE=%s", r), "CP_ROLLOUT_NAMESPACE=default",
			"CP_ROLLOUT_NODE=node-"+r, fmt.Sprintf("CP_ROLLOUT_STEP=%d/3", i+1))
	}
	if got := strings.TrimSpace(string(raw)); got != strings.Join(want, "\n") {
		t.Fatalf("gate environment:\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
}

// A DaemonSet Ready on the other control-plane nodes and not on the new one
// holds the run before the old machine goes; one that never comes up stops
// it at the health timeout, exit 4, naming the DaemonSet, its namespace, the
// node and the pod's state.
func TestAwaitDaemonSets(t *testing.T) {
	old := machineSpec{outdated: true}
	kubeProxy := func(node string) []workload.UnreadyDaemonSet {
		return []workload.UnreadyDaemonSet{{Namespace: "kube-system", Name: "kube-proxy", Node: node, Pod: "kube-proxy-x7k2p", State: "Running, not Ready: container kube-proxy not ready"}}
	}
	t.Run("comes up", func(t *testing.T) {
		f := newScripted(world(old, old, old))
		reads := map[string]int{}
		f.daemonSetsUnready = func(node string, peers []string) ([]workload.UnreadyDaemonSet, error) {
			if slices.Contains(peers, node) {
				return nil, fmt.Errorf("node %s among its peers %v", node, peers)
			}
			if reads[node]++; reads[node] <= 3 {
				return kubeProxy(node), nil
			}
			return nil, nil
		}
		e, ev := engineFor(f, fast)
		if err := converge(t, e, surge1); err != nil {
			t.Fatal(err)
		}
		ev.paired(t)
		if !ev.find("await-daemonsets", progress.Waiting, "DaemonSet kube-system/kube-proxy: pod kube-proxy-x7k2p on node node-r1 is Running, not Ready") {
			t.Errorf("no waiting event names the DaemonSet: %v", ev.of("await-daemonsets", progress.Waiting))
		}
		if n := len(ev.of("await-daemonsets", progress.Done)); n != 3 {
			t.Errorf("%d DaemonSet waits done, want one per new machine", n)
		}
	})
	t.Run("never comes up", func(t *testing.T) {
		f := newScripted(world(old, old, old))
		f.daemonSetsUnready = func(node string, _ []string) ([]workload.UnreadyDaemonSet, error) { return kubeProxy(node), nil }
		limits := fast
		limits.Health = 200 * time.Millisecond
		e, ev := engineFor(f, limits)
		err := converge(t, e, surge1)
		if exitcode.Of(err) != exitcode.Timeout {
			t.Fatalf("got %v (exit %d), want exit 4", err, exitcode.Of(err))
		}
		for _, says := range []string{"kube-system/kube-proxy", "node node-r1", "machine r1", "Running, not Ready", "--health-timeout"} {
			if !strings.Contains(err.Error(), says) {
				t.Errorf("error %q does not say %q", err, says)
			}
		}
		if got := strings.Join(f.calls, ", "); got != "create r1" {
			t.Errorf("calls %s: want the old machines left alone", got)
		}
		ev.paired(t)
	})
}

// A re-run after the gates stopped a run finds the machine that joined
// healthy and was never let through: before it deletes anything, it passes
// that machine, the newest of the operation on record, through the gates;
// machines older than the operation are not its to gate.
func TestRerunGatesTheMachineBeforeDeleting(t *testing.T) {
	old := machineSpec{outdated: true}
	w := world(old, old, old, machineSpec{}) // m3 joined during the operation
	started := w.CP.Machines["m3"].CreationTimestamp.Add(-30 * time.Second)
	raw, err := json.Marshal(record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "ops", Started: started})
	if err != nil {
		t.Fatal(err)
	}
	w.CP.KCP.Annotations = map[string]string{record.Annotation: string(raw)}
	f := newScripted(w)
	e, ev := engineFor(f, gated("echo checked", 1))
	e.GateOutput = &bytes.Buffer{}
	if err := converge(t, e, surge1); err != nil {
		t.Fatal(err)
	}
	var seq []string
	for _, x := range ev.all {
		if x.Phase == progress.Done && slices.Contains([]string{"await-daemonsets", "gate", "delete"}, x.Action) {
			seq = append(seq, x.Action+" "+x.Machine)
		}
	}
	if len(seq) < 3 || strings.Join(seq[:3], ", ") != "await-daemonsets m3, gate m3, delete m0" {
		t.Fatalf("steps: %v, want m3 through the gates before m0 is deleted", seq)
	}
	if n := strings.Count(strings.Join(seq, ","), "gate m3"); n != 1 {
		t.Errorf("m3 gated %d times, want once: %v", n, seq)
	}
}
