package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// A ValidatingAdmissionPolicy of the platform team's (as Kyverno or
// Gatekeeper would be) rejects the target version on the KCP. The tool has
// paused the KCP by then but changed nothing else: it hands back at once and
// exits 2 with the server's reason, leaving no pause, no record and no new
// machine.
func TestPolicyRejectedTargetIsHandedBack(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()
	ns := e.Sim.ClusterKey().Namespace
	const reason = "v1.36.3 is not approved for this fleet"
	name := "no-" + strings.ReplaceAll(to, ".", "-") + "-in-" + ns
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{
						APIGroups: []string{"controlplane.cluster.x-k8s.io"}, APIVersions: []string{"*"}, Resources: []string{"kubeadmcontrolplanes"},
					},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "object.spec.version != '" + to + "'", Message: reason}},
		},
	}
	// Bound to this simulator's namespace: the management cluster is shared.
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns},
			}},
		},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), o) })
	}
	// The API server takes the policy up within a second or so.
	simtest.Eventually(t, time.Minute, "the policy in force", func(ctx context.Context) (bool, string, error) {
		kcp := kcpOf(t, e)
		target := kcp.DeepCopy()
		target.Spec.Version = to
		err := c.Patch(ctx, target, client.MergeFrom(kcp), client.DryRunAll)
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), "dry-run patch: " + errString(err), nil
	})
	machinesBefore := machineNames(t, e)

	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to)
	if r.Code != 2 || !strings.Contains(r.Stderr, reason) {
		t.Errorf("exit %d, stderr %q; want exit 2 with the policy's reason", r.Code, r.Stderr)
	}
	kcp := kcpOf(t, e)
	for k := range kcp.Annotations {
		if k == clusterv1.PausedAnnotation || (strings.HasPrefix(k, "cp-rollout.") && k != record.LastAnnotation) {
			t.Errorf("KCP still carries %s after the rejected run", k)
		}
	}
	if kcp.Spec.Version != from {
		t.Errorf("KCP version %s, want %s untouched", kcp.Spec.Version, from)
	}
	if after := machineNames(t, e); after != machinesBefore {
		t.Errorf("machines %s, were %s: want none created or deleted", after, machinesBefore)
	}
}

func errString(err error) string {
	if err == nil {
		return "accepted"
	}
	return err.Error()
}

func machineNames(t *testing.T, e *env) string {
	t.Helper()
	machines, err := e.Sim.Machines(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return names(machines)
}
