package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
)

// A new machine image with the version, in one pass: `upgrade --version
// --infrastructure-template` leaves every machine at the version, made from
// the new template, its node booted from the new image, and KCP's own
// UpToDate agrees (assertConverged, assertKCPIdle). A template that does not
// exist is refused first, changing nothing.
func TestUpgradeWithNewMachineTemplate(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const template, image = "demo-control-plane-v1-36", "sim-image-v1.36.3"
	before := quietVersions(t, e)
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--infrastructure-template", template)
	if r.Code != 2 || !strings.Contains(r.Stderr, template) {
		t.Fatalf("upgrade to a template that does not exist: exit %d, want 2 naming %s:\n%s", r.Code, template, r.Stderr)
	}
	assertUnchanged(t, before, versions(t, e))

	if err := e.Sim.CreateInfraTemplate(ctx, template, image); err != nil {
		t.Fatal(err)
	}
	plan := e.Plugin(t, ctx, "plan", "demo", "--version", to, "--infrastructure-template", template)
	if plan.Code != 0 || strings.Count(plan.Stdout, "delete machine") != 3 {
		t.Errorf("plan: exit %d, want 0 and three machines to replace:\n%s", plan.Code, plan.Stdout)
	}
	r = e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--infrastructure-template", template, "-o", "json")
	if r.Code != 0 {
		t.Fatalf("upgrade with a new template: exit %d", r.Code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := e.Sim.ManagementClient().Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	if got := kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name; got != template {
		t.Errorf("KCP's machines are made from %s, want %s", got, template)
	}
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range machines {
		node := &corev1.Node{}
		if err := e.Sim.WorkloadClient().Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node); err != nil {
			t.Fatal(err)
		}
		if node.Status.NodeInfo.OSImage != image {
			t.Errorf("machine %s's node runs image %q, want %q", m.Name, node.Status.NodeInfo.OSImage, image)
		}
	}
	assertKCPIdle(t, e)
}
