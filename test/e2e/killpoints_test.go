package e2e

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// gate is a validating admission webhook on the management API server that
// holds the first Machine request it matches until the test has killed the
// tool, then denies it: the request never takes effect (the API server drops
// it once its client is gone; the denial makes sure), exactly as if the tool
// had died just before sending it. It lets a test kill the tool between two
// API calls that are milliseconds apart.
type gate struct {
	held    chan *admissionv1.AdmissionRequest
	release chan struct{}
	once    sync.Once
	seen    atomic.Bool // any request reached the gate: it is in place
}

func openGate(t *testing.T, e *env, op admissionregistrationv1.OperationType, match func(*admissionv1.AdmissionRequest) bool) *gate {
	t.Helper()
	g := &gate{held: make(chan *admissionv1.AdmissionRequest, 1), release: make(chan struct{})}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		review := &admissionv1.AdmissionReview{}
		if err := json.NewDecoder(r.Body).Decode(review); err != nil || review.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		g.seen.Store(true)
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		if review.Request.Operation == admissionv1.Operation(op) && !ptr.Deref(review.Request.DryRun, false) && match(review.Request) {
			first := false
			g.once.Do(func() { first = true })
			if first {
				g.held <- review.Request
				select {
				case <-g.release:
				case <-time.After(25 * time.Second):
				}
				resp.Allowed = false
				resp.Result = &metav1.Status{Message: "held by the test gate while the tool was killed"}
			}
		}
		review.Response = resp
		_ = json.NewEncoder(w).Encode(review)
	}))
	caBundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	// The management cluster is shared: the gate holds this simulator's
	// Machines alone.
	ns := e.Sim.ClusterKey().Namespace
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-gate-" + ns},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:              "gate.e2e.cp-rollout.io",
			ClientConfig:      admissionregistrationv1.WebhookClientConfig{URL: ptr.To(srv.URL), CABundle: caBundle},
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			// UPDATE always, so that a dry-run patch can show the gate is in place.
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{op, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{clusterv1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"machines"}},
			}},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			// A request the gate cannot answer must fail, not slip through.
			FailurePolicy:  ptr.To(admissionregistrationv1.Fail),
			TimeoutSeconds: ptr.To(int32(30)),
		}},
	}
	c := e.Sim.ManagementClient()
	ctx := context.Background()
	if err := c.Create(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.open()
		_ = c.Delete(ctx, cfg) // before the server closes, or every Machine write would fail
		srv.Close()
	})
	// The API server picks a new webhook configuration up after a moment:
	// probe with dry-run patches until one reaches the gate.
	machines, err := e.Sim.Machines(ctx)
	if err != nil || len(machines) == 0 {
		t.Fatalf("no machine to probe the gate with: %v", err)
	}
	probe := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"e2e.cp-rollout.io/probe":"x"}}}`))
	for deadline := time.Now().Add(time.Minute); !g.seen.Load(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the gate webhook was never called")
		}
		_ = c.Patch(ctx, &machines[0], probe, client.DryRunAll)
	}
	return g
}

// wait returns the held request once the tool has sent it.
func (g *gate) Wait(t *testing.T) *admissionv1.AdmissionRequest {
	t.Helper()
	select {
	case req := <-g.held:
		return req
	case <-time.After(5 * time.Minute):
		t.Fatal("the gated request never came")
		return nil
	}
}

// open denies the held request and lets every later one through.
func (g *gate) open() {
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

// Killed between creating a replacement's InfraMachine and KubeadmConfig and
// creating its Machine: the re-run deletes the two orphans and finishes.
func TestKillBeforeMachineCreate(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	g := openGate(t, e, admissionregistrationv1.Create, func(*admissionv1.AdmissionRequest) bool { return true })

	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	req := g.Wait(t)
	run.Kill()
	g.open()
	left := orphans(t, e)
	if len(left) != 2 || !strings.Contains(strings.Join(left, " "), req.Name) {
		t.Fatalf("after the kill: orphans %v, want the InfraMachine and KubeadmConfig of %s", left, req.Name)
	}

	breakLock(t, e)
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "-o", "json")
	mon.check(t)
	if r.Code != 0 {
		t.Fatalf("re-run: exit %d", r.Code)
	}
	removed := 0
	for _, ev := range simtest.Events(t, r.Stdout) {
		if ev["action"] == "remove-orphan" && ev["phase"] == "done" {
			removed++
		}
	}
	if removed != 2 {
		t.Errorf("re-run removed %d orphans, want 2", removed)
	}
	assertConverged(t, e, 3, to)
}

// Killed after removing a deleting machine's etcd member and before releasing
// its pre-terminate hook: a re-run waits until it has seen the dead run's
// Lease go unrenewed for its duration, naming the dead holder, then releases
// the machine (there is no member left to remove) and finishes.
func TestKillBetweenMemberRemovalAndRelease(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	releases := func(req *admissionv1.AdmissionRequest) bool {
		var before, after clusterv1.Machine
		if json.Unmarshal(req.OldObject.Raw, &before) != nil || json.Unmarshal(req.Object.Raw, &after) != nil {
			return false
		}
		_, had := before.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]
		_, has := after.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]
		return had && !has
	}
	g := openGate(t, e, admissionregistrationv1.Update, releases)

	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	req := g.Wait(t)
	run.Kill()
	g.open()
	m := &clusterv1.Machine{}
	if err := e.Sim.ManagementClient().Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]; !ok || m.DeletionTimestamp.IsZero() {
		t.Fatalf("machine %s: want it deleting and still held by its hook", m.Name)
	}
	members, err := e.Sim.EtcdMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, mb := range members {
		if mb.Name == m.Status.NodeRef.Name {
			t.Fatalf("member of %s still listed: the kill came before its removal", m.Name)
		}
	}

	// The dead run still holds its Lease, and its renew time says nothing a
	// re-run may trust (another machine's clock). The re-run watches the
	// Lease, says whose it is and that it waits, and takes it over only once
	// it has gone its whole duration unrenewed under its own eyes.
	lease := &coordinationv1.Lease{}
	if err := e.Sim.ManagementClient().Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: runlock.LeaseName("demo")}, lease); err != nil {
		t.Fatal(err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if !strings.Contains(holder, "/pid-") {
		t.Fatalf("after the kill the Lease is %s: want it still held by the dead run", runlock.Holder(lease))
	}
	began := time.Now()
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to)
	mon.check(t)
	if r.Code != 0 {
		t.Fatalf("re-run: exit %d", r.Code)
	}
	if !strings.Contains(r.Stderr, "await-lock") || !strings.Contains(r.Stderr, holder) {
		t.Errorf("the re-run did not say it waited for %s's lock:\n%s", holder, r.Stderr)
	}
	if took := time.Since(began); took < runlock.LeaseDuration {
		t.Errorf("the re-run finished %s after it started: it cannot have watched the dead run's Lease for %s", took.Round(time.Second), runlock.LeaseDuration)
	}
	assertConverged(t, e, 3, to)
}

// Killed after deleting a machine and before its pre-terminate stage (another
// controller's pre-drain hook holds it): a re-run waits in that stage and
// times out naming it (exit 4); once the hook is gone, a re-run finishes.
func TestKillBeforePreTerminateAndStuckDeletion(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const hold = clusterv1.PreDrainDeleteHookAnnotationPrefix + "/e2e-hold"
	setHold := func(on bool) {
		machines, err := e.Sim.Machines(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range machines {
			m := &machines[i]
			if _, ok := m.Annotations[hold]; ok == on {
				continue
			}
			patch := client.MergeFrom(m.DeepCopy())
			if on {
				m.Annotations[hold] = ""
			} else {
				delete(m.Annotations, hold)
			}
			if err := e.Sim.ManagementClient().Patch(ctx, m, patch); err != nil {
				t.Fatal(err)
			}
		}
	}
	setHold(true)

	run := e.StartPlugin(t, "upgrade", "demo", "--version", to, "-o", "json")
	victim := stringOf(run.Until(t, isAction("delete", "done"))["machine"])
	run.Kill()
	simtest.Eventually(t, 10*time.Minute, victim+" waiting for the pre-drain hook", func(ctx context.Context) (bool, string, error) {
		m := &clusterv1.Machine{}
		if err := e.Sim.ManagementClient().Get(ctx, client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: victim}, m); err != nil {
			return false, "", err
		}
		c := conditions.Get(m, clusterv1.MachineDeletingCondition)
		return c != nil && c.Reason == clusterv1.MachineDeletingWaitingForPreDrainHookReason, fmt.Sprintf("Deleting: %+v", c), nil
	})

	breakLock(t, e)
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--delete-timeout", "15s")
	if r.Code != 4 || !strings.Contains(r.Stderr, victim) || !strings.Contains(r.Stderr, clusterv1.MachineDeletingWaitingForPreDrainHookReason) {
		t.Fatalf("re-run with the hold in place: exit %d, want 4 naming %s and the stage it waits in", r.Code, victim)
	}

	setHold(false)
	r = e.Plugin(t, ctx, "upgrade", "demo", "--version", to)
	mon.check(t)
	if r.Code != 0 {
		t.Fatalf("re-run after the hold is gone: exit %d", r.Code)
	}
	assertConverged(t, e, 3, to)
}
