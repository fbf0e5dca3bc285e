package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// upgradePlan is what Prepare and PlanHops make of an upgrade of one
// machine of cluster eu1: create its replacement, delete it.
func upgradePlan() (*rollout.Prepared, [][]rollout.Step) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "capi-prod", Name: "eu1"}}
	old := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "capi-prod", Name: "eu1-cp-x2k9"}}
	prepared := &rollout.Prepared{Snapshot: &rollout.Snapshot{CP: &kcpstate.ControlPlane{Cluster: cluster}}, Hops: []string{"v1.36.3"}}
	return prepared, [][]rollout.Step{{
		{Action: rollout.Create, Reason: "replacement for eu1-cp-x2k9 at v1.36.3"},
		{Action: rollout.Delete, Machine: old, Reason: "eu1-cp-x2k9 is at v1.35.2"},
	}}
}

// planAgainst runs plan's command line as far as its options, then what plan
// does once connected, against a management cluster where the identity may
// do what allowed says and the KCP controller runs controllerVersion: the
// run's checks (runChecks), then the plan printed and its outcome.
func planAgainst(t *testing.T, allowed func(*authorizationv1.ResourceAttributes) bool, controllerVersion string, args ...string) (result, error) {
	t.Helper()
	isolate(t)
	o, r := parse(t, NewCmdPlan, append([]string{"plan", "eu1", "--version", "v1.36.3"}, args...)...)
	if o == nil {
		t.Fatalf("plan %v did not reach Run: %v", args, r.err)
	}
	var out, errOut strings.Builder
	o.req.Streams.Out, o.req.Streams.ErrOut = &out, &errOut
	o.req.conn.Namespace = "capi-prod" // as connect resolves it
	ctx := context.Background()
	cp := controlplane.New(authorizerFor(allowed, kcpControllerAt(controllerVersion)), o.req.conn.Namespace, o.req.conn.Cluster)
	refusal := o.req.conn.runChecks(ctx, cp, &controlplanev1.KubeadmControlPlane{})
	prepared, hops := upgradePlan()
	err := o.outcome(o.req.showPlan(prepared, hops, nil, nil, refusal))
	return result{code: exitcode.Of(err), err: err, out: out.String(), log: errOut.String()}, err
}

// TestPlanSaysWhatTheRunWouldRefuse: plan makes the checks the run makes
// before its first write. When one would refuse the run, the plan is still
// printed, and plan fails as the run would — "the run would refuse:", the
// run's reason, the run's exit code — with --exit-code (not 10) and without
// it (not 0); -o json stays one plan object on stdout, which main ends with
// the error's. When none would, --exit-code says 10 for pending steps.
func TestPlanSaysWhatTheRunWouldRefuse(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		allowed    func(*authorizationv1.ResourceAttributes) bool
		controller string
		code       int
		says       []string
	}{
		{name: "unproven --kcp-version", args: []string{"--exit-code", "--kcp-version", "v1.12.4"}, allowed: anything, controller: "v1.14.2",
			code: exitcode.Unsafe, says: []string{"the run would refuse: KCP controller is v1.12.4; this tool is proven with KCP " + rollout.ProvenKCPRange()}},
		{name: "unproven --kcp-version without --exit-code", args: []string{"--kcp-version", "v1.12.4"}, allowed: anything, controller: "v1.14.2",
			code: exitcode.Unsafe, says: []string{"the run would refuse: KCP controller is v1.12.4"}},
		{name: "unproven controller", args: []string{"--exit-code"}, allowed: anything, controller: "v1.15.0",
			code: exitcode.Unsafe, says: []string{"the run would refuse: KCP controller is v1.15.0"}},
		{name: "identity without the operate permissions", args: []string{"--exit-code"}, allowed: readOnlyAccess, controller: "v1.14.2",
			code: exitcode.Forbidden, says: []string{
				"the run would refuse: oncall lacks",
				"cannot patch kubeadmcontrolplanes.controlplane.cluster.x-k8s.io in namespace capi-prod",
				"cannot create machines.cluster.x-k8s.io in namespace capi-prod",
			}},
		{name: "identity without the operate permissions, -o json", args: []string{"--exit-code", "-o", "json"}, allowed: readOnlyAccess, controller: "v1.14.2",
			code: exitcode.Forbidden, says: []string{"the run would refuse: oncall lacks"}},
		{name: "nothing the run would refuse", args: []string{"--exit-code"}, allowed: anything, controller: "v1.14.2",
			code: PendingExitCode},
		{name: "nothing the run would refuse, without --exit-code", allowed: anything, controller: "v1.14.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := planAgainst(t, tc.allowed, tc.controller, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d (%v), want %d", r.code, err, tc.code)
			}
			for _, s := range tc.says {
				if !strings.HasPrefix(err.Error(), "the run would refuse: ") || !strings.Contains(err.Error(), s) {
					t.Errorf("error %q: want it to start with \"the run would refuse: \" and say %q", err, s)
				}
			}
			if tc.code != PendingExitCode && tc.code != exitcode.OK && !strings.Contains(err.Error(), "would refuse") {
				t.Errorf("error %q does not say the run would refuse", err)
			}
			// The plan is printed whatever the run would meet.
			if strings.Contains(strings.Join(tc.args, " "), "-o json") {
				dec := json.NewDecoder(strings.NewReader(r.out))
				var plan struct {
					Cluster string
					Steps   []struct{ Action, Machine string }
				}
				if err := dec.Decode(&plan); err != nil || plan.Cluster != "eu1" || len(plan.Steps) != 2 {
					t.Errorf("stdout is not the plan's JSON object (%v): %q", err, r.out)
				}
				if _, err := dec.Token(); err != io.EOF {
					t.Errorf("stdout has more than the plan's object (%v): %q", err, r.out)
				}
			} else if !strings.Contains(r.out, "create") || !strings.Contains(r.out, "eu1-cp-x2k9") {
				t.Errorf("the plan was not printed:\n%s", r.out)
			}
			if r.log != "" {
				t.Errorf("stderr before main's error line: %q", r.log)
			}
		})
	}
}

// TestPlanWithoutAPlanStillSaysWhatTheRunWouldRefuse: when the plan cannot
// be made either (Prepare refused), the run's checks still decide: the run
// would stop at them first. Why there is no plan is a warning; stdout stays
// empty. Without a refusal, the plan's own error is the outcome, as before;
// and an error that kept a check from being made is no refusal.
func TestPlanWithoutAPlanStillSaysWhatTheRunWouldRefuse(t *testing.T) {
	isolate(t)
	o, r := parse(t, NewCmdPlan, "plan", "eu1", "--version", "v1.36.3", "--exit-code")
	if o == nil {
		t.Fatalf("did not reach Run: %v", r.err)
	}
	var out, errOut strings.Builder
	o.req.Streams.Out, o.req.Streams.ErrOut = &out, &errOut
	deleting := exitcode.Unsafef("machine eu1-cp-x2k9 is deleting")
	refusal := exitcode.Unsafef("KCP controller is v1.12.4")

	err := o.outcome(o.req.showPlan(nil, nil, nil, deleting, refusal))
	if exitcode.Of(err) != exitcode.Unsafe || err.Error() != "the run would refuse: KCP controller is v1.12.4" {
		t.Errorf("no plan, a refusal: exit %d, %q", exitcode.Of(err), err)
	}
	if out.Len() != 0 || errOut.String() != "warning: no plan: machine eu1-cp-x2k9 is deleting\n" {
		t.Errorf("no plan, a refusal: stdout %q, stderr %q", out.String(), errOut.String())
	}

	errOut.Reset()
	if err := o.outcome(o.req.showPlan(nil, nil, nil, deleting, nil)); err != deleting || errOut.Len() != 0 {
		t.Errorf("no plan, no refusal: %v, stderr %q: want Prepare's error alone", err, errOut.String())
	}

	failed := errors.New("asking the API server whether this identity may get secrets: connection reset")
	prepared, hops := upgradePlan()
	if err := o.outcome(o.req.showPlan(prepared, hops, nil, nil, failed)); exitcode.Of(err) != exitcode.Failure || strings.Contains(err.Error(), "would refuse") {
		t.Errorf("a check that failed: exit %d, %q: want exit 1, not a refusal", exitcode.Of(err), err)
	}
}
