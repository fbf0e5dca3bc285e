package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// Bad input is refused before any cluster is read: exit 2, one line, and
// nothing printed.
func TestWaitBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"wait", "demo"}, "--for is required: --for done waits until"},
		{[]string{"wait", "demo", "--for", "bogus"}, `--for must be one of done, not "bogus"`},
		{[]string{"wait", "demo", "--for", "condition=Ready"}, `--for must be one of done`},
		{[]string{"wait", "demo", "--for", "done", "--timeout", "-1s"}, "--timeout must not be negative, not -1s (0 waits without limit)"},
		{[]string{"wait", "demo", "--for", "done", "--timeout", "soon"}, "--timeout soon: not a duration"},
		{[]string{"wait", "demo", "--for", "done", "-o", "wide"}, `--output must be one of text, json, yaml, jsonpath=, go-template=, not "wide"`},
		{[]string{"wait", "--for", "done"}, "wait needs one argument, the Cluster's name; got 0"},
		{[]string{"wait", "a", "b", "--for", "done"}, "wait needs one argument, the Cluster's name; got 2"},
		{[]string{"wait", "", "--for", "done"}, "wait needs a CLUSTER name"},
		{[]string{"wait", "-A", "--for", "done"}, "unknown shorthand flag: 'A' in -A"},
		{[]string{"wait", "demo", "--for", "done", "--handback-timeout", "1m"}, "unknown flag: --handback-timeout"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			isolate(t)
			r := run(t, tc.args...)
			refused(t, r, exitcode.Usage, tc.says)
			if r.out != "" || r.log != "" {
				t.Errorf("refusal printed: stdout %q, stderr %q", r.out, r.log)
			}
		})
	}
}

func TestWaitOptions(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		timeout time.Duration
		output  string
	}{
		{[]string{"demo", "--for", "done"}, 0, "text"},
		{[]string{"demo", "--for=done", "--timeout", "10m", "-o", "json"}, 10 * time.Minute, "json"},
		{[]string{"demo", "--for", "done", "--timeout", "0"}, 0, "text"},
	} {
		isolate(t)
		o, r := parse(t, NewCmdWait, append([]string{"wait"}, tc.args...)...)
		if o == nil {
			t.Fatalf("%v: did not reach Run: %v", tc.args, r.err)
		}
		if o.conn.Cluster != "demo" || o.For != "done" || o.Timeout != tc.timeout || o.output.Output != tc.output || o.conn.Management != r.opts.ConfigFlags || o.interval != 2*time.Second {
			t.Errorf("%v: cluster %q, for %q, timeout %s, output %q, interval %s", tc.args, o.conn.Cluster, o.For, o.Timeout, o.output.Output, o.interval)
		}
	}
}

// settledWorld is a control plane of three machines at version that KCP
// has reconciled and agrees is done.
func settledWorld(version string) *kcpstate.ControlPlane {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo"}}
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo-cp", Generation: 2}}
	kcp.Spec.Version, kcp.Spec.Replicas = version, ptr.To(int32(3))
	kcp.Status.ObservedGeneration = 2
	kcp.Status.Versions = []clusterv1.StatusVersion{{Version: version, Replicas: 3}}
	conditions.Set(kcp, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionFalse, Reason: clusterv1.NotPausedReason})
	cp := &kcpstate.ControlPlane{Cluster: cluster, KCP: kcp, Machines: collections.New()}
	for i, name := range []string{"demo-cp-a", "demo-cp-b", "demo-cp-c"} {
		cp.Machines.Insert(machineAt(name, version, i))
	}
	return cp
}

func machineAt(name, version string, age int) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
		CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, age, 0, 0, time.UTC))}}
	m.Spec.Version = version
	conditions.Set(m, metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineUpToDateReason})
	conditions.Set(m, metav1.Condition{Type: clusterv1.MachineReadyCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineReadyReason})
	return m
}

// withRecord puts this tool's operation record (and its pause) on cp.
func withRecord(cp *kcpstate.ControlPlane, rec record.Record) *kcpstate.ControlPlane {
	raw, _ := json.Marshal(rec)
	cp.KCP.Annotations = map[string]string{clusterv1.PausedAnnotation: "true", record.Annotation: string(raw)}
	return cp
}

var started = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// failedUpgrade is the record a failed upgrade leaves, its pause standing.
var failedUpgrade = record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "alice@ops-1/pid-42-abcde", Started: started,
	LastFailure: &record.Failure{Reason: "machine demo-cp-x did not get a node within --provision-timeout 15m0s.", Time: started.Add(20 * time.Minute), ExitCode: 4}}

// judgeDone, table by table: what it waits for, and what it refuses.
func TestWaitJudgesDone(t *testing.T) {
	const from, to = "v1.35.2", "v1.36.3"
	for _, tc := range []struct {
		name   string
		cp     func() *kcpstate.ControlPlane
		holder string
		wait   []string // each said, in this order, in what is left
		code   int      // a refusal's exit code; 0: none
		says   []string // the refusal says each
	}{
		{name: "settled", cp: func() *kcpstate.ControlPlane { return settledWorld(to) }},
		{name: "a run holds the lock", holder: "bob@ci/pid-7-xyz",
			cp:   func() *kcpstate.ControlPlane { return withRecord(settledWorld(from), failedUpgrade) },
			wait: []string{"a run of this tool holds the lock (Lease cp-rollout-demo): upgrade by bob@ci/pid-7-xyz"}},
		{name: "a run holds the lock before it pauses", holder: "bob@ci/pid-7-xyz",
			cp:   func() *kcpstate.ControlPlane { return settledWorld(from) },
			wait: []string{"a run of this tool holds the lock (Lease cp-rollout-demo): bob@ci/pid-7-xyz"}},
		{name: "failed run's pause", code: exitcode.Unsafe,
			cp: func() *kcpstate.ControlPlane { return withRecord(settledWorld(from), failedUpgrade) },
			says: []string{"KubeadmControlPlane demo-cp is paused under an unfinished operation of this tool, upgrade to v1.36.3 by alice@ops-1/pid-42-abcde, started 2026-03-04T05:06:07Z",
				"no run holds the lock: its last run failed 2026-03-04T05:26:07Z (exit 4): machine demo-cp-x did not get a node within --provision-timeout 15m0s;",
				"re-run the `kubectl cp-rollout upgrade` that started it to resume, or `kubectl cp-rollout handback demo -n default` to let KCP finish"}},
		{name: "interrupted run's pause", code: exitcode.Unsafe,
			cp: func() *kcpstate.ControlPlane {
				rec := failedUpgrade
				rec.LastFailure = nil
				return withRecord(settledWorld(from), rec)
			},
			says: []string{"its run was interrupted (no failure recorded)", "`kubectl cp-rollout handback demo -n default`"}},
		{name: "pause", code: exitcode.Unsafe,
			cp: func() *kcpstate.ControlPlane {
				return withRecord(settledWorld(from), record.Record{Operation: record.PauseOperation, Who: "carol@laptop/pid-9-q", Started: started, Reason: "CHG-1234"})
			},
			says: []string{"KubeadmControlPlane demo-cp is paused by cp-rollout pause (carol@laptop/pid-9-q, since 2026-03-04T05:06:07Z, reason: CHG-1234)",
				"`kubectl cp-rollout rollout demo -n default` rolls the change out, or `kubectl cp-rollout handback demo -n default` lets KCP roll it"}},
		{name: "unreadable record", code: exitcode.Unsafe,
			cp: func() *kcpstate.ControlPlane {
				cp := settledWorld(to)
				cp.KCP.Annotations = map[string]string{record.Annotation: "{"}
				return cp
			},
			says: []string{"unreadable " + record.Annotation}},
		{name: "paused by someone else",
			cp: func() *kcpstate.ControlPlane {
				cp := settledWorld(to)
				cp.KCP.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
				return cp
			},
			wait: []string{"KubeadmControlPlane demo-cp is paused by someone else (annotation cluster.x-k8s.io/paused without this tool's record)"}},
		{name: "cluster paused",
			cp: func() *kcpstate.ControlPlane {
				cp := settledWorld(to)
				cp.Cluster.Spec.Paused = ptr.To(true)
				return cp
			},
			wait: []string{"Cluster demo is paused (spec.paused"}},
		{name: "KCP has not seen the new version",
			cp: func() *kcpstate.ControlPlane {
				cp := settledWorld(from)
				cp.KCP.Spec.Version, cp.KCP.Generation = to, 3
				return cp
			},
			wait: []string{"KCP has not observed generation 3 of its spec (observed 2)", "KCP reports machines at [3 at v1.35.2], want all at v1.36.3"}},
		{name: "KCP rolling: a surge machine joining, an old one deleting",
			cp: func() *kcpstate.ControlPlane {
				cp := settledWorld(to)
				old := cp.Machines["demo-cp-a"]
				old.Spec.Version, old.DeletionTimestamp = from, ptr.To(metav1.Now())
				conditions.Set(old, metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionFalse, Reason: clusterv1.MachineNotUpToDateReason})
				joining := machineAt("demo-cp-d", to, 9)
				conditions.Set(joining, metav1.Condition{Type: clusterv1.MachineReadyCondition, Status: metav1.ConditionFalse, Reason: "NotReady",
					Message: "* NodeHealthy: Waiting for a Node with spec.providerID sim://d\n* EtcdMemberHealthy: not yet"})
				cp.Machines.Insert(joining)
				cp.KCP.Status.Versions = []clusterv1.StatusVersion{{Version: from, Replicas: 1}, {Version: to, Replicas: 3}}
				return cp
			},
			wait: []string{"machine demo-cp-a is being deleted", "KCP reports machines at [1 at v1.35.2, 3 at v1.36.3]",
				"machine demo-cp-d is not Ready: Ready=False (NotReady): * NodeHealthy: Waiting for a Node with spec.providerID sim://d * EtcdMemberHealthy: not yet"}},
		{name: "the last old machine deleting, every other up to date",
			// KCP's status counts the deleting machine too; with a rollout
			// that keeps the version (rolloutAfter) only the deletion is left.
			cp: func() *kcpstate.ControlPlane {
				cp := settledWorld(to)
				cp.Machines["demo-cp-a"].DeletionTimestamp = ptr.To(metav1.Now())
				cp.Machines.Insert(machineAt("demo-cp-d", to, 9))
				cp.KCP.Status.Versions = []clusterv1.StatusVersion{{Version: to, Replicas: 4}}
				return cp
			},
			wait: []string{"machine demo-cp-a is being deleted"}},
		{name: "a machine not ready",
			cp: func() *kcpstate.ControlPlane {
				cp := settledWorld(to)
				conditions.Delete(cp.Machines["demo-cp-b"], clusterv1.MachineReadyCondition)
				return cp
			},
			wait: []string{"machine demo-cp-b is not Ready: no Ready condition yet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			left, err := judgeDone(tc.cp(), tc.holder)
			if tc.code != 0 {
				if exitcode.Of(err) != tc.code {
					t.Fatalf("refusal %v (exit %d), want exit %d; left %q", err, exitcode.Of(err), tc.code, left)
				}
				for _, s := range tc.says {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("refusal %q lacks %q", err, s)
					}
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("refusal is not one line: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if len(tc.wait) == 0 && len(left) > 0 {
				t.Errorf("left %q; want done", left)
			}
			at := 0
			for _, w := range tc.wait {
				for at < len(left) && !strings.Contains(left[at], w) {
					at++
				}
				if at == len(left) {
					t.Errorf("left %q: lacks %q, or not in order", left, w)
					break
				}
			}
		})
	}
}

// scripted is a waitSource that answers each look with the next of its
// looks, the last one again and again.
type scripted struct {
	mu    sync.Mutex
	looks []look
	at    int // how many looks were taken
	lease *coordinationv1.Lease
}

type look struct {
	cp    *kcpstate.ControlPlane
	lease *coordinationv1.Lease
	err   error
}

// Read begins a look: the control plane, or the look's error.
func (s *scripted) Read(context.Context) (*kcpstate.ControlPlane, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.looks[min(s.at, len(s.looks)-1)]
	s.at++
	s.lease = l.lease
	return l.cp, l.err
}

// Lease ends the look Read began.
func (s *scripted) Lease(context.Context) (*coordinationv1.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease, nil
}

// lease is the cluster's Lease as a run holds it, at resourceVersion.
func lease(holder, resourceVersion string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cp-rollout-demo", ResourceVersion: resourceVersion},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To(int32(15))}}
}

// waitFor is a wait for demo with output, reading every millisecond, on a
// clock that moves a second at each reading.
func waitFor(output string) (*WaitOptions, *bytes.Buffer, *bytes.Buffer) {
	var out, errOut bytes.Buffer
	o := NewWaitOptions(genericiooptions.IOStreams{Out: &out, ErrOut: &errOut})
	o.conn.Cluster, o.conn.Namespace, o.For, o.output.Output, o.interval = "demo", "default", waitForDone, output, time.Millisecond
	if err := o.output.complete(); err != nil { // as Validate does
		panic(err)
	}
	clock := started
	o.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	return o, &out, &errOut
}

// A colleague's run, then KCP's own rolling, then done: a line on stderr
// each time what is awaited changes (never twice the same), and with -o
// json one object on stdout, at the end.
func TestWaitFollowsUntilDone(t *testing.T) {
	const from, to = "v1.35.2", "v1.36.3"
	running := withRecord(settledWorld(from), record.Record{Operation: "upgrade", Target: to, Who: "bob", Started: started})
	rolling := settledWorld(to)
	rolling.Machines["demo-cp-a"].DeletionTimestamp = ptr.To(metav1.Now())
	rolling.Machines["demo-cp-a"].Spec.Version = from
	rolling.KCP.Status.Versions = []clusterv1.StatusVersion{{Version: from, Replicas: 1}, {Version: to, Replicas: 2}}
	src := &scripted{looks: []look{
		{cp: running, lease: lease("bob", "1")},
		{cp: running, lease: lease("bob", "2")},
		{cp: rolling},
		{cp: rolling, err: errors.New("connection refused")},
		{cp: rolling},
		{cp: settledWorld(to)},
	}}
	o, out, errOut := waitFor("json")
	if err := o.wait(context.Background(), context.Background(), src, started); err != nil {
		t.Fatalf("wait: %v\n%s", err, errOut)
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	want := []string{
		"default/demo waiting: a run of this tool holds the lock (Lease cp-rollout-demo): upgrade by bob",
		"default/demo waiting: machine demo-cp-a is being deleted (and 2 more)",
		"default/demo waiting: the control plane cannot be read: connection refused",
		"default/demo waiting: machine demo-cp-a is being deleted (and 2 more)",
		"default/demo done: no run of this tool holds it, and KCP reports every machine at v1.36.3, up to date and ready (waited ",
	}
	if len(lines) != len(want) {
		t.Fatalf("stderr:\n%s\nwant %d lines", errOut, len(want))
	}
	for i, w := range want {
		if _, line, _ := strings.Cut(lines[i], " "); !strings.HasPrefix(line, w) {
			t.Errorf("line %d: %q, want it to start with %q", i+1, lines[i], w)
		}
	}
	var done map[string]any
	if err := json.Unmarshal(out.Bytes(), &done); err != nil || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("stdout %q: want one JSON object on a line (%v)", out, err)
	}
	if done["cluster"] != "demo" || done["namespace"] != "default" || done["done"] != true || done["version"] != to || done["waited"] == "" {
		t.Errorf("stdout %v", done)
	}
	if _, err := time.ParseDuration(fmt.Sprint(done["waited"])); err != nil {
		t.Errorf("waited %v: %v", done["waited"], err)
	}
}

// Without -o json, done prints nothing on stdout.
func TestWaitTextPrintsNothingOnStdout(t *testing.T) {
	o, out, errOut := waitFor("text")
	if err := o.wait(context.Background(), context.Background(), &scripted{looks: []look{{cp: settledWorld("v1.36.3")}}}, started); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 || !strings.Contains(errOut.String(), " done: ") {
		t.Errorf("stdout %q, stderr %q", out, errOut)
	}
}

// A failed run's pause ends the wait at once, exit 3, with the failure
// and the ways on; a run that died without its Lease going holds the wait
// only until this process has seen the Lease go its duration unchanged.
func TestWaitRefusesAFailedRunsPause(t *testing.T) {
	held := withRecord(settledWorld("v1.35.2"), failedUpgrade)
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		looks int // at least
	}{
		{name: "lease released", looks: 2},
		// The clock moves a second a reading, and the wait reads it once a
		// look and once a line: the Lease's 15 s pass in well over 8 looks.
		{name: "lease left by a dead run", lease: lease("alice@ops-1/pid-42-abcde", "7"), looks: 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &scripted{looks: []look{{cp: held, lease: tc.lease}}}
			o, out, errOut := waitFor("json")
			err := o.wait(context.Background(), context.Background(), src, started)
			if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "its last run failed") || !strings.Contains(err.Error(), "handback demo -n default") {
				t.Fatalf("wait: %v (exit %d), want exit 3 naming the failure and handback", err, exitcode.Of(err))
			}
			if src.at < tc.looks {
				t.Errorf("refused after %d looks, want at least %d", src.at, tc.looks)
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q: a refusal's JSON is main's", out)
			}
			if tc.lease != nil && !strings.Contains(errOut.String(), "holds the lock") {
				t.Errorf("stderr %q: want the live-looking Lease waited on first", errOut)
			}
		})
	}
}

// A record seen once, then gone at the second look (a run handed back and
// released its Lease in between), is no refusal.
func TestWaitLooksTwiceBeforeRefusing(t *testing.T) {
	src := &scripted{looks: []look{{cp: withRecord(settledWorld("v1.36.3"), failedUpgrade)}, {cp: settledWorld("v1.36.3")}}}
	o, _, errOut := waitFor("text")
	if err := o.wait(context.Background(), context.Background(), src, started); err != nil {
		t.Fatalf("wait: %v\n%s", err, errOut)
	}
}

// --timeout: exit 4, naming what the wait last waited for and what KCP
// says of itself.
func TestWaitTimesOut(t *testing.T) {
	stuck := settledWorld("v1.36.3")
	stuck.KCP.Generation = 3
	conditions.Delete(stuck.Machines["demo-cp-c"], clusterv1.MachineReadyCondition)
	conditions.Set(stuck.KCP, metav1.Condition{Type: controlplanev1.KubeadmControlPlaneEtcdClusterHealthyCondition, Status: metav1.ConditionFalse,
		Reason: "NotHealthy", Message: "member demo-cp-b is unreachable"})
	o, out, _ := waitFor("json")
	o.Timeout = 50 * time.Millisecond
	runCtx, cancel := context.WithTimeout(context.Background(), o.Timeout)
	defer cancel()
	err := o.wait(context.Background(), runCtx, &scripted{looks: []look{{cp: stuck}}}, started)
	refusedWith(t, err, exitcode.Timeout, "default/demo was not done within --timeout 50ms: KCP has not observed generation 3 of its spec (observed 2); machine demo-cp-c is not Ready: no Ready condition yet",
		"KCP says: EtcdClusterHealthy=False (NotHealthy): member demo-cp-b is unreachable", "`kubectl cp-rollout status demo -n default`")
	if out.Len() != 0 {
		t.Errorf("stdout %q", out)
	}
}

// Ctrl-C stops the wait as the other verbs: main exits with the signal's
// code, and the error says what the wait was waiting for.
func TestWaitStopsOnSignal(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	stuck := settledWorld("v1.36.3")
	stuck.Machines["demo-cp-a"].DeletionTimestamp = ptr.To(metav1.Now())
	o, _, _ := waitFor("text")
	go func() { time.Sleep(20 * time.Millisecond); cancel(exitcode.Stopped(os.Interrupt)) }()
	err := o.wait(ctx, ctx, &scripted{looks: []look{{cp: stuck}}}, started)
	if !errors.Is(err, context.Canceled) || exitcode.Of(context.Cause(ctx)) != exitcode.Interrupted ||
		!strings.Contains(err.Error(), "it was waiting: machine demo-cp-a is being deleted") {
		t.Fatalf("wait: %v; want the stop, naming what it waited for", err)
	}
}

// refusedWith checks that err has code and says each of says on one line.
func refusedWith(t *testing.T, err error, code int, says ...string) {
	t.Helper()
	if exitcode.Of(err) != code {
		t.Fatalf("error %v: exit %d, want %d", err, exitcode.Of(err), code)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
}
