package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// Two clusters share a namespace: a, a simulated one, and b, an inert one
// (Cluster, KubeadmControlPlane, Machines, as Cluster API's webhooks and
// controllers left them). ServiceAccount operator-a is bound with exactly
// what `kubectl cp-rollout rbac a --role operate --serviceaccount` prints,
// applied with kubectl: the API server itself, through the printed
// ValidatingAdmissionPolicy, refuses each of its writes to b's objects (a
// Machine created, the KubeadmControlPlane's version set, a Machine deleted,
// the Cluster patched, b's lock taken, a relabel either way), naming the
// policy, while the same writes to a's pass. ServiceAccount unconfined-a,
// bound by the same output without the policy, shows what the Role alone
// would let through: all of it. Every probe is a server-side dry run, which
// admission sees and nothing stores. Then operator-a upgrades a with the
// policy in force: each of the tool's own writes passes it.
func TestOneClusterPerIdentity(t *testing.T) {
	t.Parallel()
	opts := fastOptions(1)
	opts.ClusterName = "a"
	e := simtest.Start(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()
	ns := e.Sim.ClusterKey().Namespace
	if err := sim.CreateInertClusters(ctx, c, ns, 1, 1, from); err != nil {
		t.Fatal(err)
	}
	b := sim.InertClusterName(1)

	// The two identities, and what `rbac` prints for them, applied as an
	// administrator would.
	confined := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "operator-a"}
	unconfined := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "unconfined-a"}
	for _, s := range []rbacv1.Subject{confined, unconfined} {
		if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name}}); err != nil {
			t.Fatal(err)
		}
	}
	confinement, err := rbac.Confine(confined)
	if err != nil {
		t.Fatal(err)
	}
	printed := e.Plugin(t, ctx, "rbac", "a", "-n", ns, "--role", "operate", "--serviceaccount", ns+":"+confined.Name)
	if printed.Code != 0 || !strings.Contains(printed.Stdout, "name: "+confinement.Policy.Name+"\n") {
		t.Fatalf("rbac: exit %d; want 0 and the policy %s in:\n%s", printed.Code, confinement.Policy.Name, printed.Stdout)
	}
	kubectlApply(t, ctx, e, printed.Stdout)
	t.Cleanup(func() {
		// Cluster-scoped, on the management cluster other tests share.
		_ = c.Delete(context.Background(), confinement.Binding)
		_ = c.Delete(context.Background(), confinement.Policy)
	})
	without := e.Plugin(t, ctx, "rbac", "a", "-n", ns, "--role", "operate", "--serviceaccount", ns+":"+unconfined.Name)
	if without.Code != 0 {
		t.Fatalf("rbac: exit %d", without.Code)
	}
	kubectlApply(t, ctx, e, withoutPolicies(without.Stdout))

	as := func(s rbacv1.Subject) client.Client {
		cfg := e.Sim.ManagementConfig()
		cfg.Impersonate.UserName = "system:serviceaccount:" + s.Namespace + ":" + s.Name
		impersonated, err := client.New(cfg, client.Options{Scheme: c.Scheme(), Mapper: c.RESTMapper()})
		if err != nil {
			t.Fatal(err)
		}
		return impersonated
	}
	operatorA, unconfinedA := as(confined), as(unconfined)

	// Each probe writes to one cluster's objects, as the tool would to its
	// own.
	firstMachine := func(cluster string) *clusterv1.Machine {
		machines := &clusterv1.MachineList{}
		if err := c.List(ctx, machines, client.InNamespace(ns), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster}); err != nil || len(machines.Items) == 0 {
			t.Fatalf("the Machines of %s: %d (%v)", cluster, len(machines.Items), err)
		}
		return &machines.Items[0]
	}
	kcpOfCluster := func(cluster string) *controlplanev1.KubeadmControlPlane {
		cl := &clusterv1.Cluster{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster}, cl); err != nil {
			t.Fatal(err)
		}
		return &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cl.Spec.ControlPlaneRef.Name}}
	}
	other := map[string]string{"a": b, b: "a"}
	mergePatch := func(body string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(body)) }
	probes := []struct {
		what string
		do   func(c client.Client, cluster string) error
	}{
		{"create Machine", func(ic client.Client, cluster string) error {
			// A copy of one of the cluster's own, under a new name.
			m := firstMachine(cluster)
			m.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: cluster + "-probe", Labels: m.Labels, Annotations: m.Annotations}
			m.Status = clusterv1.MachineStatus{}
			return ic.Create(ctx, m, client.DryRunAll)
		}},
		{"patch KCP spec.version", func(ic client.Client, cluster string) error {
			return ic.Patch(ctx, kcpOfCluster(cluster), mergePatch(`{"spec":{"version":"`+to+`"}}`), client.DryRunAll)
		}},
		{"delete Machine", func(ic client.Client, cluster string) error {
			return ic.Delete(ctx, firstMachine(cluster), client.DryRunAll)
		}},
		{"patch Cluster", func(ic client.Client, cluster string) error {
			obj := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster}}
			return ic.Patch(ctx, obj, mergePatch(`{"metadata":{"annotations":{"example.com/probe":"x"}}}`), client.DryRunAll)
		}},
		{"create Lease cp-rollout-<cluster>", func(ic client.Client, cluster string) error {
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: runlock.LeaseName(cluster)},
				Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(int32(1 << 30))}}
			return ic.Create(ctx, lease, client.DryRunAll)
		}},
		{"relabel KCP to the other cluster", func(ic client.Client, cluster string) error {
			return ic.Patch(ctx, kcpOfCluster(cluster), mergePatch(`{"metadata":{"labels":{"`+clusterv1.ClusterNameLabel+`":"`+other[cluster]+`"}}}`), client.DryRunAll)
		}},
	}

	byPolicy := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+confinement.Policy.Name+"'")
	}
	// The API server takes the policy up within a second or so.
	simtest.Eventually(t, time.Minute, "the policy in force", func(context.Context) (bool, string, error) {
		err := probes[0].do(operatorA, b)
		return byPolicy(err), "create Machine of " + b + ": " + errString(err), nil
	})
	outcome := func(err error) string {
		switch {
		case err == nil:
			return "allowed"
		case byPolicy(err):
			return "DENIED (policy)"
		default:
			return "error: " + err.Error()
		}
	}
	var table strings.Builder
	width := len("system:serviceaccount:" + ns + ":" + unconfined.Name)
	fmt.Fprintf(&table, "%-*s  %-35s %-17s %s\n", width, "identity", "write (server-side dry run)", "cluster a", "cluster b ("+b+")")
	for _, id := range []struct {
		subject rbacv1.Subject
		c       client.Client
	}{{confined, operatorA}, {unconfined, unconfinedA}} {
		for _, p := range probes {
			errA, errB := p.do(id.c, "a"), p.do(id.c, b)
			name := "system:serviceaccount:" + ns + ":" + id.subject.Name
			fmt.Fprintf(&table, "%-*s  %-35s %-17s %s\n", width, name, p.what, outcome(errA), outcome(errB))
			relabel := strings.HasPrefix(p.what, "relabel")
			switch {
			case id.subject == unconfined:
				if errA != nil || errB != nil {
					t.Errorf("%s, bound without the policy: %s: a %v, b %v; want both allowed (the Role alone confines no write to a cluster)", name, p.what, errA, errB)
				}
			case relabel:
				if !byPolicy(errA) || !byPolicy(errB) {
					t.Errorf("%s: %s: a %v, b %v; want both refused by the policy: a relabel moves an object between clusters", name, p.what, errA, errB)
				}
			case errA != nil || !byPolicy(errB) || !strings.Contains(errB.Error(), "is of cluster "+b):
				t.Errorf("%s: %s: a %v, b %v; want a allowed, b refused by the policy naming cluster %s", name, p.what, errA, errB, b)
			}
		}
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "not-a-lock"}}
	err = operatorA.Create(ctx, lease, client.DryRunAll)
	fmt.Fprintf(&table, "%-*s  %-35s %-17s %s\n", width, "system:serviceaccount:"+ns+":"+confined.Name, "create Lease not-a-lock", outcome(err), "(no cluster)")
	if !byPolicy(err) {
		t.Errorf("create Lease not-a-lock: %v; want refused by the policy: the tool writes no Lease but a cluster's lock", err)
	}
	t.Logf("what the API server answered each identity, in namespace %s:\n%s", ns, table.String())

	// The tool's own writes, as the confined identity, with the policy in
	// force.
	before := inertResourceVersions(t, c, ns)
	mon := watchInvariants(t, e, 2, 1)
	r := e.Plugin(t, ctx, "upgrade", "a", "--version", to, "--as", "system:serviceaccount:"+ns+":"+confined.Name)
	if r.Code != 0 {
		t.Fatalf("upgrade a as %s: exit %d\n%s", confined.Name, r.Code, simtest.Tail(r.Stderr, 20))
	}
	mon.check(t)
	assertConverged(t, e, 1, to)
	if after := inertResourceVersions(t, c, ns); after != before {
		t.Errorf("cluster %s's objects changed during a's upgrade: %s, were %s", b, after, before)
	}
}

// kubectlApply applies a YAML stream as an administrator would, with the
// real kubectl.
func kubectlApply(t *testing.T, ctx context.Context, e *env, manifests string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "kubectl", "apply", "-f", "-")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig)
	cmd.Stdin = strings.NewReader(manifests)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	t.Logf("kubectl apply:\n%s", out)
}

// withoutPolicies is a YAML stream less its ValidatingAdmissionPolicies and
// their bindings: what `rbac` printed before it printed them.
func withoutPolicies(manifests string) string {
	var kept []string
	for _, doc := range strings.Split(manifests, "\n---\n") {
		if !strings.Contains(doc, "\nkind: ValidatingAdmissionPolicy") {
			kept = append(kept, doc)
		}
	}
	return strings.Join(kept, "\n---\n")
}

// inertResourceVersions are the resourceVersions of the namespace's inert
// objects (Clusters, KubeadmControlPlanes, Machines), one string.
func inertResourceVersions(t *testing.T, c client.Client, ns string) string {
	t.Helper()
	ctx := context.Background()
	inert := client.MatchingLabels{clusterv1.ClusterNameLabel: sim.InertClusterName(1)}
	var out []string
	machines := &clusterv1.MachineList{}
	kcps := &controlplanev1.KubeadmControlPlaneList{}
	cluster := &clusterv1.Cluster{}
	if err := c.List(ctx, machines, client.InNamespace(ns), inert); err != nil {
		t.Fatal(err)
	}
	if err := c.List(ctx, kcps, client.InNamespace(ns), inert); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: sim.InertClusterName(1)}, cluster); err != nil {
		t.Fatal(err)
	}
	out = append(out, "cluster/"+cluster.Name+"="+cluster.ResourceVersion)
	for _, k := range kcps.Items {
		out = append(out, "kcp/"+k.Name+"="+k.ResourceVersion)
	}
	for _, m := range machines.Items {
		out = append(out, "machine/"+m.Name+"="+m.ResourceVersion)
	}
	return strings.Join(out, " ")
}
