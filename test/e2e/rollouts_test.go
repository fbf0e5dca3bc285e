package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// The rollouts of what KCP rolls out besides a version: a spec change made
// under pause, a restart, certificates about to expire.

// setAPIServerArg changes the KCP's kubeadm configuration as a GitOps sync
// would: one apiServer extra argument (v1beta2: a list of {name, value}).
func setAPIServerArg(t *testing.T, e *env, name, value string) {
	t.Helper()
	ctx := context.Background()
	c := e.Sim.ManagementClient()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	before := kcp.DeepCopy()
	api := &kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.APIServer
	api.ExtraArgs = append(slices.DeleteFunc(api.ExtraArgs, func(a bootstrapv1.Arg) bool { return a.Name == name }),
		bootstrapv1.Arg{Name: name, Value: ptr.To(value)})
	if err := c.Patch(ctx, kcp, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
}

// lastRecord is the record the KCP keeps of the operation that last finished.
func lastRecord(t *testing.T, e *env) *record.Record {
	t.Helper()
	rec := record.LastOf(kcpOf(t, e))
	if rec == nil {
		t.Fatal("no record of the last operation on the KCP")
	}
	return rec
}

// replaced checks that the machines in gone are all gone and those in kept
// all still there.
func replaced(t *testing.T, e *env, gone, kept []string) {
	t.Helper()
	now := mustMachines(t, e)
	for _, m := range gone {
		if slices.Contains(now, m) {
			t.Errorf("machine %s was not replaced (machines: %v)", m, now)
		}
	}
	for _, m := range kept {
		if !slices.Contains(now, m) {
			t.Errorf("machine %s was replaced, and should not have been (machines: %v)", m, now)
		}
	}
}

// pause, then a change of the kubeadm configuration, then rollout: every
// machine is replaced one at a time and KCP, in charge again, agrees. The
// same change made without pause is KCP's own rollout, which rollout refuses.
func TestPauseThenRolloutOfASpecChange(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	old := mustMachines(t, e)

	r := e.Plugin(t, ctx, "pause", "demo", "--reason", "CHG-1: audit log age")
	if r.Code != 0 || !strings.Contains(r.Stdout, "paused by cp-rollout pause") || !strings.Contains(r.Stdout, "kubectl cp-rollout rollout demo") {
		t.Fatalf("pause: exit %d\n%s\n%s", r.Code, r.Stdout, simtest.Tail(r.Stderr, 5))
	}
	if r := e.Plugin(t, ctx, "pause", "demo"); r.Code != 0 || !strings.Contains(r.Stdout, "was already paused") || !strings.Contains(r.Stdout, "CHG-1: audit log age") {
		t.Fatalf("pause again: exit %d, want 0 saying it was already paused, with the first reason\n%s", r.Code, r.Stdout)
	}
	if r := e.Plugin(t, ctx, "status", "demo"); !strings.Contains(r.Stdout, "paused by cp-rollout pause (") || !strings.Contains(r.Stdout, "reason: CHG-1: audit log age") {
		t.Errorf("status does not name the pause:\n%s", r.Stdout)
	}
	if r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--dry-run"); r.Code != 0 {
		t.Errorf("a dry run on a paused-by-pause KCP: exit %d\n%s", r.Code, r.Stderr)
	}

	setAPIServerArg(t, e, "audit-log-maxage", "30")
	// KCP is paused: the change starts no rollout of its own.
	time.Sleep(3 * time.Second)
	if now := mustMachines(t, e); !slices.Equal(now, old) {
		t.Fatalf("machines changed under the pause: %v -> %v", old, now)
	}
	r = e.Plugin(t, ctx, "plan", "demo", "--rollout", "-o", "json")
	var plan struct{ Steps []struct{ Action string } }
	if err := json.Unmarshal([]byte(r.Stdout), &plan); r.Code != 0 || err != nil || len(plan.Steps) != 6 {
		t.Errorf("plan --rollout: exit %d, %v, want 6 steps:\n%s", r.Code, err, r.Stdout)
	}

	if r := e.Plugin(t, ctx, "rollout", "demo"); r.Code != 0 {
		t.Fatalf("rollout: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 10))
	}
	replaced(t, e, old, nil)
	if rec := lastRecord(t, e); rec.Operation != "rollout" {
		t.Errorf("last operation %s, want the rollout's", rec)
	}
	mon.check(t)
	assertConverged(t, e, 3, from)
	assertKCPIdle(t, e)

	// Without pause, KCP rolls the change out by itself: rollout refuses to
	// race it.
	setAPIServerArg(t, e, "audit-log-maxage", "60")
	r = e.Plugin(t, ctx, "rollout", "demo")
	if r.Code != 3 || !strings.Contains(r.Stderr, "KCP's own rollout") || !strings.Contains(r.Stderr, "kubectl cp-rollout pause demo") {
		t.Fatalf("rollout during KCP's own rollout: exit %d, want 3 naming it\n%s", r.Code, simtest.Tail(r.Stderr, 5))
	}
	if kcp := kcpOf(t, e); kcp.Annotations[clusterv1.PausedAnnotation] != "" {
		t.Errorf("the refused rollout paused the KCP: %v", kcp.Annotations)
	}
}

// restart replaces every machine once, one at a time, and KCP agrees.
func TestRestartReplacesEveryMachine(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	old := mustMachines(t, e)
	if r := e.Plugin(t, ctx, "restart", "demo"); r.Code != 0 {
		t.Fatalf("restart: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 10))
	}
	replaced(t, e, old, nil)
	if rec := lastRecord(t, e); rec.Operation != "restart" {
		t.Errorf("last operation %s, want the restart's", rec)
	}
	mon.check(t)
	assertConverged(t, e, 3, from)
	assertKCPIdle(t, e)
}

// rollout --certificates-expiring-within replaces exactly the machine whose
// certificates expire within that time, and writes no spec.rollout.before.
func TestRolloutOfExpiringCertificates(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	machines := mustMachines(t, e)
	expiring := machines[1]

	// A pause is undone by handback, and by a rollout with nothing to roll,
	// which hands back and says so.
	for _, undo := range []struct{ args, says []string }{
		{[]string{"handback", "demo"}, []string{"unpaused"}},
		{[]string{"rollout", "demo"}, []string{"nothing to do", "handing back the pause", "unpaused"}},
	} {
		if r := e.Plugin(t, ctx, "pause", "demo"); r.Code != 0 {
			t.Fatalf("pause: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 5))
		}
		r := e.Plugin(t, ctx, undo.args...)
		for _, says := range undo.says {
			if r.Code != 0 || !strings.Contains(r.Stdout+r.Stderr, says) {
				t.Fatalf("%v of a pause: exit %d, want 0 saying %q\n%s\n%s", undo.args, r.Code, says, r.Stdout, simtest.Tail(r.Stderr, 5))
			}
		}
		if kcp := kcpOf(t, e); kcp.Annotations[clusterv1.PausedAnnotation] != "" || kcp.Annotations[record.Annotation] != "" {
			t.Fatalf("%v left the KCP paused: %v", undo.args, kcp.Annotations)
		}
	}
	if now := mustMachines(t, e); !slices.Equal(now, machines) {
		t.Fatalf("machines changed with nothing to roll: %v -> %v", machines, now)
	}

	// KCP writes the expiry it reads from the node onto the KubeadmConfig,
	// and the Machine controller copies it into the Machine's status
	// (reconcileCertificateExpiry): set it where KCP would.
	c := e.Sim.ManagementClient()
	config := &bootstrapv1.KubeadmConfig{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: expiring}, config); err != nil {
		t.Fatal(err)
	}
	before := config.DeepCopy()
	if config.Annotations == nil {
		config.Annotations = map[string]string{}
	}
	// KCP may have set the expiry it read already: the Machine then shows
	// that one until the Machine controller copies this one.
	expiry := time.Now().Add(10 * 24 * time.Hour).UTC().Truncate(time.Second)
	config.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation] = expiry.Format(time.RFC3339)
	if err := c.Patch(ctx, config, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	simtest.Eventually(t, 2*time.Minute, "the Machine controller copying the expiry into the Machine", func(ctx context.Context) (bool, string, error) {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: expiring}, m); err != nil {
			return false, "", err
		}
		got := m.Status.CertificatesExpiryDate
		return got.Time.Equal(expiry), "status.certificatesExpiryDate is " + got.String(), nil
	})

	r := e.Plugin(t, ctx, "rollout", "demo", "--certificates-expiring-within", "30d")
	if r.Code != 0 {
		t.Fatalf("rollout --certificates-expiring-within 30d: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 10))
	}
	replaced(t, e, []string{expiring}, []string{machines[0], machines[2]})
	if rec := lastRecord(t, e); rec.Target != "spec,certificates-expiring-within=30d" {
		t.Errorf("last operation %s, want the rollout's with its criterion", rec)
	}
	if kcp := kcpOf(t, e); kcp.Spec.Rollout.Before.CertificatesExpiryDays != 0 {
		t.Errorf("the KCP's spec.rollout.before was written: %d", kcp.Spec.Rollout.Before.CertificatesExpiryDays)
	}
	mon.check(t)
	assertConverged(t, e, 3, from)
	assertKCPIdle(t, e)
}

// On a ClusterClass cluster: `restart` replaces every machine one at a time
// and KCP, whose spec the topology controller owns, finds nothing to do
// after the hand-back (the tool wrote no spec field); a new machine template
// is refused, exit 2, naming the class that owns it.
func TestClusterClassRestartAndTemplate(t *testing.T) {
	t.Parallel()
	e := classSim(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	before := quietVersions(t, e)
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--infrastructure-template", "demo-control-plane-v2")
	if r.Code != 2 || !strings.Contains(r.Stderr, "ClusterClass demo-class") {
		t.Errorf("upgrade --infrastructure-template on a ClusterClass cluster: exit %d, want 2 naming its class:\n%s", r.Code, r.Stderr)
	}
	assertUnchanged(t, before, versions(t, e))

	old := machineSet(t, e)
	mon := watchInvariants(t, e, 4, 2)
	if r := e.Plugin(t, ctx, "restart", "demo"); r.Code != 0 {
		t.Fatalf("restart of a ClusterClass cluster: exit %d:\n%s", r.Code, simtest.Tail(r.Stderr, 20))
	}
	mon.check(t)
	for name := range machineSet(t, e) {
		if old[name] {
			t.Errorf("machine %s was not replaced by the restart", name)
		}
	}
	assertConverged(t, e, 3, to)
	assertKCPIdle(t, e)
}
