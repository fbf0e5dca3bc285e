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

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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
