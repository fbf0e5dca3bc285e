package rollout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// The gates between machines: a new machine that the guards call healthy
// (node, static pods, etcd member) has not yet shown that it does what its
// peers do, nor that the operator's own checks agree. Before the loop's next
// step, most often the deletion of an old machine, it passes three gates in
// turn:
//
//  1. its DaemonSets: every DaemonSet Ready on another control-plane node is
//     Ready on the new one (kube-proxy or a CNI that never comes up on new
//     nodes, cluster-api#10949, leaves a node the guards call healthy and no
//     Service reachable from it);
//  2. the operator's --gate command, --gate-count passes in a row;
//  3. the soak, --soak, for what only time shows.
//
// Each is a step of its own, so the run's step times show where the time
// between machines went. After them the loop reads live and the guards
// decide again: a machine that turned bad meanwhile stops the run there.

// Gates are the operator's gate's settings; the soak is Timeouts.Settle
// and the DaemonSets' bound Timeouts.Health. They ride with the Timeouts because the
// verbs hand the engine their waits as one value, and these are waits too.
type Gates struct {
	// Command is the operator's check, run with sh -c; "" runs none. It
	// comes from the command line alone (pkg/cli refuses it from the config
	// file and the environment): it runs as the operator.
	Command string
	// Count is how many passes in a row the command needs; 0 means 1.
	Count int
	// Timeout bounds a machine's gate, from its first attempt until its
	// Count-th pass in a row; 0 means DefaultGateTimeout.
	Timeout time.Duration
	// Interval is the pause between two attempts, after a pass as after a
	// failure; 0 means GateInterval. No flag: tests shorten it.
	Interval time.Duration
}

// DefaultGateTimeout is --gate-timeout's default, kOps's for its cluster
// validation (--validation-timeout): time for a check that fails while the
// new node settles to pass once it has, and a dozen retries besides.
const DefaultGateTimeout = 15 * time.Minute

// GateInterval is the pause between two attempts: kOps waits 10s between
// the validations it counts in a row, so that N passes mean the cluster held
// for that long and not only for one instant's read.
const GateInterval = 10 * time.Second

// GateAttemptLimit bounds one attempt (less when the gate's own bound ends
// sooner): a check that hangs is killed and counts as failing, and the gate
// still has time to try again.
const GateAttemptLimit = 5 * time.Minute

// daemonSetPoll bounds how long the DaemonSets' wait goes without reading
// their pods: no watch follows every pod of a node, so it reads again at
// this pace, and sooner when the watches report a change.
const daemonSetPoll = 2 * time.Second

// The variables a gate command finds in its environment, besides the tool's
// own: which cluster, which new machine and node, and the machine step
// ("2/3").
const (
	GateEnvCluster   = "CP_ROLLOUT_CLUSTER"
	GateEnvNamespace = "CP_ROLLOUT_NAMESPACE"
	GateEnvMachine   = "CP_ROLLOUT_MACHINE"
	GateEnvNode      = "CP_ROLLOUT_NODE"
	GateEnvStep      = "CP_ROLLOUT_STEP"
)

func (g Gates) count() int {
	if g.Count > 0 {
		return g.Count
	}
	return 1
}

// Limit is how long a machine's gate may take at most: --gate-timeout, or
// its default.
func (g Gates) Limit() time.Duration {
	if g.Timeout > 0 {
		return g.Timeout
	}
	return DefaultGateTimeout
}

func (g Gates) interval() time.Duration {
	if g.Interval > 0 {
		return g.Interval
	}
	return GateInterval
}

// passGates passes m, a new machine that has just joined and is healthy in
// s, through the gates between machines: its DaemonSets, the operator's
// gate, the soak.
func (e *loop) passGates(ctx context.Context, s *Snapshot, m *clusterv1.Machine) error {
	if err := e.awaitDaemonSets(ctx, s, m); err != nil {
		return err
	}
	if err := e.passGate(ctx, m); err != nil {
		return err
	}
	if err := e.soak(ctx); err != nil {
		return err
	}
	if e.gated == nil {
		e.gated = map[string]bool{}
	}
	e.gated[m.Name] = true
	return nil
}

// ungated is the newest machine of s that joined during the operation on
// record (created after it started), is healthy by the guards, and is not
// among gated: a run's gates are for the machines of its operation, and a
// re-run after the gates stopped one must not go past it unchecked (a
// creation time is whole seconds, hence the truncation). Only the
// newest: each earlier one had passed its gates before the deletion that
// followed it.
func ungated(s *Snapshot, gated map[string]bool) (*clusterv1.Machine, bool) {
	rec, err := record.Of(s.CP.KCP)
	if err != nil || rec == nil {
		return nil, false
	}
	var newest *clusterv1.Machine
	for _, m := range s.CP.Machines {
		if !m.CreationTimestamp.Time.Before(rec.Started.Truncate(time.Second)) && (newest == nil || m.CreationTimestamp.After(newest.CreationTimestamp.Time)) {
			newest = m
		}
	}
	if newest == nil || gated[newest.Name] {
		return nil, false
	}
	return joinedHealthy(s, newest)
}

// joinedHealthy is the machine an AwaitJoin on m ended on in s, when it
// ended because m is healthy (Problem, the guards' own test) rather than
// gone, deleting or refused: only such a machine goes through the gates.
func joinedHealthy(s *Snapshot, m *clusterv1.Machine) (*clusterv1.Machine, bool) {
	if s == nil || m == nil {
		return nil, false
	}
	live, ok := s.CP.Machines[m.Name]
	if !ok || !live.DeletionTimestamp.IsZero() || Problem(s, live) != nil {
		return nil, false
	}
	return live, true
}

// peerNodes are the nodes of s's control-plane machines other than m that
// are not deleting: what m's node is compared with.
func peerNodes(s *Snapshot, m *clusterv1.Machine) []string {
	var peers []string
	for _, p := range s.CP.Machines.SortedByCreationTimestamp() {
		if p.Name != m.Name && p.DeletionTimestamp.IsZero() && nodeName(p) != "" {
			peers = append(peers, nodeName(p))
		}
	}
	return peers
}

// awaitDaemonSets waits until every DaemonSet Ready on one of m's peers is
// Ready on m's node, for at most the health timeout: the node's DaemonSets
// are part of it being healthy, and they come up in seconds where they come
// up at all. A read that fails is tried again within the same bound.
func (e *loop) awaitDaemonSets(ctx context.Context, s *Snapshot, m *clusterv1.Machine) (err error) {
	node, peers := nodeName(m), peerNodes(s, m)
	if len(peers) == 0 {
		return nil // nothing runs elsewhere to compare with
	}
	st := e.begin(AwaitDaemonSets, m.Name, fmt.Sprintf("waiting for the DaemonSets on node %s to be Ready, as they are on %s", node, strings.Join(peers, ", ")))
	defer st.end(&err)
	var w wait
	for {
		unready, readErr := e.Workload.DaemonSetsUnready(ctx, node, peers)
		if readErr == nil && len(unready) == 0 {
			st.done("every DaemonSet Ready on node " + node)
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		reason := unreadyReason(unready, readErr)
		if w.observe(waitDaemonSets, reason) {
			st.waiting(reason)
		}
		if err := w.expired(e.Timeouts, Step{Machine: m, Reason: reason}, readErr); err != nil {
			return err
		}
		e.waitForChange(ctx, daemonSetPoll)
	}
}

// unreadyReason says what a DaemonSet wait still waits for.
func unreadyReason(unready []workload.UnreadyDaemonSet, err error) string {
	if err != nil {
		return err.Error()
	}
	parts := make([]string, len(unready))
	for i, u := range unready {
		parts[i] = u.String()
	}
	return strings.Join(parts, "; ")
}

// passGate runs the operator's --gate for m until it passes Count times in
// a row, one step per pass, so that the step times show each; a failure
// sets the count back to zero, as kOps's --validate-count does. The gate's
// bound runs from its first attempt; when it is spent, the run stops (exit
// 4) naming the command, the machine and the command's last line.
func (e *loop) passGate(ctx context.Context, m *clusterv1.Machine) error {
	g := e.Timeouts.Gates
	if g.Command == "" {
		return nil
	}
	run := &gateRun{gates: g, machine: m, env: e.gateEnv(m), began: time.Now()}
	for run.inRow < g.count() {
		if err := e.gatePass(ctx, run); err != nil {
			return err
		}
	}
	return nil
}

// gateRun is one machine's way through the operator's gate.
type gateRun struct {
	gates   Gates
	machine *clusterv1.Machine
	env     []string
	began   time.Time
	// inRow counts the passes in a row so far; attempts all attempts.
	inRow, attempts int
	// last is how the latest attempt ended, for the expiry's message.
	last gateResult
}

// gatePass is the step of one pass: attempts, Interval apart, until one
// passes.
func (e *loop) gatePass(ctx context.Context, run *gateRun) (err error) {
	g, m := run.gates, run.machine
	st := e.begin(Gate, m.Name, fmt.Sprintf("gate pass %d of %d for machine %s: %s", run.inRow+1, g.count(), m.Name, g.Command))
	defer st.end(&err)
	for {
		if run.attempts > 0 {
			if err := sleep(ctx, min(g.interval(), max(run.left(), 0))); err != nil {
				return err
			}
		}
		if run.left() <= 0 {
			return run.expired()
		}
		if e.lock != nil {
			if err := e.lock.Held(); err != nil {
				return err
			}
		}
		run.attempts++
		limit := min(GateAttemptLimit, run.left())
		res := runGate(ctx, g.Command, run.env, limit, e.gateOutput())
		if err := ctx.Err(); err != nil {
			return err
		}
		// An attempt the gate's own bound cut short says less of why the
		// gate fails than the attempt before it.
		if !res.killed || limit == GateAttemptLimit || run.last.err == nil {
			run.last = res
		}
		if res.err == nil {
			run.inRow++
			st.done(fmt.Sprintf("passed %d of %d in a row", run.inRow, g.count()))
			return nil
		}
		run.inRow = 0
		st.waiting(fmt.Sprintf("gate failed (%s); 0 of %d passes in a row, trying again in %s", res, g.count(), g.interval()))
	}
}

// left is what remains of the gate's bound.
func (run *gateRun) left() time.Duration {
	return run.gates.Limit() - time.Since(run.began)
}

// expired is the error that stops the run when the gate's bound is spent.
func (run *gateRun) expired() error {
	g := run.gates
	passes := "pass"
	if g.count() > 1 {
		passes = fmt.Sprintf("pass %d times in a row", g.count())
	}
	msg := fmt.Sprintf("gate `%s` did not %s for machine %s within --gate-timeout %s (%d attempts", g.Command, passes, run.machine.Name, g.Limit(), run.attempts)
	if g.count() > 1 {
		msg += fmt.Sprintf(", %d in a row when it ran out", run.inRow)
	}
	msg += ")"
	if run.attempts > 0 {
		msg += "; last attempt: " + run.last.String()
	}
	return exitcode.Timeoutf("%s; %s", msg, gatedAgain)
}

// gatedAgain tells a run stopped at a gate what its re-run does: it passes
// the machine through the gates again before it deletes anything
// (gateFirst), so the gates must be able to pass.
const gatedAgain = "a re-run passes this machine through the gates again before it deletes anything: fix what they found first"

// gateEnv is the gate's environment: the tool's own, and what the gate is
// about.
func (e *loop) gateEnv(m *clusterv1.Machine) []string {
	key := e.Reader.Key()
	return append(os.Environ(),
		GateEnvCluster+"="+key.Name,
		GateEnvNamespace+"="+key.Namespace,
		GateEnvMachine+"="+m.Name,
		GateEnvNode+"="+nodeName(m),
		GateEnvStep+"="+fmt.Sprintf("%d/%d", e.steps.machine, max(e.steps.total, e.steps.machine)),
	)
}

// gateOutput is where the gate's output goes: the tool's standard error,
// since standard output may carry -o json's events.
func (e *Engine) gateOutput() io.Writer {
	if e.GateOutput != nil {
		return e.GateOutput
	}
	return os.Stderr
}

// gateResult is how one attempt ended.
type gateResult struct {
	// err is nil when the command exited 0.
	err error
	// lastLine is the command's last line of output, for the error.
	lastLine string
	// killed is set when the attempt's limit ended it.
	killed bool
}

func (r gateResult) String() string {
	how := "passed"
	if r.err != nil {
		how = r.err.Error()
	}
	if r.lastLine == "" {
		return how + ", no output"
	}
	return how + ": " + r.lastLine
}

// runGate runs command once with sh -c, in env, its output to out, for at
// most limit; the command and whatever it started are killed at the limit
// (killGroup) and the attempt counts as failed.
func runGate(ctx context.Context, command string, env []string, limit time.Duration, out io.Writer) gateResult {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	last := &lastLine{w: out}
	cmd.Env, cmd.Stdout, cmd.Stderr = env, last, last
	startsGroup(cmd)
	// The pipes close this long after the kill even if something the command
	// started holds them open, so an attempt never outlives its limit by
	// more.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	killed := errors.Is(ctx.Err(), context.DeadlineExceeded)
	if killed {
		err = fmt.Errorf("did not finish within %s", limit.Round(time.Millisecond))
	}
	return gateResult{err: err, lastLine: last.String(), killed: killed}
}

// lastLine passes output on and keeps its last non-empty line.
type lastLine struct {
	mu      sync.Mutex
	w       io.Writer
	partial []byte
	last    string
}

func (l *lastLine) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.keep(l.partial[:i])
		l.partial = l.partial[i+1:]
	}
	// A line that never ends must not grow without bound.
	if len(l.partial) > 4096 {
		l.keep(l.partial)
		l.partial = l.partial[:0]
	}
	// Output that cannot be shown is no reason to fail the operator's check.
	_, _ = l.w.Write(p)
	return len(p), nil
}

func (l *lastLine) keep(line []byte) {
	if s := strings.TrimSpace(string(line)); s != "" {
		l.last = s
	}
}

func (l *lastLine) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := strings.TrimSpace(string(l.partial)); s != "" {
		return s
	}
	return l.last
}

// soak waits Timeouts.Settle (--soak) after a machine passed its gates,
// before the next step.
func (e *Engine) soak(ctx context.Context) (err error) {
	d := e.Timeouts.Settle
	if d <= 0 {
		return nil
	}
	st := e.begin(Soak, "", "soaking "+d.String()+" before the next step")
	defer st.end(&err)
	if err := sleep(ctx, d); err != nil {
		return err
	}
	st.done("soaked " + d.String())
	return nil
}
