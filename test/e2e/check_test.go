package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/readiness"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// The readiness checks on the simulator: a clean cluster passes every one;
// each finding the simulator stages is reported by its check with the
// right result; and upgrade refuses on a block, exit 3, with nothing
// changed — no pause, no lock, no machine, the KCP's version as it was.
func TestCheckFindsEachStagedFinding(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	clean := checkResults(t, e, ctx, to, 0)
	for check, f := range clean {
		if f.Result != readiness.Pass {
			t.Errorf("clean cluster: %s %s: %s", check, f.Result, f.Found)
		}
	}
	if len(clean) != len(readiness.Checks) {
		t.Errorf("clean cluster: %d findings, want one per check (%d)", len(clean), len(readiness.Checks))
	}

	// Every finding at once. CoreDNS is judged against the image the KCP
	// names, so the KCP names a newer one; KCP is held off with its pause
	// annotation meanwhile, or it would move CoreDNS at once.
	mgmt := e.Sim.ManagementClient()
	kcp := &controlplanev1.KubeadmControlPlane{}
	kcp.Namespace, kcp.Name = e.Sim.KCPKey().Namespace, e.Sim.KCPKey().Name
	patchKCP(t, mgmt, kcp, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":""}},"spec":{"kubeadmConfigSpec":{"clusterConfiguration":{"dns":{"imageTag":"v1.14.2"}}}}}`)
	cluster := &clusterv1.Cluster{}
	cluster.Namespace, cluster.Name = e.Sim.ClusterKey().Namespace, e.Sim.ClusterKey().Name
	applyFaults(t, mgmt, cluster, sim.FaultDeprecatedAPIClient, sim.FaultOldWorkers+"=v1.32.4", sim.FaultFailClosedWebhook, sim.FaultCorefileUnknownPlugin)
	machines := mustMachines(t, e)
	alarmed := &clusterv1.Machine{}
	alarmed.Namespace, alarmed.Name = cluster.Namespace, machines[0]
	applyFaults(t, mgmt, alarmed, sim.FaultEtcdAlarm)

	// v1.37 removes the API the staged client calls.
	staged := checkResults(t, e, ctx, "v1.37.0", 3)
	want := map[string]struct {
		result readiness.Result
		says   string
	}{
		"removed-apis":         {readiness.Block, "storage.k8s.io/v1beta1 volumeattributesclasses (removed in v1.37)"},
		"version-skew":         {readiness.Block, "kubelet v1.32.4 on nodes old-worker-1, old-worker-2"},
		"fail-closed-webhooks": {readiness.Block, "ValidatingWebhookConfiguration sim-fail-closed-webhook"},
		"etcd":                 {readiness.Block, "has alarm NOSPACE"},
		"coredns":              {readiness.Warn, "k8s_gateway"},
		"drain-blockers":       {readiness.Pass, ""},
		"also-rolls":           {readiness.Pass, ""},
		"certificates":         {readiness.Pass, ""},
	}
	for check, w := range want {
		f := staged[check]
		if f.Result != w.result || !strings.Contains(f.Found, w.says) {
			t.Errorf("staged: %s %s: %s\nwant %s saying %q", check, f.Result, f.Found, w.result, w.says)
		}
	}

	// The upgrade refuses before it takes anything over. The KCP is given
	// back to KCP and the etcd alarm disarmed first: a KCP paused by
	// someone else and a member with an alarm are refusals of the guards,
	// which come first; the one here is the readiness checks'.
	patchKCP(t, mgmt, kcp, `{"metadata":{"annotations":{"cluster.x-k8s.io/paused":null}},"spec":{"kubeadmConfigSpec":{"clusterConfiguration":{"dns":null}}}}`)
	applyFaults(t, mgmt, alarmed)
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to)
	if r.Code != 3 {
		t.Errorf("upgrade: exit %d, want 3", r.Code)
	}
	for _, s := range []string{"readiness check version-skew: block", "readiness check fail-closed-webhooks: block", "is not ready for " + to, "--skip-check version-skew,fail-closed-webhooks"} {
		if !strings.Contains(r.Stderr, s) {
			t.Errorf("upgrade's stderr does not say %q:\n%s", s, simtest.Tail(r.Stderr, 12))
		}
	}
	if err := mgmt.Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused || kcp.Spec.Version != from {
		t.Errorf("after the refusal the KCP is at %s, paused %v: want %s, not paused", kcp.Spec.Version, paused, from)
	}
	if after := mustMachines(t, e); !slices.Equal(after, machines) {
		t.Errorf("machines %v after the refusal, want %v", after, machines)
	}
	lease := &coordinationv1.Lease{}
	err := mgmt.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: runlock.LeaseName("demo")}, lease)
	if !apierrors.IsNotFound(err) {
		t.Errorf("after the refusal the cluster's Lease: %v (holder %v), want none taken", err, lease.Spec.HolderIdentity)
	}
}

// checkResults runs check against version, wants exit code, and returns the
// findings by check; it logs how long check took.
func checkResults(t *testing.T, e *env, ctx context.Context, version string, code int) map[string]readiness.Finding {
	t.Helper()
	r := e.Plugin(t, ctx, "check", "demo", "--version", version, "-o", "json")
	if r.Code != code {
		t.Fatalf("check --version %s: exit %d, want %d", version, r.Code, code)
	}
	var report struct {
		Findings []readiness.Finding `json:"findings"`
	}
	// With an error, main ends stdout with the error's object: the report
	// is the first.
	if err := json.NewDecoder(strings.NewReader(r.Stdout)).Decode(&report); err != nil {
		t.Fatalf("check -o json: %v\n%s", err, r.Stdout)
	}
	found := map[string]readiness.Finding{}
	for _, f := range report.Findings {
		found[f.Check] = f
		t.Logf("check %s: %s in %s: %s", f.Check, f.Result, f.Took.Round(time.Millisecond), f.Found)
	}
	t.Logf("check --version %s took %s", version, r.Took.Round(time.Millisecond))
	return found
}

// applyFaults asks the simulator for faults on obj (the Cluster or a
// Machine) and waits until it says they are all in effect; none undoes
// every fault asked for there.
func applyFaults(t *testing.T, c client.Client, obj client.Object, faults ...string) {
	t.Helper()
	if err := c.Patch(context.Background(), obj, client.RawPatch(types.MergePatchType, sim.AnnotationPatch(sim.FaultAnnotation, strings.Join(faults, ",")))); err != nil {
		t.Fatal(err)
	}
	want := slices.Sorted(slices.Values(faults))
	simtest.Eventually(t, time.Minute, strings.Join(faults, ",")+" in effect", func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, "", err
		}
		got := strings.FieldsFunc(obj.GetAnnotations()[sim.FaultAppliedAnnotation], func(r rune) bool { return r == ',' })
		slices.Sort(got)
		return slices.Equal(got, want), fmt.Sprintf("applied %v", got), nil
	})
}

func patchKCP(t *testing.T, c client.Client, kcp *controlplanev1.KubeadmControlPlane, patch string) {
	t.Helper()
	if err := c.Patch(context.Background(), kcp, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}
