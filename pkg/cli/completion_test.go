package cli

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// fakeManagement is a management cluster's API server that serves the lists
// completion makes, Clusters and Machines, in one namespace or all, with
// label selectors applied as the API server applies them. It counts requests.
type fakeManagement struct {
	*httptest.Server
	requests atomic.Int32
}

func newFakeManagement(t *testing.T, objects ...metav1.Object) *fakeManagement {
	t.Helper()
	f := &fakeManagement{}
	list := regexp.MustCompile(`^/apis/cluster\.x-k8s\.io/v1beta2/(?:namespaces/([^/]+)/)?(clusters|machines)$`)
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		m := list.FindStringSubmatch(r.URL.Path)
		if m == nil {
			http.NotFound(w, r)
			return
		}
		selector, err := labels.Parse(r.URL.Query().Get("labelSelector"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		items := []any{}
		for _, o := range objects {
			_, isCluster := o.(*clusterv1.Cluster)
			if isCluster != (m[2] == "clusters") || (m[1] != "" && o.GetNamespace() != m[1]) || !selector.Matches(labels.Set(o.GetLabels())) {
				continue
			}
			items = append(items, o)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"kind": "List", "apiVersion": "v1", "metadata": map[string]any{}, "items": items})
	}))
	t.Cleanup(f.Close)
	return f
}

func kcpCluster(namespace, name string) *clusterv1.Cluster {
	return &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: clusterv1.ClusterSpec{ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: name + "-cp"}}}
}

func machine(namespace, name, cluster string, controlPlane bool) *clusterv1.Machine {
	l := map[string]string{clusterv1.ClusterNameLabel: cluster}
	if controlPlane {
		l[clusterv1.MachineControlPlaneLabel] = ""
	}
	return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: l}}
}

// useManagement isolates the test and points its kubeconfig at server:
// context "capi" (current) in namespace capi, "staging" in namespace
// staging. It returns where the config file goes.
func useManagement(t *testing.T, server string) string {
	t.Helper()
	config := isolate(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: mgmt
  cluster: {server: %q}
users:
- name: me
  user: {}
contexts:
- name: capi
  context: {cluster: mgmt, user: me, namespace: capi}
- name: staging
  context: {cluster: mgmt, user: me, namespace: staging}
current-context: capi
`, server)
	if err := os.WriteFile(kubeconfig, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	return config
}

// complete runs cobra's __complete as the shell scripts and kubectl's
// plugin helper do, and returns what it offers. The directive must say
// "no file names", whatever was offered, and nothing but cobra's own line
// may reach stderr.
func complete(t *testing.T, args ...string) []string {
	t.Helper()
	r := run(t, append([]string{"__complete"}, args...)...)
	if r.err != nil {
		t.Fatalf("__complete %q: %v", args, r.err)
	}
	lines := strings.Split(strings.TrimSuffix(r.out, "\n"), "\n")
	if last := lines[len(lines)-1]; last != ":4" {
		t.Errorf("__complete %q: directive %s, want :4 (no file names)", args, last)
	}
	if r.log != "Completion ended with directive: ShellCompDirectiveNoFileComp\n" {
		t.Errorf("__complete %q wrote to stderr: %q", args, r.log)
	}
	return lines[:len(lines)-1]
}

func fleetOfTwoNamespaces() []metav1.Object {
	other := kcpCluster("capi", "talos-1")
	other.Spec.ControlPlaneRef.Kind, other.Spec.ControlPlaneRef.APIGroup = "TalosControlPlane", "controlplane.cluster.x-k8s.io"
	return []metav1.Object{
		kcpCluster("capi", "prod-eu1"), kcpCluster("capi", "prod-us1"), other, kcpCluster("staging", "stage-1"),
		machine("capi", "prod-eu1-cp-b", "prod-eu1", true), machine("capi", "prod-eu1-cp-a", "prod-eu1", true),
		machine("capi", "prod-eu1-md-x", "prod-eu1", false), machine("capi", "prod-us1-cp-a", "prod-us1", true),
		machine("staging", "stage-1-cp-a", "stage-1", true),
	}
}

// TestCompletionOffersClusters: every verb that takes CLUSTER offers the
// Clusters with a KubeadmControlPlane in the context's namespace, or -n's,
// or the one the config file names, from one request; with -l or -A, which
// the verbs take instead of a name, nothing and no request.
func TestCompletionOffersClusters(t *testing.T) {
	api := newFakeManagement(t, fleetOfTwoNamespaces()...)
	config := useManagement(t, api.URL)
	capi := []string{"prod-eu1", "prod-us1"}
	for _, verb := range []string{"upgrade", "scale", "replace", "rollout", "restart", "pause", "plan", "status", "handback", "rbac"} {
		if got := complete(t, verb, ""); !slices.Equal(got, capi) {
			t.Errorf("%s <TAB>: %q, want %q", verb, got, capi)
		}
	}
	before := api.requests.Load()
	if got := complete(t, "upgrade", "prod-u"); !slices.Equal(got, []string{"prod-us1"}) {
		t.Errorf("upgrade prod-u<TAB>: %q", got)
	}
	if n := api.requests.Load() - before; n != 1 {
		t.Errorf("completing a cluster made %d requests, want 1", n)
	}
	for _, args := range [][]string{{"status", "-n", "staging", ""}, {"status", "--context", "staging", ""}} {
		if got := complete(t, args...); !slices.Equal(got, []string{"stage-1"}) {
			t.Errorf("%q: %q, want [stage-1]", args, got)
		}
	}
	before = api.requests.Load()
	for _, args := range [][]string{{"status", "-A", ""}, {"upgrade", "-l", "env=prod", ""}, {"status", "prod-eu1", ""}} {
		if got := complete(t, args...); len(got) != 0 {
			t.Errorf("%q: %q, want nothing", args, got)
		}
	}
	if n := api.requests.Load() - before; n != 0 {
		t.Errorf("completing where no CLUSTER goes made %d requests", n)
	}
	writeConfig(t, config, "context: staging\n")
	if got := complete(t, "upgrade", ""); !slices.Equal(got, []string{"stage-1"}) {
		t.Errorf("upgrade <TAB> with context: staging in the config file: %q, want [stage-1]", got)
	}
}

// TestCompletionOffersTheClustersMachines: replace's MACHINE, and plan's
// --replace, are the named cluster's control-plane Machines only.
func TestCompletionOffersTheClustersMachines(t *testing.T) {
	api := newFakeManagement(t, fleetOfTwoNamespaces()...)
	useManagement(t, api.URL)
	want := []string{"prod-eu1-cp-a", "prod-eu1-cp-b"}
	for _, args := range [][]string{{"replace", "prod-eu1", ""}, {"plan", "prod-eu1", "--replace", ""}} {
		if got := complete(t, args...); !slices.Equal(got, want) {
			t.Errorf("%q: %q, want %q", args, got, want)
		}
	}
	if got := complete(t, "replace", "-n", "staging", "stage-1", ""); !slices.Equal(got, []string{"stage-1-cp-a"}) {
		t.Errorf("replace -n staging stage-1 <TAB>: %q", got)
	}
	if got := complete(t, "replace", "prod-eu1", "prod-eu1-cp-a", ""); len(got) != 0 {
		t.Errorf("a third argument to replace: %q, want nothing", got)
	}
}

// TestCompletionOffersContextsAndNamespaces: --context from the kubeconfig;
// -n the namespaces that hold a Cluster with a KubeadmControlPlane.
func TestCompletionOffersContextsAndNamespaces(t *testing.T) {
	api := newFakeManagement(t, fleetOfTwoNamespaces()...)
	useManagement(t, api.URL)
	if got := complete(t, "status", "--context", ""); !slices.Equal(got, []string{"capi", "staging"}) {
		t.Errorf("--context <TAB>: %q", got)
	}
	for _, flag := range []string{"-n", "--namespace"} {
		if got := complete(t, "upgrade", flag, ""); !slices.Equal(got, []string{"capi", "staging"}) {
			t.Errorf("%s <TAB>: %q", flag, got)
		}
	}
}

// TestCompletionOffersEachVerbsOutputs: -o offers exactly what the verb's
// Validate accepts, as its refusal of another value lists them.
func TestCompletionOffersEachVerbsOutputs(t *testing.T) {
	isolate(t)
	allowed := regexp.MustCompile(`--output must be one of (.*), not "xml"`)
	for _, args := range [][]string{
		{"upgrade", "demo", "--version", "v1.36.3"}, {"scale", "demo", "--replicas", "3"}, {"replace", "demo", "m"},
		{"rollout", "demo"}, {"restart", "demo"}, {"plan", "demo", "--restart"}, {"status", "demo"}, {"handback", "demo"}, {"version"},
	} {
		got := complete(t, append(slices.Clone(args[:1]), "-o", "")...)
		r := run(t, append(args, "-o", "xml")...)
		m := allowed.FindStringSubmatch(fmt.Sprint(r.err))
		if m == nil {
			t.Errorf("%s -o xml: %v, want the refusal listing what -o takes", args[0], r.err)
			continue
		}
		if want := strings.Split(m[1], ", "); !slices.Equal(got, want) {
			t.Errorf("%s -o <TAB>: %q, but it accepts %q", args[0], got, want)
		}
	}
}

// TestCompletionOfATemplatedOutput: a value of -o that takes a template
// after its "=" is completed without the shell's space after it when it is
// all that is offered, so that the template follows.
func TestCompletionOfATemplatedOutput(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		prefix, want string
	}{
		{"custom", "custom-columns=\n:6\n"},    // no space, no file names
		{"js", "json\njsonpath=\n:4\n"},        // json is a whole value
		{"go-template=", "go-template=\n:6\n"}, // the template is the user's
		{"w", "wide\n:4\n"},
	} {
		r := run(t, "__complete", "status", "demo", "-o", tc.prefix)
		if r.err != nil || r.out != tc.want {
			t.Errorf("status -o %s<TAB>: %q (%v), want %q", tc.prefix, r.out, r.err, tc.want)
		}
	}
}

// TestCompletionWithoutTheManagementCluster: a refused connection offers
// nothing at once; a server that never answers, nothing once
// completionTimeout has passed. Neither prints anything (complete checks).
func TestCompletionWithoutTheManagementCluster(t *testing.T) {
	isolate(t) // a kubeconfig naming 127.0.0.1:1, where nothing listens
	start := time.Now()
	if got := complete(t, "upgrade", ""); len(got) != 0 {
		t.Errorf("refused: offered %q", got)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("refused: took %s", took)
	}

	useManagement(t, "http://"+silentServer(t))
	defer func(d time.Duration) { completionTimeout = d }(completionTimeout)
	completionTimeout = 300 * time.Millisecond
	start = time.Now()
	for _, args := range [][]string{{"upgrade", ""}, {"replace", "prod-eu1", ""}, {"status", "-n", ""}} {
		if got := complete(t, args...); len(got) != 0 {
			t.Errorf("%q, silent server: offered %q", args, got)
		}
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("silent server: three completions took %s", took)
	}
}

// fakeObjects is a management cluster's API server that serves the objects
// at their paths (GETs of one object, discovery documents, lists), and 404
// elsewhere. It counts requests.
type fakeObjects struct {
	*httptest.Server
	requests atomic.Int32
}

func newFakeObjects(t *testing.T, objects map[string]any) *fakeObjects {
	t.Helper()
	f := &fakeObjects{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		o, ok := objects[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(o)
	}))
	t.Cleanup(f.Close)
	return f
}

// upgradeableFleet is, in namespace capi: prod-eu1, a ClusterClass cluster
// whose class declares three versions, its KubeadmControlPlane at v1.35.2
// and made from DockerMachineTemplates; plain-1, at v1.34.4, without a
// topology; orphan-1, whose class cannot be read. The infrastructure group
// serves its templates and machines, and the namespace holds two templates.
func upgradeableFleet() map[string]any {
	const cp, infra = "/apis/controlplane.cluster.x-k8s.io/v1beta2/namespaces/capi/kubeadmcontrolplanes/", "/apis/infrastructure.cluster.x-k8s.io"
	objects := map[string]any{
		"/apis/cluster.x-k8s.io/v1beta2/namespaces/capi/clusterclasses/quick-start": &clusterv1.ClusterClass{
			Spec: clusterv1.ClusterClassSpec{KubernetesVersions: []string{"v1.34.4", "v1.35.2", "v1.36.3"}}},
		infra: map[string]any{"kind": "APIGroup", "name": "infrastructure.cluster.x-k8s.io",
			"preferredVersion": map[string]any{"groupVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "version": "v1beta2"}},
		infra + "/v1beta2": map[string]any{"kind": "APIResourceList", "groupVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
			"resources": []map[string]any{
				{"name": "dockermachines", "kind": "DockerMachine", "namespaced": true, "singularName": "", "verbs": []string{"list"}},
				{"name": "dockermachinetemplates/status", "kind": "DockerMachineTemplate", "namespaced": true, "singularName": "", "verbs": []string{"get"}},
				{"name": "dockermachinetemplates", "kind": "DockerMachineTemplate", "namespaced": true, "singularName": "", "verbs": []string{"list"}},
			}},
		infra + "/v1beta2/namespaces/capi/dockermachinetemplates": map[string]any{"kind": "DockerMachineTemplateList", "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
			"metadata": map[string]any{}, "items": []map[string]any{{"metadata": map[string]any{"name": "prod-eu1-v1.36.3"}}, {"metadata": map[string]any{"name": "prod-eu1-v1.35.2"}}}},
		infra + "/v1beta2/namespaces/capi/dockermachines": map[string]any{"kind": "DockerMachineList", "metadata": map[string]any{},
			"items": []map[string]any{{"metadata": map[string]any{"name": "not-a-template"}}}},
	}
	for _, c := range []struct{ name, version, class string }{{"prod-eu1", "v1.35.2", "quick-start"}, {"plain-1", "v1.34.4", ""}, {"orphan-1", "v1.33.7", "gone"}} {
		cl := kcpCluster("capi", c.name)
		if c.class != "" {
			cl.Spec.Topology = clusterv1.Topology{ClassRef: clusterv1.ClusterClassRef{Name: c.class}, Version: c.version}
		}
		objects["/apis/cluster.x-k8s.io/v1beta2/namespaces/capi/clusters/"+c.name] = cl
		kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "capi", Name: c.name + "-cp"},
			Spec: controlplanev1.KubeadmControlPlaneSpec{Version: c.version}}
		kcp.Spec.MachineTemplate.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
			APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "DockerMachineTemplate", Name: c.name + "-" + c.version}
		objects[cp+c.name+"-cp"] = kcp
	}
	return objects
}

// TestCompletionOffersVersions: --version and --via offer the named
// cluster's KubeadmControlPlane's version and its ClusterClass's declared
// ones, oldest first; --via after a comma keeps what is typed and offers the
// rest. A class that cannot be read leaves the KubeadmControlPlane's; a
// cluster that cannot be read, or -l/-A, offers nothing.
func TestCompletionOffersVersions(t *testing.T) {
	api := newFakeObjects(t, upgradeableFleet())
	useManagement(t, api.URL)
	class := []string{"v1.34.4", "v1.35.2", "v1.36.3"}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"upgrade", "prod-eu1", "--version", ""}, class},
		{[]string{"plan", "prod-eu1", "--version", "v1.36"}, []string{"v1.36.3"}},
		{[]string{"check", "prod-eu1", "--version", ""}, class},
		{[]string{"upgrade", "prod-eu1", "--via", ""}, class},
		{[]string{"upgrade", "prod-eu1", "--via", "v1.34.4,"}, []string{"v1.34.4,v1.35.2", "v1.34.4,v1.36.3"}},
		{[]string{"plan", "prod-eu1", "--version", "v1.36.3", "--via", "v1.34.4,v1.35"}, []string{"v1.34.4,v1.35.2"}},
		{[]string{"upgrade", "plain-1", "--version", ""}, []string{"v1.34.4"}},
		{[]string{"upgrade", "orphan-1", "--version", ""}, []string{"v1.33.7"}},
		{[]string{"upgrade", "nosuch", "--version", ""}, nil},
		{[]string{"upgrade", "-n", "other", "prod-eu1", "--version", ""}, nil},
	} {
		if got := complete(t, tc.args...); !slices.Equal(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.args, got, tc.want)
		}
	}
	before := api.requests.Load()
	for _, args := range [][]string{{"upgrade", "-A", "--version", ""}, {"upgrade", "-l", "env=prod", "--via", ""}, {"upgrade", "--version", ""}} {
		if got := complete(t, args...); len(got) != 0 {
			t.Errorf("%q: %q, want nothing", args, got)
		}
	}
	if n := api.requests.Load() - before; n != 0 {
		t.Errorf("completing a version without one cluster made %d requests", n)
	}
}

// TestCompletionOffersInfrastructureTemplates: --infrastructure-template
// offers the templates of the kind the KubeadmControlPlane is made from, in
// its namespace, and nothing of another kind.
func TestCompletionOffersInfrastructureTemplates(t *testing.T) {
	api := newFakeObjects(t, upgradeableFleet())
	useManagement(t, api.URL)
	want := []string{"prod-eu1-v1.35.2", "prod-eu1-v1.36.3"}
	for _, args := range [][]string{
		{"upgrade", "prod-eu1", "--version", "v1.36.3", "--infrastructure-template", ""},
		{"plan", "prod-eu1", "--infrastructure-template", "prod"},
	} {
		if got := complete(t, args...); !slices.Equal(got, want) {
			t.Errorf("%q: %q, want %q", args, got, want)
		}
	}
	if got := complete(t, "upgrade", "prod-eu1", "--infrastructure-template", "prod-eu1-v1.36"); !slices.Equal(got, want[1:]) {
		t.Errorf("a prefix: %q", got)
	}
	if got := complete(t, "upgrade", "-A", "--infrastructure-template", ""); len(got) != 0 {
		t.Errorf("-A: %q, want nothing", got)
	}
}

// TestCompletionOffersEnumeratedValues: --on-failure and --max-surge offer
// the values their verbs accept, on every verb that has them, with what each
// does; -l offers nothing, and no file names either (complete checks the
// directive of each).
func TestCompletionOffersEnumeratedValues(t *testing.T) {
	isolate(t)
	values := func(lines []string) []string {
		for i, l := range lines {
			lines[i], _, _ = strings.Cut(l, "\t")
		}
		return lines
	}
	withFlag := func(name string) []string {
		var verbs []string
		for _, c := range NewRootCmd(genericiooptions.IOStreams{}).Commands() {
			if c.Flags().Lookup(name) != nil {
				verbs = append(verbs, c.Name())
			}
		}
		return verbs
	}
	for _, tc := range []struct {
		flag, typed string
		want        []string
	}{
		{"on-failure", "", []string{"stay", "handback"}},
		{"on-failure", "h", []string{"handback"}},
		{"max-surge", "", []string{"1", "0", "-1"}},
		{"max-surge", "0", []string{"0"}},
	} {
		verbs := withFlag(tc.flag)
		if len(verbs) < 5 {
			t.Fatalf("--%s is on %q only", tc.flag, verbs)
		}
		for _, verb := range verbs {
			if got := values(complete(t, verb, "demo", "--"+tc.flag, tc.typed)); !slices.Equal(got, tc.want) {
				t.Errorf("%s --%s %s<TAB>: %q, want %q", verb, tc.flag, tc.typed, got, tc.want)
			}
		}
	}
	// The values offered are the values accepted.
	for _, v := range []string{"stay", "handback"} {
		if reached, r := parseVerb(t, "upgrade", "demo", "--version", "v1.36.3", "--on-failure", v); !reached {
			t.Errorf("--on-failure %s refused: %v", v, r.err)
		}
	}
	for _, v := range []string{"1", "0", "-1"} {
		if reached, r := parseVerb(t, "upgrade", "demo", "--version", "v1.36.3", "--max-surge", v); !reached {
			t.Errorf("--max-surge %s refused: %v", v, r.err)
		}
	}
	for _, verb := range withFlag("selector") {
		if got := complete(t, verb, "-l", ""); len(got) != 0 {
			t.Errorf("%s -l <TAB>: %q, want nothing", verb, got)
		}
	}
}

// TestCompletionOffersSortFields: status --sort-by offers the fields of the
// rows it sorts, a machine's, or with -l/-A a cluster's, each one that
// sorting finds in such a row.
func TestCompletionOffersSortFields(t *testing.T) {
	isolate(t)
	machine := rollout.MachineStatus{Name: "m", Version: "v1.36.3", Node: "n", FailureDomain: "fd", Phase: "Running", UpToDate: true,
		Deleting: true, Created: time.Now(), Problem: "p", HealthCheck: "h", UpToDateUnknown: true}
	row := fleet.Row{Cluster: fleet.Cluster{Namespace: "ns", Name: "c"}, ControlPlane: "cp", Version: "v1.36.3", Replicas: 3,
		Machines: 3, UpToDate: 3, Paused: true, PausedByUs: true, Problem: "p"}
	for _, tc := range []struct {
		args []string
		row  any
		some []string
	}{
		{[]string{"status", "demo", "--sort-by", ""}, machine, []string{".name", ".created", ".failureDomain", ".version"}},
		{[]string{"status", "-A", "--sort-by", ""}, row, []string{".cluster", ".namespace", ".machines", ".version"}},
	} {
		got := complete(t, tc.args...)
		for _, f := range tc.some {
			if !slices.Contains(got, f) {
				t.Errorf("%q: %q lacks %s", tc.args, got, f)
			}
		}
		obj, err := jsonObject(tc.row)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range got {
			jp, err := relaxedJSONPath("sort-by", f)
			if err != nil {
				t.Errorf("%q offers %s, which --sort-by refuses: %v", tc.args, f, err)
				continue
			}
			if found, err := jp.FindResults(obj); err != nil || len(found) == 0 || len(found[0]) == 0 {
				t.Errorf("%q offers %s, which is not in a row's JSON %v", tc.args, f, obj)
			}
		}
	}
	if got := complete(t, "status", "demo", "--sort-by", ".fail"); !slices.Equal(got, []string{".failureDomain"}) {
		t.Errorf("--sort-by .fail<TAB>: %q", got)
	}
}
