package e2e

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// Compound faults: two things wrong at once. A single dead machine is the
// runbook of docs/recovery.md; these scenarios break two machines (or all of
// them) and hold the tool to the same rules: every refusal exits 3, changes
// nothing and names a command that moves forward; a run that goes on keeps
// quorum and one machine with every component healthy; KCP, handed back,
// finds nothing to do.

// compoundRuns runs the plugin for a scenario and keeps what each run took,
// for the summary the scenario logs at its end.
type compoundRuns struct {
	e    *env
	runs []string
}

func (l *compoundRuns) run(t *testing.T, ctx context.Context, args ...string) simtest.Result {
	t.Helper()
	r := l.e.Plugin(t, ctx, args...)
	l.runs = append(l.runs, fmt.Sprintf("%-70s exit %d in %s", strings.Join(args, " "), r.Code, r.Took.Round(100*time.Millisecond)))
	return r
}

// report logs every run's time and exit code and the monitor's peak machines
// and lowest healthy voters. Deferred, it also runs when the scenario fails
// half-way: then it checks the monitor too (the breaches say how far the run
// got) and logs the machines as they were left.
func (l *compoundRuns) report(t *testing.T, mon *monitor, checked *bool) {
	t.Helper()
	if !*checked {
		mon.halt()
		if t.Failed() {
			logMachines(t, l.e, mon)
		}
		mon.check(t)
	}
	mon.mu.Lock()
	peak, low := mon.peak, mon.lowHealthy
	mon.mu.Unlock()
	lowest := fmt.Sprint(low)
	if low == 1<<30 {
		lowest = "never read"
	}
	t.Logf("summary of %s: peak %d machines, lowest %s healthy voting members\n  %s", t.Name(), peak, lowest, strings.Join(l.runs, "\n  "))
}

// machinesByAge lists the control-plane machines oldest first, ties by name
// (the order of Cluster API's SortedByCreationTimestamp).
func machinesByAge(t *testing.T, ctx context.Context, e *env) []clusterv1.Machine {
	t.Helper()
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortStableFunc(machines, func(a, b clusterv1.Machine) int {
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			if a.CreationTimestamp.Before(&b.CreationTimestamp) {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return machines
}

// logMachines logs the machines, their deletion stage, the etcd members
// (probed one by one, as the monitor does) and the KCP's pause: where a run
// that failed left the control plane.
func logMachines(t *testing.T, e *env, mon *monitor) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Logf("listing machines: %v", err)
		return
	}
	var lines []string
	for _, m := range machines {
		line := fmt.Sprintf("%s %s node=%s", m.Name, m.Spec.Version, m.Status.NodeRef.Name)
		if !m.DeletionTimestamp.IsZero() {
			line += " DELETING"
			if c := conditions.Get(&m, clusterv1.MachineDeletingCondition); c != nil {
				line += " (" + c.Reason + ")"
			}
			if hasPreTerminateHook(&m) {
				line += " pre-terminate hook still set"
			}
		}
		lines = append(lines, line)
	}
	kcp := kcpOf(t, e)
	_, paused := kcp.Annotations[clusterv1.PausedAnnotation]
	members, err := mon.etcd.Members(ctx, mon.memberNodes())
	t.Logf("left behind: KCP %s paused=%v record=%v\n  machines: %s\n  etcd members: %s (err %v)",
		kcp.Spec.Version, paused, kcp.Annotations[record.Annotation] != "", strings.Join(lines, "\n            "), describe(members), err)
}

// hasPreTerminateHook reports whether m still carries a pre-terminate hook.
func hasPreTerminateHook(m *clusterv1.Machine) bool {
	for k := range m.Annotations {
		if strings.HasPrefix(k, clusterv1.PreTerminateDeleteHookAnnotationPrefix) {
			return true
		}
	}
	return false
}

// namedReplace finds the replace command a refusal names, as the user would
// copy it: "kubectl cp-rollout replace CLUSTER MACHINE [-n NAMESPACE]".
var namedReplace = regexp.MustCompile(`kubectl cp-rollout (replace \S+ [^\s,;:]+(?: -n [^\s,;:]+)?)`)

// whyNoWorkingMachine and whatToDoByHand are what a refusal must say when no
// machine would keep its components working: why, and what to do instead.
var (
	whyNoWorkingMachine = regexp.MustCompile(`(?i)no (control-plane )?machine with (all|every) (of )?its components (working|healthy)|no (healthy|working) (control-plane )?machine`)
	whatToDoByHand      = regexp.MustCompile(`(?i)by hand|bring .* back|restore`)
)

// Two of five machines dead at once (members stopped, API server pods
// unready, as crashed hosts whose kubelets still report). Three of five
// voters keep quorum, so `upgrade --replace-unhealthy` can replace both dead
// machines first, one at a time — each deleted before its replacement comes,
// as its lost member counts against every add — and then upgrade the other
// three: never fewer than three healthy voters, never more than six machines.
func TestCompoundTwoDeadMembersFiveReplicas(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e := fastSim(t, 5)
	machines := machinesByAge(t, ctx, e)
	dead := []string{machines[0].Name, machines[1].Name}
	for _, m := range machines[:2] {
		node := m.Status.NodeRef.Name
		if err := e.Sim.StopMember(node); err != nil {
			t.Fatal(err)
		}
		if err := e.Sim.SetStaticPodReady(ctx, node, "kube-apiserver", false); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("dead machines: %s and %s", dead[0], dead[1])
	mon := watchInvariants(t, e, 6, 3)
	l := &compoundRuns{e: e}
	checked := false
	defer l.report(t, mon, &checked)

	r := l.run(t, ctx, "upgrade", "demo", "--version", to, "--replace-unhealthy", "-o", "json")
	if r.Code != 0 {
		t.Fatalf("upgrade --replace-unhealthy with machines %s and %s dead: exit %d, want 0", dead[0], dead[1], r.Code)
	}
	steps := machineSteps(t, r.Stdout)
	t.Logf("machine steps: %q", steps)
	var deletes []string
	for _, s := range steps {
		if name, ok := strings.CutPrefix(s, "delete "); ok {
			deletes = append(deletes, name)
		}
	}
	if len(steps) == 0 || !strings.HasPrefix(steps[0], "delete ") || !slices.Contains(dead, strings.TrimPrefix(steps[0], "delete ")) {
		t.Errorf("machine steps %q: want a dead machine (%s) deleted first", steps, strings.Join(dead, ", "))
	}
	if len(deletes) != 5 || !slices.Contains(deletes[:2], dead[0]) || !slices.Contains(deletes[:2], dead[1]) {
		t.Errorf("deletions %q: want five, the dead machines %s first", deletes, strings.Join(dead, ", "))
	}
	checked = true
	mon.check(t)
	for _, d := range dead {
		machineGone(t, ctx, e, d)
	}
	assertConverged(t, e, 5, to)
	assertKCPIdle(t, e)
}

// Two machines broken in different ways: A's etcd member stopped (lost), B's
// API server pod unready (its member healthy). B is the older, although B
// cannot go first: with A's member lost, neither adding a member nor removing
// B's keeps quorum. The scenario follows what the tool tells the user,
// refusal after refusal, until an upgrade passes: every refusal must exit 3,
// say and keep that nothing was changed, and name a replace command that
// moves forward — not one that refused before (a circle), and not none (a
// dead end). A replace that succeeds and names the next one is followed too.
// On a dead end the scenario says so and takes the other way the first
// refusal offered, --replace-unhealthy, which must converge.
func TestCompoundDeadMemberAndAPIServerDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e := fastSim(t, 3)
	machines := machinesByAge(t, ctx, e)
	b, a := machines[0], machines[1]
	if err := e.Sim.SetStaticPodReady(ctx, b.Status.NodeRef.Name, "kube-apiserver", false); err != nil {
		t.Fatal(err)
	}
	if err := e.Sim.StopMember(a.Status.NodeRef.Name); err != nil {
		t.Fatal(err)
	}
	t.Logf("machine A %s: etcd member stopped; machine B %s: kube-apiserver unready", a.Name, b.Name)
	mon := watchInvariants(t, e, 4, 2)
	l := &compoundRuns{e: e}
	checked := false
	defer l.report(t, mon, &checked)

	upgrade := []string{"upgrade", "demo", "--version", to}
	cmd := upgrade
	refused := map[string]bool{} // commands that refused, by their words
	replaced := map[string]bool{}
	deadEnd := false
	for i := 0; ; i++ {
		if i == 8 {
			t.Fatalf("still refused after %d runs", i)
		}
		what := strings.Join(cmd, " ")
		before := quietVersions(t, e)
		r := l.run(t, ctx, cmd...)
		if r.Code == 0 {
			if cmd[0] == "upgrade" {
				break
			}
			replaced[cmd[2]] = true
			cmd = upgrade
			// A replace that leaves other machines broken names the next.
			if m := namedReplace.FindStringSubmatch(r.Stderr + r.Stdout); m != nil && !replaced[strings.Fields(m[1])[2]] {
				cmd = strings.Fields(m[1])
			}
			continue
		}
		if r.Code != 3 {
			t.Fatalf("%s: exit %d, want 0 or a refusal (3)", what, r.Code)
		}
		if !strings.Contains(r.Stderr, "nothing was changed") {
			t.Errorf("%s: the refusal does not say nothing was changed:\n%s", what, r.Stderr)
		}
		assertUnchanged(t, before, versions(t, e))
		refused[what] = true
		if i == 0 && !strings.Contains(r.Stderr, "--replace-unhealthy") {
			t.Errorf("upgrade's refusal does not offer --replace-unhealthy:\n%s", r.Stderr)
		}
		match := namedReplace.FindStringSubmatch(r.Stderr)
		if match == nil {
			t.Errorf("%s: the refusal names no replace command (a dead end for whoever followed the refusal before it):\n%s", what, r.Stderr)
			deadEnd = true
			break
		}
		next := strings.Fields(match[1])
		if m := next[2]; m != a.Name && m != b.Name {
			t.Errorf("%s: the refusal names machine %s, neither A %s nor B %s", what, m, a.Name, b.Name)
		}
		if refused[strings.Join(next, " ")] || replaced[next[2]] {
			t.Errorf("%s refuses and names %q, which refused before (or was replaced already): the refusals go round in a circle", what, strings.Join(next, " "))
			deadEnd = true
			break
		}
		cmd = next
	}
	if deadEnd {
		r := l.run(t, ctx, "upgrade", "demo", "--version", to, "--replace-unhealthy", "-o", "json")
		if r.Code != 0 {
			t.Fatalf("upgrade --replace-unhealthy, the other way the refusal offered: exit %d, want 0", r.Code)
		}
		t.Logf("machine steps of upgrade --replace-unhealthy: %q", machineSteps(t, r.Stdout))
	}
	checked = true
	mon.check(t)
	machineGone(t, ctx, e, a.Name)
	machineGone(t, ctx, e, b.Name)
	assertConverged(t, e, 3, to)
	assertKCPIdle(t, e)
}

// Every machine's API server pod unready, etcd healthy: each is condemned, or
// would be, and replacing any of them would leave no machine with every
// component healthy for the run to lean on (on a real cluster the workload
// API server is then unreachable). Every run refuses: exit 3, nothing
// created or deleted, the KCP not left paused, and a message that says why
// and what to do instead — and never names a command that refuses in turn.
func TestCompoundAllCondemnedEtcdHealthy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := fastSim(t, 3)
	machines := machinesByAge(t, ctx, e)
	var all []string
	for _, m := range machines {
		if err := e.Sim.SetStaticPodReady(ctx, m.Status.NodeRef.Name, "kube-apiserver", false); err != nil {
			t.Fatal(err)
		}
		all = append(all, m.Name)
	}
	mon := watchInvariants(t, e, 3, 3)
	l := &compoundRuns{e: e}
	checked := false
	defer l.report(t, mon, &checked)

	refusals := map[string]string{} // command -> its refusal
	runs := [][]string{{"upgrade", "demo", "--version", to, "--replace-unhealthy"}}
	for _, m := range all {
		runs = append(runs, []string{"replace", "demo", m})
	}
	runs = append(runs, []string{"upgrade", "demo", "--version", to})
	for _, args := range runs {
		what := strings.Join(args, " ")
		before := quietVersions(t, e)
		r := l.run(t, ctx, args...)
		refusals[what] = r.Stderr
		if r.Code != 3 {
			t.Errorf("%s with every API server pod unready: exit %d, want 3", what, r.Code)
		}
		after := versions(t, e)
		if strings.Contains(r.Stderr, "nothing was changed") {
			assertUnchanged(t, before, after)
		} else {
			// No claim to hold it to; still, no machine may come or go (the
			// rest is logged: a pause taken and given back moves the KCP).
			for k, v := range before {
				if after[k] != v {
					t.Logf("%s: %s changed: resourceVersion %s -> %s", what, k, v, after[k])
				}
			}
			for k := range before {
				if strings.HasPrefix(k, "machine/") && after[k] == "" {
					t.Errorf("%s: %s is gone", what, k)
				}
			}
			for k := range after {
				if strings.HasPrefix(k, "machine/") && before[k] == "" {
					t.Errorf("%s: %s appeared", what, k)
				}
			}
		}
		kcp := kcpOf(t, e)
		if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused && !strings.Contains(r.Stderr, "paused") {
			t.Errorf("%s left the KCP paused without saying so:\n%s", what, r.Stderr)
		}
		if args[0] == "upgrade" && args[len(args)-1] == "--replace-unhealthy" || args[0] == "replace" {
			// Why: no machine with every component healthy (working) would
			// remain; and what to do instead of a replacement.
			if !whyNoWorkingMachine.MatchString(r.Stderr) {
				t.Errorf("%s: the refusal does not say that no machine with working components would remain:\n%s", what, r.Stderr)
			}
			if !whatToDoByHand.MatchString(r.Stderr) {
				t.Errorf("%s: the refusal does not say what to do (bring a machine's components back):\n%s", what, r.Stderr)
			}
		}
		if !strings.Contains(r.Stderr, "kube-apiserver") {
			t.Errorf("%s: the refusal does not name what is wrong (the kube-apiserver pods):\n%s", what, r.Stderr)
		}
		machineSet := mustMachines(t, e)
		slices.Sort(machineSet)
		want := slices.Clone(all)
		slices.Sort(want)
		if !slices.Equal(machineSet, want) {
			t.Errorf("%s: machines %v, want %v unchanged", what, machineSet, want)
		}
	}
	// What to do: a refusal must not send the user to a command that refuses
	// too (each of them was just run and refused).
	for what, stderr := range refusals {
		if m := namedReplace.FindStringSubmatch(stderr); m != nil {
			named := strings.Join(strings.Fields(m[1])[:3], " ")
			if _, ran := refusals[named]; ran {
				t.Errorf("%s names %q, which refuses too: a dead end", what, m[1])
			}
		}
		if strings.Contains(stderr, "re-run with --replace-unhealthy") {
			t.Errorf("%s offers --replace-unhealthy, which refuses too: a dead end", what)
		}
	}
	checked = true
	mon.check(t)
	for _, m := range all {
		machineStays(t, ctx, e, m)
	}
	kcp := kcpOf(t, e)
	if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused || kcp.Annotations[record.Annotation] != "" {
		t.Errorf("KCP left paused or with the tool's record: %v", kcp.Annotations)
	}
	if kcp.Spec.Version != from {
		t.Errorf("KCP asks for %s, want %s unchanged", kcp.Spec.Version, from)
	}
	assertKCPIdle(t, e)
}

// machineStays fails the test unless machine is there and not deleting.
func machineStays(t *testing.T, ctx context.Context, e *env, machine string) {
	t.Helper()
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		if m.Name == machine {
			if !m.DeletionTimestamp.IsZero() {
				t.Errorf("machine %s is deleting", machine)
			}
			return
		}
	}
	t.Errorf("machine %s is gone", machine)
}
