package readiness

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// apisMetricsText is a piece of an API server's /metrics: the gauge among
// other families, with a help text holding quotes and escapes a naive line
// split would trip on, and a series reset to 0.
const apisMetricsText = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, "dry run" value.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 42
# HELP apiserver_requested_deprecated_apis [STABLE] Gauge of deprecated APIs that have been requested, broken out by API group, version, resource, subresource, and removed_release.
# TYPE apiserver_requested_deprecated_apis gauge
apiserver_requested_deprecated_apis{group="flowcontrol.apiserver.k8s.io",removed_release="1.32",resource="flowschemas",subresource="",version="v1beta3"} 1
apiserver_requested_deprecated_apis{group="",removed_release="",resource="componentstatuses",subresource="",version="v1"} 1
apiserver_requested_deprecated_apis{group="resource.k8s.io",removed_release="1.39",resource="deviceclasses",subresource="",version="v1beta1"} 1
apiserver_requested_deprecated_apis{group="apps",removed_release="1.16",resource="deployments",subresource="scale",version="v1beta2"} 0
# HELP etcd_request_duration_seconds [ALPHA] Etcd request latency in seconds for each operation and object type.
# TYPE etcd_request_duration_seconds histogram
etcd_request_duration_seconds_bucket{operation="get",type="a\"quoted\\type",le="0.005"} 3
etcd_request_duration_seconds_bucket{operation="get",type="a\"quoted\\type",le="+Inf"} 4
etcd_request_duration_seconds_sum{operation="get",type="a\"quoted\\type"} 0.01
etcd_request_duration_seconds_count{operation="get",type="a\"quoted\\type"} 4
`

func TestRemovedAPIsParseMetrics(t *testing.T) {
	got, err := parseRequestedDeprecatedAPIs(strings.NewReader(apisMetricsText))
	if err != nil {
		t.Fatal(err)
	}
	want := []requestedAPI{
		{Group: "flowcontrol.apiserver.k8s.io", Version: "v1beta3", Resource: "flowschemas", RemovedRelease: "1.32"},
		{Group: "resource.k8s.io", Version: "v1beta1", Resource: "deviceclasses", RemovedRelease: "1.39"},
		{Group: "", Version: "v1", Resource: "componentstatuses"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("parsed\n%+v\nwant\n%+v", got, want)
	}
	if s := got[2].String(); s != "v1 componentstatuses" {
		t.Errorf("core group API named %q", s)
	}
	if s := (requestedAPI{Group: "apps", Version: "v1beta2", Resource: "deployments", Subresource: "scale"}).String(); s != "apps/v1beta2 deployments/scale" {
		t.Errorf("subresource named %q", s)
	}
}

func TestRemovedAPIsParseNoSeriesAndBadInput(t *testing.T) {
	// A gauge vector with no series is not exposed: nothing was requested.
	got, err := parseRequestedDeprecatedAPIs(strings.NewReader("# TYPE up gauge\nup 1\n"))
	if err != nil || got != nil {
		t.Fatalf("without the family: %v, %v; want nothing", got, err)
	}
	if _, err := parseRequestedDeprecatedAPIs(strings.NewReader("<html>not metrics</html>\n")); err == nil {
		t.Fatal("an HTML page parsed as metrics")
	}
}

func TestRemovedAPIsLifecyclesFromScheme(t *testing.T) {
	l := apisBuiltinLifecycles()
	fs := schema.GroupVersionKind{Group: "flowcontrol.apiserver.k8s.io", Version: "v1beta3", Kind: "FlowSchema"}
	lc, ok := l[fs]
	if !ok {
		t.Fatalf("%v missing from the lifecycle table (%d kinds)", fs, len(l))
	}
	if lc.RemovedMajor != 1 || lc.RemovedMinor != 32 {
		t.Errorf("%v removed in %d.%d, want 1.32", fs, lc.RemovedMajor, lc.RemovedMinor)
	}
	if want := (schema.GroupVersionKind{Group: "flowcontrol.apiserver.k8s.io", Version: "v1", Kind: "FlowSchema"}); lc.Replacement != want {
		t.Errorf("%v replaced by %v, want %v", fs, lc.Replacement, want)
	}
	// GA kinds have no removal: they must not be in the table.
	for _, ga := range []schema.GroupVersionKind{{Group: "apps", Version: "v1", Kind: "Deployment"}, {Version: "v1", Kind: "Pod"}} {
		if _, ok := l[ga]; ok {
			t.Errorf("GA kind %v in the removal table", ga)
		}
	}
	// The kind of a resource the metric names is found by its plural when
	// discovery did not list it.
	if gvk, ok := l.kindOf(fs.GroupVersion(), "flowschemas", nil); !ok || gvk != fs {
		t.Errorf("kind of flowschemas: %v %v", gvk, ok)
	}
}

// apisTestTable is a lifecycle table whose removals sit around v1.37, so
// the cases below fail on an off-by-one minor comparison.
var apisTestTable = apiLifecycles{
	{Group: "example.k8s.io", Version: "v1beta1", Kind: "Widget"}:    {RemovedMajor: 1, RemovedMinor: 37, Replacement: schema.GroupVersionKind{Group: "example.k8s.io", Version: "v1", Kind: "Widget"}},
	{Group: "example.k8s.io", Version: "v1beta1", Kind: "Gadget"}:    {RemovedMajor: 1, RemovedMinor: 38},
	{Group: "example.k8s.io", Version: "v1alpha1", Kind: "Sprocket"}: {RemovedMajor: 1, RemovedMinor: 36},
}

var apisTestServed = []servedGroupVersion{
	{GroupVersion: schema.GroupVersion{Version: "v1"}, Resources: map[string]string{"pods": "Pod"}},
	{GroupVersion: schema.GroupVersion{Group: "example.k8s.io", Version: "v1"}, Resources: map[string]string{"widgets": "Widget"}},
	{GroupVersion: schema.GroupVersion{Group: "example.k8s.io", Version: "v1beta1"}, Resources: map[string]string{"widgets": "Widget", "gadgets": "Gadget"}},
}

func apisV(s string) semver.Version { return semver.MustParse(s) }

func TestRemovedAPIsRequestedAgainstTarget(t *testing.T) {
	for _, tc := range []struct {
		removed, target string
		want            Result
	}{
		{"1.37", "1.37.0", Block}, // removed in the target's own minor
		{"1.36", "1.37.2", Block},
		{"1.38", "1.37.9", Pass}, // removed one minor after the target
		{"1.37", "1.36.5", Pass},
		{"1.40", "2.0.0", Block}, // a major above removes every 1.x removal
		{"2.0", "1.99.0", Pass},
	} {
		in := removedAPIsInput{
			Target:     apisV(tc.target),
			Requested:  []requestedAPI{{Group: "example.k8s.io", Version: "v1beta9", Resource: "doodads", RemovedRelease: tc.removed}},
			Lifecycles: apiLifecycles{},
		}
		if got := judgeRemovedAPIs(in); got.Result != tc.want {
			t.Errorf("requested, removed in %s, target %s: %s (%s), want %s", tc.removed, tc.target, got.Result, got.Found, tc.want)
		}
	}
}

func TestRemovedAPIsRequestedBlockNamesReplacementAndCallers(t *testing.T) {
	in := removedAPIsInput{
		Target: apisV("1.37.0"),
		Requested: []requestedAPI{
			{Group: "example.k8s.io", Version: "v1beta1", Resource: "widgets", RemovedRelease: "1.37"},
			{Group: "example.k8s.io", Version: "v1beta1", Resource: "gadgets", RemovedRelease: "1.38"},
		},
		Served:     apisTestServed,
		Lifecycles: apisTestTable,
	}
	f := judgeRemovedAPIs(in)
	if f.Result != Block {
		t.Fatalf("result %s, want block: %s", f.Result, f.Found)
	}
	for _, want := range []string{"example.k8s.io/v1beta1 widgets (removed in v1.37)", "v1.37 removes"} {
		if !strings.Contains(f.Found, want) {
			t.Errorf("found %q lacks %q", f.Found, want)
		}
	}
	if strings.Contains(f.Found, "gadgets") {
		t.Errorf("found names gadgets, removed only in v1.38: %q", f.Found)
	}
	for _, want := range []string{"to example.k8s.io/v1 Widget", "audit log", "kubectl get --raw /metrics | grep apiserver_requested_deprecated_apis"} {
		if !strings.Contains(f.Do, want) {
			t.Errorf("do %q lacks %q", f.Do, want)
		}
	}
	// Requested and served: it blocks once, it is not warned of again.
	if strings.Contains(f.Found, "served and removed") {
		t.Errorf("a requested API is also reported as only served: %q", f.Found)
	}
}

func TestRemovedAPIsServedAgainstTarget(t *testing.T) {
	served := []servedGroupVersion{
		{GroupVersion: schema.GroupVersion{Group: "example.k8s.io", Version: "v1beta1"}, Resources: map[string]string{"widgets": "Widget", "gadgets": "Gadget"}},
	}
	for _, tc := range []struct {
		target string
		want   Result
		names  []string
		absent []string
	}{
		{"1.36.0", Pass, nil, []string{"widgets", "gadgets"}},
		{"1.37.0", Warn, []string{"widgets (removed in v1.37)"}, []string{"gadgets"}},
		{"1.38.1", Warn, []string{"widgets (removed in v1.37)", "gadgets (removed in v1.38)"}, nil},
	} {
		f := judgeRemovedAPIs(removedAPIsInput{Target: apisV(tc.target), Served: served, Lifecycles: apisTestTable})
		if f.Result != tc.want {
			t.Errorf("target %s: %s (%s), want %s", tc.target, f.Result, f.Found, tc.want)
			continue
		}
		for _, n := range tc.names {
			if !strings.Contains(f.Found, n) {
				t.Errorf("target %s: found %q lacks %q", tc.target, f.Found, n)
			}
		}
		for _, n := range tc.absent {
			if strings.Contains(f.Found, n) {
				t.Errorf("target %s: found %q names %q", tc.target, f.Found, n)
			}
		}
		if tc.want == Warn && (!strings.Contains(f.Found, "not requested since the API server") || !strings.Contains(f.Do, "widgets to example.k8s.io/v1 Widget")) {
			t.Errorf("target %s: the warning does not say why it is only a warning, or where to move: %q / %q", tc.target, f.Found, f.Do)
		}
	}
}

func TestRemovedAPIsPassSaysWhatWasLookedAt(t *testing.T) {
	f := judgeRemovedAPIs(removedAPIsInput{Target: apisV("1.37.0"), Served: apisTestServed[:2], Lifecycles: apisTestTable})
	want := "no deprecated API requested since the API server that answered started; 2 served group-versions, none removed by v1.37"
	if f.Result != Pass || f.Found != want || f.Do != "" {
		t.Fatalf("got %s %q do %q; want pass %q", f.Result, f.Found, f.Do, want)
	}
	f = judgeRemovedAPIs(removedAPIsInput{
		Target:     apisV("1.37.0"),
		Requested:  []requestedAPI{{Group: "example.k8s.io", Version: "v1beta1", Resource: "gadgets", RemovedRelease: "1.38"}},
		Served:     apisTestServed[:2],
		Lifecycles: apisTestTable,
	})
	if f.Result != Pass || !strings.Contains(f.Found, "requested and removed later: example.k8s.io/v1beta1 gadgets (removed in v1.38)") {
		t.Fatalf("a requested API removed after the target: %s %q", f.Result, f.Found)
	}
}

func TestRemovedAPIsReadsThatFailed(t *testing.T) {
	served := []servedGroupVersion{{GroupVersion: schema.GroupVersion{Group: "example.k8s.io", Version: "v1beta1"}, Resources: map[string]string{"widgets": "Widget"}}}
	forbidden := errors.New(`forbidden: User "x" cannot get path "/metrics"`)

	// /metrics unreadable: what is served and removed cannot be known unused.
	f := judgeRemovedAPIs(removedAPIsInput{Target: apisV("1.37.0"), RequestedErr: forbidden, Served: served, Lifecycles: apisTestTable})
	if f.Result != Warn || !strings.Contains(f.Found, "not known whether requested") || !strings.Contains(f.Found, "/metrics") {
		t.Errorf("metrics unreadable: %s %q", f.Result, f.Found)
	}
	// Nothing served is removed, but requests were not seen: never a pass.
	f = judgeRemovedAPIs(removedAPIsInput{Target: apisV("1.36.0"), RequestedErr: forbidden, Served: served, Lifecycles: apisTestTable})
	if f.Result != Warn || !strings.Contains(f.Found, "requests not checked") {
		t.Errorf("metrics unreadable, nothing served removed: %s %q", f.Result, f.Found)
	}
	// A group discovery could not read is named.
	f = judgeRemovedAPIs(removedAPIsInput{Target: apisV("1.36.0"), Served: served, ServedFailed: []schema.GroupVersion{{Group: "metrics.k8s.io", Version: "v1beta1"}}, Lifecycles: apisTestTable})
	if f.Result != Warn || !strings.Contains(f.Found, "metrics.k8s.io/v1beta1") || !strings.Contains(f.Do, "APIService") {
		t.Errorf("discovery partly failed: %s %q / %q", f.Result, f.Found, f.Do)
	}
	// Discovery failed whole, requests read and blocking: the block stands.
	f = judgeRemovedAPIs(removedAPIsInput{
		Target:     apisV("1.37.0"),
		Requested:  []requestedAPI{{Group: "example.k8s.io", Version: "v1beta1", Resource: "widgets", RemovedRelease: "1.37"}},
		ServedErr:  errors.New("timeout"),
		Lifecycles: apisTestTable,
	})
	if f.Result != Block || !strings.Contains(f.Found, "served group-versions not checked") || !strings.Contains(f.Do, "example.k8s.io/v1 Widget") {
		t.Errorf("discovery failed, a removed API requested: %s %q / %q", f.Result, f.Found, f.Do)
	}
	// Nothing read at all.
	f = judgeRemovedAPIs(removedAPIsInput{Target: apisV("1.37.0"), RequestedErr: forbidden, ServedErr: errors.New("timeout"), Lifecycles: apisTestTable})
	if f.Result != Warn || !strings.HasPrefix(f.Found, "not checked:") {
		t.Errorf("nothing read: %s %q", f.Result, f.Found)
	}
}

func TestRemovedAPIsServedFromDiscovery(t *testing.T) {
	got := apisServedFrom([]*metav1.APIResourceList{
		{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{{Name: "deployments", Kind: "Deployment"}, {Name: "deployments/scale", Kind: "Scale"}}},
		nil,
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods", Kind: "Pod"}}},
	})
	if len(got) != 2 || got[0].GroupVersion != (schema.GroupVersion{Group: "apps", Version: "v1"}) || len(got[0].Resources) != 1 || got[0].Resources["deployments"] != "Deployment" || got[1].GroupVersion != (schema.GroupVersion{Version: "v1"}) {
		t.Fatalf("served: %+v", got)
	}
}

// The real table and the metric agree on a real removal: a client calling
// flowcontrol v1beta3 blocks an upgrade to v1.32 and not one to v1.31.
func TestRemovedAPIsRealLifecycleData(t *testing.T) {
	requested, err := parseRequestedDeprecatedAPIs(strings.NewReader(apisMetricsText))
	if err != nil {
		t.Fatal(err)
	}
	served := []servedGroupVersion{{GroupVersion: schema.GroupVersion{Group: "flowcontrol.apiserver.k8s.io", Version: "v1beta3"}, Resources: map[string]string{"flowschemas": "FlowSchema", "prioritylevelconfigurations": "PriorityLevelConfiguration"}}}
	f := judgeRemovedAPIs(removedAPIsInput{Target: apisV("1.32.0"), Requested: requested, Served: served, Lifecycles: apisBuiltinLifecycles()})
	if f.Result != Block || !strings.Contains(f.Do, "flowcontrol.apiserver.k8s.io/v1 FlowSchema") {
		t.Fatalf("v1.32: %s %q / %q", f.Result, f.Found, f.Do)
	}
	// prioritylevelconfigurations is served and removed, but not requested.
	if !strings.Contains(f.Found, "prioritylevelconfigurations (removed in v1.32)") {
		t.Errorf("v1.32: served, unrequested removal not named: %q", f.Found)
	}
	f = judgeRemovedAPIs(removedAPIsInput{Target: apisV("1.31.4"), Requested: requested, Served: served, Lifecycles: apisBuiltinLifecycles()})
	if f.Result != Pass {
		t.Fatalf("v1.31: %s %q", f.Result, f.Found)
	}
}

// The check's reads against an API server on loopback: /metrics asked for
// in the text format, discovery walked, both judged together.
func TestRemovedAPIsReadsAnAPIServer(t *testing.T) {
	var accept string
	mux := http.NewServeMux()
	reply := func(path, body string) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body)
		})
	}
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		accept = r.Header.Get("Accept")
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, apisMetricsText)
	})
	reply("/api", `{"kind":"APIVersions","versions":["v1"]}`)
	reply("/apis", `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"flowcontrol.apiserver.k8s.io","versions":[{"groupVersion":"flowcontrol.apiserver.k8s.io/v1","version":"v1"},{"groupVersion":"flowcontrol.apiserver.k8s.io/v1beta3","version":"v1beta3"}],"preferredVersion":{"groupVersion":"flowcontrol.apiserver.k8s.io/v1","version":"v1"}}]}`)
	reply("/api/v1", `{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"pods","namespaced":true,"kind":"Pod","verbs":["get","list"]},{"name":"pods/status","namespaced":true,"kind":"Pod","verbs":["get"]}]}`)
	reply("/apis/flowcontrol.apiserver.k8s.io/v1", `{"kind":"APIResourceList","groupVersion":"flowcontrol.apiserver.k8s.io/v1","resources":[{"name":"flowschemas","namespaced":false,"kind":"FlowSchema","verbs":["get","list"]}]}`)
	reply("/apis/flowcontrol.apiserver.k8s.io/v1beta3", `{"kind":"APIResourceList","groupVersion":"flowcontrol.apiserver.k8s.io/v1beta3","resources":[{"name":"flowschemas","namespaced":false,"kind":"FlowSchema","verbs":["get","list"]},{"name":"prioritylevelconfigurations","namespaced":false,"kind":"PriorityLevelConfiguration","verbs":["get","list"]}]}`)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	cfg := &rest.Config{Host: srv.URL}
	c := &Cluster{Target: apisV("1.32.0"), Workload: &workload.Client{Config: cfg, Kube: kubernetes.NewForConfigOrDie(cfg)}}
	f := removedAPIs(context.Background(), c)
	if accept != "text/plain;version=0.0.4" {
		t.Errorf("/metrics asked with Accept %q", accept)
	}
	if f.Result != Block ||
		!strings.Contains(f.Found, "flowcontrol.apiserver.k8s.io/v1beta3 flowschemas (removed in v1.32)") ||
		!strings.Contains(f.Found, "served and removed by v1.32, not requested since the API server that answered started: flowcontrol.apiserver.k8s.io/v1beta3 prioritylevelconfigurations (removed in v1.32)") ||
		!strings.Contains(f.Do, "to flowcontrol.apiserver.k8s.io/v1 FlowSchema") {
		t.Errorf("got %s %q / %q", f.Result, f.Found, f.Do)
	}

	c.Target = apisV("1.31.0")
	if f = removedAPIs(context.Background(), c); f.Result != Pass || !strings.Contains(f.Found, "3 served group-versions, none removed by v1.31") {
		t.Errorf("v1.31: %s %q", f.Result, f.Found)
	}
}
