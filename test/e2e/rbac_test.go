package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/access"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// The two identities of TestLeastPrivilege, ServiceAccounts the test
// impersonates (kubectl --as) as a runbook's identity would be used.
const (
	operator = "system:serviceaccount:default:cp-rollout-operator"
	viewer   = "system:serviceaccount:default:cp-rollout-viewer"
)

// The roles of deploy/rbac are what the tool needs and no more. Run as
// ServiceAccounts bound only to them (each use's ClusterRole cluster-wide, its
// Role for the cluster in the cluster's namespace): the cp-rollout-view
// identity, which may read no Secret and no KubeadmConfig, sees status's
// management half with a warning that the workload half needs the cluster's
// two Secrets and one that the KubeadmConfigs were not read, its plan is
// refused naming them, and its upgrade is refused before anything is locked
// or changed, each missing permission named; neither identity may write a
// Lease other than the cluster's own; the cp-rollout-operate
// identity upgrades, scales up and down and replaces each machine in turn
// (surge 1, 0, 1), on three failure domains that keep one machine each. Then
// the management API server's audit log shows that each identity used exactly
// what its role grants and the preflight asks for.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	auditLog := filepath.Join(t.TempDir(), "audit.log")
	opts := fastOptions(3)
	opts.AuditLog, opts.FailureDomains = auditLog, 3
	e := simtest.Start(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bind(t, e, rbac.View, viewer)
	bind(t, e, rbac.Operate, operator)
	as := func(identity string, args ...string) []string { return append(args, "--as", identity) }

	// What `kubectl auth can-i` answers for each identity: Leases are written
	// by name in the cluster's namespace alone, the Secrets read by the
	// operator alone.
	for _, c := range []struct {
		identity                        string
		verb, resource, namespace, name string
		want                            bool
	}{
		{viewer, "update", "leases", "capi-system", "", false},
		{operator, "update", "leases", "capi-system", "", false},
		{operator, "create", "leases", "capi-system", "", false},
		{operator, "delete", "leases", "capi-kubeadm-control-plane-system", "", false},
		{viewer, "update", "leases", "default", runlock.LeaseName("demo"), false},
		{operator, "update", "leases", "default", runlock.LeaseName("demo"), true},
		{operator, "update", "leases", "default", runlock.LeaseName("other"), false},
		{viewer, "get", "secrets", "default", "demo-kubeconfig", false},
		{viewer, "get", "secrets", "default", "demo-etcd", false},
		{operator, "get", "secrets", "default", "demo-etcd", true},
		{operator, "get", "secrets", "default", "other-etcd", false},
		{operator, "list", "secrets", "default", "", false},
	} {
		group := ""
		if c.resource == "leases" {
			group = "coordination.k8s.io"
		}
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: c.identity,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Group: group, Resource: c.resource, Namespace: c.namespace, Name: c.name}}}
		if err := e.Sim.ManagementClient().Create(ctx, review); err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != c.want {
			t.Errorf("can %s %s %s %q in namespace %s: %v, want %v", c.identity, c.verb, c.resource, c.name, c.namespace, review.Status.Allowed, c.want)
		}
	}

	// cp-rollout-view: status's management half, a refused plan, then a
	// refused upgrade.
	if r := e.Plugin(t, ctx, as(viewer, "status", "demo")...); r.Code != 0 || strings.Count(r.Stderr, "warning:") != 2 ||
		!strings.Contains(r.Stderr, "warning: showing the management cluster only") || !strings.Contains(r.Stderr, "Secrets demo-kubeconfig and demo-etcd in namespace default") ||
		!strings.Contains(r.Stderr, "warning: KubeadmConfigs not read") || !strings.Contains(r.Stderr, "kubeadmconfigs.bootstrap.cluster.x-k8s.io in namespace default, which "+viewer+" lacks") ||
		!strings.Contains(r.Stdout, "LOCK") || strings.Count(r.Stdout, "demo-") < 3 || !strings.Contains(r.Stdout, "not read: the workload cluster was not reached") {
		t.Errorf("status as the viewer: exit %d\nstdout:\n%s\nstderr:\n%s\nwant 0, the machines, one warning naming the two Secrets and one naming the KubeadmConfigs", r.Code, r.Stdout, r.Stderr)
	}
	if r := e.Plugin(t, ctx, as(viewer, "plan", "demo", "--version", to, "--exit-code")...); r.Code != 6 ||
		!strings.Contains(r.Stderr, "may not read Secrets demo-kubeconfig and demo-etcd in namespace default") || !strings.Contains(r.Stderr, "cp-rollout-operate-demo") {
		t.Errorf("plan as the viewer: exit %d, stderr %q: want 6 naming the Secrets and the Role that grants them", r.Code, r.Stderr)
	}
	if r := e.Plugin(t, ctx, as(viewer, "status", "-A")...); r.Code != 0 || !strings.Contains(r.Stdout, "default/demo") {
		t.Errorf("status -A as the viewer: exit %d, stdout %q, stderr %q: want 0 and a row for default/demo", r.Code, r.Stdout, r.Stderr)
	}
	before := quietVersions(t, e)
	r := e.Plugin(t, ctx, as(viewer, "upgrade", "demo", "--version", to)...)
	if r.Code != 6 {
		t.Fatalf("upgrade as the viewer: exit %d, stderr %q: want 6", r.Code, r.Stderr)
	}
	for _, want := range []string{
		viewer + " lacks",
		"cannot patch kubeadmcontrolplanes.controlplane.cluster.x-k8s.io in namespace default",
		"cannot create machines.cluster.x-k8s.io in namespace default",
		"cannot list kubeadmconfigs.bootstrap.cluster.x-k8s.io in namespace default",
		"cannot delete genericinfrastructuremachines.infrastructure.cluster.x-k8s.io in namespace default",
		"cannot update leases.coordination.k8s.io cp-rollout-demo in namespace default",
		"cannot get secrets demo-kubeconfig in namespace default",
	} {
		if !strings.Contains(r.Stderr, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, r.Stderr)
		}
	}
	assertUnchanged(t, before, versions(t, e))
	lease := &coordinationv1.Lease{}
	if err := e.Sim.ManagementClient().Get(ctx, client.ObjectKey{Namespace: "default", Name: runlock.LeaseName("demo")}, lease); !apierrors.IsNotFound(err) {
		t.Errorf("the refused upgrade left a Lease (%v)", err)
	}

	// cp-rollout-operate: every verb that changes the control plane.
	mon := watchInvariants(t, e, 4, 2)
	if r := e.Plugin(t, ctx, as(operator, "upgrade", "demo", "--version", to)...); r.Code != 0 {
		t.Fatalf("upgrade as the operator: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 20))
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
	// The same upgrade over a selection finds nothing to do; the operator
	// sees the fleet as the viewer does.
	// A fleet run records itself where runs are recorded: without the fleet
	// runs' Role there it is refused before it records or changes anything.
	if r := e.Plugin(t, ctx, as(operator, "upgrade", "-A", "--yes", "--version", to)...); r.Code != 6 ||
		!strings.Contains(r.Stderr, "cp-rollout-fleet") || !strings.Contains(r.Stderr, "namespace default") {
		t.Errorf("upgrade -A as the operator without the fleet Role: exit %d\n%s\nwant 6 naming the Role cp-rollout-fleet and the namespace", r.Code, simtest.Tail(r.Stderr, 5))
	}
	bindFleet(t, e, operator)
	if r := e.Plugin(t, ctx, as(operator, "upgrade", "-A", "--yes", "--version", to)...); r.Code != 0 {
		t.Errorf("upgrade -A as the operator: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 20))
	}
	if r := e.Plugin(t, ctx, as(operator, "status", "-A")...); r.Code != 0 {
		t.Errorf("status -A as the operator: exit %d, stderr %q", r.Code, r.Stderr)
	}

	mon = watchInvariants(t, e, 5, 2)
	if r := e.Plugin(t, ctx, as(operator, "scale", "demo", "--replicas", "5")...); r.Code != 0 {
		t.Fatalf("scale to 5: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 20))
	}
	mon.check(t)
	assertConverged(t, e, 5, to)
	mon = watchInvariants(t, e, 5, 3)
	if r := e.Plugin(t, ctx, as(operator, "scale", "demo", "--replicas", "3")...); r.Code != 0 {
		t.Fatalf("scale to 3: exit %d\n%s", r.Code, simtest.Tail(r.Stderr, 20))
	}
	mon.check(t)
	assertConverged(t, e, 3, to)

	// Each machine replaced in turn, its replacement in its failure domain.
	simtest.AssertOnePerDomain(t, e.Sim)
	for i, victim := range mustMachines(t, e) {
		surge := []string{"1", "0", "1"}[i]
		max := map[string]int{"1": 4, "0": 3}[surge]
		mon := watchInvariants(t, e, max, 2)
		if r := e.Plugin(t, ctx, as(operator, "replace", "demo", victim, "--max-surge", surge)...); r.Code != 0 {
			t.Fatalf("replace %s (surge %s): exit %d\n%s", victim, surge, r.Code, simtest.Tail(r.Stderr, 20))
		}
		mon.check(t)
		assertConverged(t, e, 3, to)
		if slices.Contains(mustMachines(t, e), victim) {
			t.Fatalf("surge %s: %s still there", surge, victim)
		}
		simtest.AssertOnePerDomain(t, e.Sim)
		// A runbook re-running the finished replace (say, after a crash that
		// hid its exit code) is told it is done, not that the machine is unknown.
		if r := e.Plugin(t, ctx, as(operator, "replace", "demo", victim, "--max-surge", surge)...); r.Code != 0 || !strings.Contains(r.Stderr, "was replaced by") {
			t.Errorf("re-run of replace %s: exit %d, want 0 saying it was replaced", victim, r.Code)
		}
	}

	// What each identity did, from the audit log, against what its role grants.
	used := audited(t, auditLog)
	for _, c := range []struct {
		identity string
		use      rbac.Use
		// unexercised are permissions of the role that this scenario has no
		// cause to use, each with the path that does.
		unexercised map[string]string
		// byTiming are permissions this scenario uses or not depending on
		// when a read meets another controller's write, each with that path.
		byTiming map[string]string
	}{
		{identity: viewer, use: rbac.View, unexercised: map[string]string{
			// A snapshot lists them; each is read on its own only when the
			// list did not return it (controlplane oneRead).
			"get genericinfrastructuremachines.infrastructure.cluster.x-k8s.io": "an InfraMachine without the cluster-name label",
			"get clusterclasses.cluster.x-k8s.io":                               "a topology cluster's upgrade across minors (TestClusterClassUpgradeThroughTwoMinors)",
		}},
		{identity: operator, use: rbac.Operate, unexercised: map[string]string{
			// A server-side apply that creates its object is audited as a
			// patch; the API server authorizes the create within it.
			"create machines.cluster.x-k8s.io":                                     "server-side apply creating a Machine",
			"create kubeadmconfigs.bootstrap.cluster.x-k8s.io":                     "server-side apply creating a KubeadmConfig",
			"create genericinfrastructuremachines.infrastructure.cluster.x-k8s.io": "server-side apply creating an InfraMachine",
			"delete kubeadmconfigs.bootstrap.cluster.x-k8s.io":                     "pieces a killed run left behind (TestKillBeforeMachineCreate)",
			"delete genericinfrastructuremachines.infrastructure.cluster.x-k8s.io": "pieces a killed run left behind (TestKillBeforeMachineCreate)",
			// This scenario's cluster has no ClusterClass topology.
			"patch clusters.cluster.x-k8s.io":     "the target of a topology cluster (TestClusterClass*)",
			"get clusterclasses.cluster.x-k8s.io": "a topology cluster's upgrade across minors (TestClusterClassUpgradeThroughTwoMinors)",
			// A fleet run lists its record to resume (TestFleetStagesSoakAndResume).
			"list configmaps": "a resumed fleet run, or fleet status",
		}, byTiming: map[string]string{
			// A deleting Machine's InfraMachine and KubeadmConfig go before
			// the Machine does; a live read in that moment asks for them by
			// name (controlplane oneRead). A new one is read again only when
			// another writer beat the tool's claim drop
			// (dropLabelAndAnnotationOwnership).
			"get genericinfrastructuremachines.infrastructure.cluster.x-k8s.io": "a live read while a deleting Machine outlives its InfraMachine, or a claim drop that conflicts",
			"get kubeadmconfigs.bootstrap.cluster.x-k8s.io":                     "a live read while a deleting Machine outlives its KubeadmConfig, or a claim drop that conflicts",
		}},
	} {
		granted := grantedBy(t, c.use)
		if c.use.Name == rbac.Operate.Name { // and the fleet runs' Role, bound above
			for _, p := range fleetGrants(t) {
				granted[p] = true
			}
		}
		// KubeadmConfigs hold the node-join token: the viewer is neither
		// granted them nor sends a request for one, refused or not
		// (controlplane asks whether it may first).
		if c.use.Name == rbac.View.Name {
			for p := range granted {
				if strings.Contains(p, "kubeadmconfigs") {
					t.Errorf("%s grants %q: a KubeadmConfig holds its machine's node-join token", c.use.Name, p)
				}
			}
		}
		for p := range used[c.identity] {
			if !granted[p] {
				t.Errorf("%s used %q, which %s does not grant", c.identity, p, c.use.Name)
			}
		}
		for p := range granted {
			_, unexercised := c.unexercised[p]
			_, byTiming := c.byTiming[p]
			if !unexercised && !byTiming && !used[c.identity][p] {
				t.Errorf("%s grants %q, which %s never used", c.use.Name, p, c.identity)
			}
		}
		for p := range c.byTiming {
			if !granted[p] {
				t.Errorf("%q is listed as used by timing but %s does not grant it: drop it from the list", p, c.use.Name)
			}
		}
		for p := range c.unexercised {
			if used[c.identity][p] {
				t.Errorf("%q is listed as unexercised but %s used it: drop it from the list", p, c.identity)
			}
		}
	}
}

// bind grants a use's roles to the ServiceAccount user, as `kubectl
// cp-rollout rbac demo --serviceaccount` does: the ClusterRole cluster-wide,
// the cluster's Role in its namespace. The ClusterRoleBinding is named after
// the ServiceAccount and its namespace, as simulators may share a management
// cluster.
func bind(t *testing.T, e *env, use rbac.Use, user string) {
	t.Helper()
	ctx := context.Background()
	c := e.Sim.ManagementClient()
	role, err := use.Role(e.Sim.ClusterKey().Namespace, e.Sim.ClusterKey().Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{use.ClusterRole(), role} {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	parts := strings.Split(user, ":") // system:serviceaccount:<namespace>:<name>
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: parts[2], Name: parts[3]}}
	for _, binding := range []client.Object{
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: parts[2] + "-" + parts[3]},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: use.Name},
			Subjects:   subjects,
		},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: role.Namespace, Name: parts[3]},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects:   subjects,
		},
	} {
		if err := c.Create(ctx, binding); err != nil {
			t.Fatal(err)
		}
	}
}

// bindFleet grants user the fleet runs' Role in the namespace where the
// simulator's runs are recorded (its kubeconfig context's: default).
func bindFleet(t *testing.T, e *env, user string) {
	t.Helper()
	role, err := rbac.FleetRole("default")
	if err != nil {
		t.Fatal(err)
	}
	c := e.Sim.ManagementClient()
	parts := strings.Split(user, ":") // system:serviceaccount:<namespace>:<name>
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: role.Namespace, Name: parts[3] + "-fleet"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: parts[2], Name: parts[3]}},
	}
	for _, obj := range []client.Object{role, binding} {
		if err := c.Create(context.Background(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// fleetGrants lists the fleet runs' Role's permissions as grantedBy does.
func fleetGrants(t *testing.T) []string {
	t.Helper()
	role, err := rbac.FleetRole("default")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				out = append(out, strings.TrimSuffix(v+" "+res+"."+r.APIGroups[0], "."))
			}
		}
	}
	return out
}

// grantedBy lists a use's permissions as "verb resource.group", expanded
// for the simulator's cluster exactly as the tool's preflight asks for them
// (the infrastructure wildcard as the simulator's InfraMachines and their
// template), so what the tool used is also what the preflight asked.
func grantedBy(t *testing.T, use rbac.Use) map[string]bool {
	t.Helper()
	perms, err := access.Needs(use, access.Scope{Namespace: "default", Cluster: "demo",
		InfraMachines: "genericinfrastructuremachines", InfraMachineTemplates: "genericinfrastructuremachinetemplates"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range perms {
		out[strings.TrimSuffix(p.Verb+" "+p.Resource+"."+p.Group, ".")] = true
	}
	return out
}

// audited reads the audit log: for each impersonated user, the set of
// "verb resource.group" it requested. Requests any authenticated user may make
// (discovery, and asking what it may do or who it is) are left out.
func audited(t *testing.T, path string) map[string]map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string]bool{}
	scan := bufio.NewScanner(f)
	scan.Buffer(make([]byte, 1<<20), 1<<20)
	for scan.Scan() {
		var ev struct {
			Verb             string
			ImpersonatedUser *struct{ Username string }
			ObjectRef        *struct{ Resource, APIGroup, Subresource string }
		}
		if err := json.Unmarshal(scan.Bytes(), &ev); err != nil {
			t.Fatalf("audit log: %v", err)
		}
		if ev.ImpersonatedUser == nil || ev.ObjectRef == nil {
			continue
		}
		switch ev.ObjectRef.APIGroup + "/" + ev.ObjectRef.Resource {
		case "authorization.k8s.io/selfsubjectaccessreviews", "authorization.k8s.io/selfsubjectrulesreviews", "authentication.k8s.io/selfsubjectreviews":
			continue
		}
		resource := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			resource += "/" + ev.ObjectRef.Subresource
		}
		user := ev.ImpersonatedUser.Username
		if out[user] == nil {
			out[user] = map[string]bool{}
		}
		out[user][strings.TrimSuffix(ev.Verb+" "+resource+"."+ev.ObjectRef.APIGroup, ".")] = true
	}
	if err := scan.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
