package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// canaryToken is a node-join token planted where Cluster API's kubeadm
// bootstrap provider keeps the ones it makes: a KubeadmConfig's
// spec.joinConfiguration.discovery.bootstrapToken.token.
const canaryToken = "cpview.k7q2m9x4c1z8w3p5"

// A KubeadmConfig holds its machine's node-join token in plain text, and
// whoever reads it can join a node of their own to the workload cluster. The
// view roles grant no read of one: as their ServiceAccount, every resource
// they let it get or list (asked of the API server, a SelfSubjectRulesReview,
// with the infrastructure wildcard as what the API server serves there) is
// read, and neither the planted token nor those the bootstrap provider made
// for the simulator's machines is anywhere in it. status as that identity
// still works, exit 0 with a warning naming what it did not read, single
// (status CLUSTER), over the fleet (-A) and watching (-w, the warning once);
// its UP-TO-DATE is KCP's own condition, and where KCP has not judged the
// spec (paused, with the spec changed since) it says unknown, where the full
// comparison an operator makes says outdated: it never claims up to date
// what it could not judge.
func TestViewRoleReadsNoBootstrapToken(t *testing.T) {
	t.Parallel()
	began := time.Now()
	e := simtest.Start(t, fastOptions(3))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	key := e.Sim.ClusterKey()
	viewer := "system:serviceaccount:" + key.Namespace + ":cp-rollout-token-viewer"
	bind(t, e, rbac.View, viewer)
	admin := e.Sim.ManagementClient()
	as := func(args ...string) []string { return append(args, "--as", viewer) }

	canary := &bootstrapv1.KubeadmConfig{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name + "-token-canary",
		Labels: map[string]string{clusterv1.ClusterNameLabel: key.Name}}}
	canary.Spec.JoinConfiguration.Discovery.BootstrapToken = bootstrapv1.BootstrapTokenDiscovery{
		Token: canaryToken, APIServerEndpoint: "127.0.0.1:6443", UnsafeSkipCAVerification: ptr.To(true)}
	if err := admin.Create(ctx, canary); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), canary) })
	// The tokens to look for: the canary's and every one the bootstrap
	// provider wrote for a machine that joined.
	configs := &bootstrapv1.KubeadmConfigList{}
	if err := admin.List(ctx, configs, client.InNamespace(key.Namespace)); err != nil {
		t.Fatal(err)
	}
	var tokens []string
	for _, c := range configs.Items {
		if tok := c.Spec.JoinConfiguration.Discovery.BootstrapToken.Token; tok != "" {
			tokens = append(tokens, tok)
		}
	}
	t.Logf("%d KubeadmConfigs in %s, %d with a node-join token (the canary's included)", len(configs.Items), key.Namespace, len(tokens))
	if !slices.Contains(tokens, canaryToken) {
		t.Fatalf("the canary's token is not where the bootstrap provider keeps tokens: %v", tokens)
	}

	// What the API server says the viewer may read, and reading all of it.
	table, leaked := readAsViewer(t, ctx, e, viewer, tokens)
	t.Logf("what %s can read (every rule that grants a get, list or watch, as the API server reviews them):\n%s", viewer, formatReadable(table))
	for _, l := range leaked {
		t.Errorf("a node-join token is readable as %s: %s", viewer, l)
	}
	for _, verb := range []string{"get", "list", "watch"} {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: viewer,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: bootstrapv1.GroupVersion.Group, Resource: "kubeadmconfigs", Namespace: key.Namespace}}}
		if err := admin.Create(ctx, review); err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed {
			t.Errorf("%s may %s kubeadmconfigs in %s", viewer, verb, key.Namespace)
		}
	}

	// status as the viewer: exit 0, what it did not read named once on
	// stderr, KCP's word on each machine, and no token anywhere.
	noToken := func(what string, r simtest.Result) {
		for _, tok := range tokens {
			if strings.Contains(r.Stdout+r.Stderr, tok) {
				t.Errorf("%s printed a node-join token", what)
			}
		}
	}
	type machine struct {
		Name            string
		UpToDate        bool
		UpToDateUnknown bool
	}
	statusOf := func(what string, args ...string) (st struct {
		KubeadmConfigsNotRead bool
		Machines              []machine
	}, r simtest.Result) {
		t.Helper()
		r = e.Plugin(t, ctx, args...)
		noToken(what, r)
		if r.Code != 0 {
			t.Fatalf("%s: exit %d\n%s", what, r.Code, r.Stderr)
		}
		if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil || len(st.Machines) != 3 {
			t.Fatalf("%s: %v, %d machines:\n%s", what, err, len(st.Machines), r.Stdout)
		}
		return st, r
	}
	simtest.Eventually(t, time.Minute, "KCP's UpToDate condition on every machine, as the viewer reads it", func(context.Context) (bool, string, error) {
		st, r := statusOf("status as the viewer", as("status", key.Name, "-o", "json")...)
		if !st.KubeadmConfigsNotRead || strings.Count(r.Stderr, "warning: KubeadmConfigs not read") != 1 {
			t.Fatalf("status -o json as the viewer: kubeadmConfigsNotRead %v, stderr:\n%s\nwant true and one warning", st.KubeadmConfigsNotRead, r.Stderr)
		}
		for _, m := range st.Machines {
			if !m.UpToDate || m.UpToDateUnknown {
				return false, fmt.Sprintf("%+v", st.Machines), nil
			}
		}
		return true, "", nil
	})
	r := e.Plugin(t, ctx, as("status", key.Name)...)
	noToken("status", r)
	if r.Code != 0 || !strings.Contains(r.Stderr, "warning: KubeadmConfigs not read: they hold the machines' node-join token") ||
		!strings.Contains(r.Stderr, "Role "+rbac.Operate.RoleName(key.Name)+" grants it") || !strings.Contains(r.Stdout, "UP-TO-DATE") {
		t.Errorf("status as the viewer: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	r = e.Plugin(t, ctx, as("status", "-A")...)
	noToken("status -A", r)
	if r.Code != 0 || !strings.Contains(r.Stdout, key.String()) {
		t.Errorf("status -A as the viewer: exit %d, want 0 and a row for %s\n%s\n%s", r.Code, key, r.Stdout, r.Stderr)
	}
	watch := e.StartPlugin(t, as("status", key.Name, "-w", "--interval", "300ms", "-o", "json")...)
	if first := watch.Until(t, func(map[string]any) bool { return true }); first["kubeadmConfigsNotRead"] != true {
		t.Errorf("status -w as the viewer, first object: %v", first)
	}
	time.Sleep(1500 * time.Millisecond) // several reads
	if code := watch.Interrupt(); code != 0 || strings.Count(watch.Stderr(), "warning: KubeadmConfigs not read") != 1 {
		t.Errorf("status -w as the viewer: exit %d, want 0 and the warning once:\n%s", code, watch.Stderr())
	}

	// A change of the spec under a pause, which KCP has not judged: the
	// full comparison finds every machine outdated; the viewer, without
	// their KubeadmConfigs, says unknown rather than up to date.
	if r := e.Plugin(t, ctx, "pause", key.Name, "--reason", "view role test"); r.Code != 0 {
		t.Fatalf("pause: exit %d\n%s", r.Code, r.Stderr)
	}
	setAPIServerArg(t, e, "audit-log-maxage", "30")
	full, _ := statusOf("status as the admin", "status", key.Name, "-o", "json")
	viewed, _ := statusOf("status as the viewer", as("status", key.Name, "-o", "json")...)
	for i := range full.Machines {
		f, v := full.Machines[i], viewed.Machines[i]
		if full.KubeadmConfigsNotRead || f.UpToDate || f.UpToDateUnknown {
			t.Errorf("as the admin, %+v: want outdated, judged on its KubeadmConfig", f)
		}
		if v.UpToDate || !v.UpToDateUnknown {
			t.Errorf("as the viewer, %+v: want unknown, not up to date", v)
		}
	}
	t.Logf("took %s", time.Since(began).Round(time.Second))
}

// readable is one rule of what an identity may read, and what reading it
// gave.
type readable struct {
	resource, verbs, scope string
	objects, bytes         int
	token                  bool
}

// readAsViewer asks the API server which rules grant identity a get, list or
// watch in the simulator's namespace (its ClusterRoles' rules apply there
// too), and makes each as identity: a list in the namespace and across all
// namespaces, a get of every object of the namespace (or cluster-wide, for a
// cluster-scoped resource) and of the ones a rule names anywhere. A
// wildcard resource is every resource the API server serves in that group.
// It returns a row per rule and resource, and where a token was found.
func readAsViewer(t *testing.T, ctx context.Context, e *env, identity string, tokens []string) (rows []readable, leaked []string) {
	t.Helper()
	ns := e.Sim.ClusterKey().Namespace
	cfg := e.Sim.ManagementConfig()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: identity}
	as, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	review, err := as.AuthorizationV1().SelfSubjectRulesReviews().Create(ctx,
		&authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if review.Status.Incomplete {
		t.Fatalf("the rules review is incomplete: %s", review.Status.EvaluationError)
	}
	asDynamic, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	adminDynamic, err := dynamic.NewForConfig(e.Sim.ManagementConfig())
	if err != nil {
		t.Fatal(err)
	}
	served := servedResources(t, e.Sim.ManagementConfig())

	for _, rule := range review.Status.ResourceRules {
		verbs := slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v != "get" && v != "list" && v != "watch" && v != "*" })
		if len(verbs) == 0 {
			continue
		}
		for _, group := range rule.APIGroups {
			for _, name := range rule.Resources {
				for _, res := range served[group] {
					if name != "*" && name != res.Name {
						continue
					}
					gvr := schema.GroupVersionResource{Group: group, Version: res.Version, Resource: res.Name}
					row := readable{resource: res.Name + "." + group, verbs: strings.Join(verbs, ",")}
					if len(rule.ResourceNames) > 0 {
						row.resource += " " + strings.Join(rule.ResourceNames, ",")
					}
					seen, scopes := map[string]bool{}, map[string]bool{}
					// read records what one request returned, and where.
					read := func(what, scope string, obj any, names []string, err error) {
						if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
							return
						}
						if err != nil {
							t.Errorf("%s as %s: %v", what, identity, err)
							return
						}
						raw, _ := json.Marshal(obj)
						row.bytes += len(raw)
						scopes[scope] = true
						for _, n := range names {
							seen[n] = true
						}
						for _, tok := range tokens {
							_, secret, _ := strings.Cut(tok, ".")
							if strings.Contains(string(raw), tok) || secret != "" && strings.Contains(string(raw), secret) {
								whose := "one the bootstrap provider made"
								if tok == canaryToken {
									whose = "the canary's"
								}
								row.token = true
								leaked = append(leaked, what+" holds "+whose)
							}
						}
					}
					names := func(l *unstructured.UnstructuredList) []string {
						var out []string
						for _, o := range l.Items {
							out = append(out, o.GetNamespace()+"/"+o.GetName())
						}
						return out
					}
					if slices.ContainsFunc(verbs, func(v string) bool { return v == "list" || v == "watch" || v == "*" }) {
						if res.Namespaced {
							l, err := asDynamic.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
							read("list "+gvr.Resource+" in "+ns, "namespace "+ns, l, namesOf(l, err, names), err)
						}
						l, err := asDynamic.Resource(gvr).List(ctx, metav1.ListOptions{})
						scope := "all namespaces"
						if !res.Namespaced {
							scope = "cluster"
						}
						read("list "+gvr.Resource+" in all namespaces", scope, l, namesOf(l, err, names), err)
					}
					if slices.Contains(verbs, "get") || slices.Contains(verbs, "*") {
						// Every object of the namespace, or those the rule
						// names wherever they are.
						var all *unstructured.UnstructuredList
						var err error
						if res.Namespaced && len(rule.ResourceNames) == 0 {
							all, err = adminDynamic.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
						} else {
							all, err = adminDynamic.Resource(gvr).List(ctx, metav1.ListOptions{})
						}
						if err != nil {
							t.Fatal(err)
						}
						for _, o := range all.Items {
							if len(rule.ResourceNames) > 0 && !slices.Contains(rule.ResourceNames, o.GetName()) {
								continue
							}
							var got *unstructured.Unstructured
							scope := "cluster"
							if res.Namespaced {
								scope = "namespace " + o.GetNamespace()
								got, err = asDynamic.Resource(gvr).Namespace(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{})
							} else {
								got, err = asDynamic.Resource(gvr).Get(ctx, o.GetName(), metav1.GetOptions{})
							}
							read("get "+gvr.Resource+" "+o.GetNamespace()+"/"+o.GetName(), scope, got, []string{o.GetNamespace() + "/" + o.GetName()}, err)
						}
					}
					row.objects = len(seen)
					row.scope = strings.Join(slices.Sorted(maps.Keys(scopes)), "; ")
					rows = append(rows, row)
				}
			}
		}
	}
	// The ClusterRole and the Role may grant the same (list machines): one
	// row each is the same reading twice.
	sort.Slice(rows, func(i, j int) bool { return rows[i].resource < rows[j].resource })
	return slices.Compact(rows), leaked
}

// servedResource is a resource the API server serves, at its preferred
// version; subresources are left out (reading one reads its object).
type servedResource struct {
	Name, Version string
	Namespaced    bool
}

func servedResources(t *testing.T, cfg *rest.Config) map[string][]servedResource {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lists, err := dc.ServerPreferredResources()
	if err != nil && len(lists) == 0 {
		t.Fatal(err)
	}
	out := map[string][]servedResource{}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") {
				out[gv.Group] = append(out[gv.Group], servedResource{Name: r.Name, Version: gv.Version, Namespaced: r.Namespaced})
			}
		}
	}
	return out
}

// namesOf names the objects of a list that was read, none of one refused.
func namesOf(l *unstructured.UnstructuredList, err error, names func(*unstructured.UnstructuredList) []string) []string {
	if err != nil {
		return nil
	}
	return names(l)
}

// formatReadable is the table of what an identity can read.
func formatReadable(rows []readable) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "RESOURCE\tVERBS\tSCOPE\tOBJECTS READ\tBYTES\tNODE-JOIN TOKEN")
	for _, r := range rows {
		token := "none"
		if r.token {
			token = "FOUND"
		}
		scope := r.scope
		if scope == "" {
			scope = "- (nothing there to read)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\n", r.resource, r.verbs, scope, r.objects, r.bytes, token)
	}
	_ = w.Flush()
	return b.String()
}
