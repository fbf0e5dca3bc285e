package readiness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/blang/semver/v4"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// The removed-apis check asks two questions of the workload cluster:
//
//   - Which deprecated APIs have clients called? The API server counts every
//     request to a deprecated version in its STABLE gauge
//     apiserver_requested_deprecated_apis, labelled with the release that
//     removes it. A client still calling one that the target removes breaks
//     the moment its API server is replaced: that blocks.
//   - Which group-versions does the cluster serve that the target removes?
//     Judged with Kubernetes' own lifecycle data (the generated
//     APILifecycleRemoved methods of k8s.io/api's types). Served but not seen
//     requested only warns: the gauge lives in the API server's memory, so it
//     knows nothing from before the API server's last start, nor what another
//     API server instance was asked; a CronJob or a controller that calls
//     weekly may simply not have called yet.

// apisDeprecatedMetric is the API server's gauge of requested deprecated
// APIs (k8s.io/apiserver's endpoints/metrics; STABLE, so its name and labels
// keep).
const apisDeprecatedMetric = "apiserver_requested_deprecated_apis"

// requestedAPI is one series of apiserver_requested_deprecated_apis: a
// deprecated API that a client requested since the API server started.
type requestedAPI struct {
	Group, Version, Resource, Subresource string
	// RemovedRelease is "<major>.<minor>", or "" for a deprecated API whose
	// removal is not planned.
	RemovedRelease string
}

func (r requestedAPI) groupVersion() schema.GroupVersion {
	return schema.GroupVersion{Group: r.Group, Version: r.Version}
}

// String names the API as kubectl's users know it: "apps/v1beta1
// deployments/scale", or "v1 componentstatuses" for the core group.
func (r requestedAPI) String() string {
	res := r.Resource
	if r.Subresource != "" {
		res += "/" + r.Subresource
	}
	return r.groupVersion().String() + " " + res
}

// parseRequestedDeprecatedAPIs reads the deprecated APIs requested from the
// API server's /metrics in Prometheus' text format, with Prometheus' own
// parser (already in the module graph through client-go's and
// component-base's metrics) rather than one of ours: the exposition format
// has escapes and quoting that a line split would get wrong.
func parseRequestedDeprecatedAPIs(r io.Reader) ([]requestedAPI, error) {
	// UTF-8 validation accepts every name the legacy scheme does: the parser
	// is told what names to accept, and an API server's metric names are not
	// ours to refuse.
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing the metrics: %w", err)
	}
	// No family means no deprecated API was requested: a gauge vector with
	// no series is not exposed at all.
	fam := families[apisDeprecatedMetric]
	if fam == nil {
		return nil, nil
	}
	var out []requestedAPI
	for _, m := range fam.GetMetric() {
		// The API server sets the gauge to 1 when requested; a 0 (a reset
		// series) does not say a client called.
		value := m.GetGauge().GetValue()
		if m.Gauge == nil {
			value = m.GetUntyped().GetValue()
		}
		if value == 0 {
			continue
		}
		var api requestedAPI
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "group":
				api.Group = l.GetValue()
			case "version":
				api.Version = l.GetValue()
			case "resource":
				api.Resource = l.GetValue()
			case "subresource":
				api.Subresource = l.GetValue()
			case "removed_release":
				api.RemovedRelease = l.GetValue()
			}
		}
		out = append(out, api)
	}
	slices.SortFunc(out, func(a, b requestedAPI) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out), nil
}

// apiLifecycle is what Kubernetes' lifecycle data says of one kind.
type apiLifecycle struct {
	// RemovedMajor and RemovedMinor are the release that stops serving it.
	RemovedMajor, RemovedMinor int
	// Replacement is the kind to move to; zero when none is named.
	Replacement schema.GroupVersionKind
}

// apiLifecycles are the kinds with a planned removal, by kind.
type apiLifecycles map[schema.GroupVersionKind]apiLifecycle

// apiLifecycleRemoved and apiLifecycleReplaced are the methods
// prerelease-lifecycle-gen writes on k8s.io/api's types
// (zz_generated.prerelease-lifecycle.go): the same data the API server
// labels removed_release with, so the two halves of the check agree.
type apiLifecycleRemoved interface {
	APILifecycleRemoved() (major, minor int)
}

type apiLifecycleReplaced interface {
	APILifecycleReplacement() schema.GroupVersionKind
}

// apiLifecyclesOf builds the lifecycle table from a scheme's registered
// types, by instantiating each and asking it: never a table kept by hand,
// which would go stale with every Kubernetes release.
func apiLifecyclesOf(s *runtime.Scheme) apiLifecycles {
	out := apiLifecycles{}
	for gvk := range s.AllKnownTypes() {
		if gvk.Version == runtime.APIVersionInternal {
			continue
		}
		obj, err := s.New(gvk)
		if err != nil {
			continue
		}
		removed, ok := obj.(apiLifecycleRemoved)
		if !ok {
			continue
		}
		major, minor := removed.APILifecycleRemoved()
		if major == 0 && minor == 0 {
			continue
		}
		lc := apiLifecycle{RemovedMajor: major, RemovedMinor: minor}
		if r, ok := obj.(apiLifecycleReplaced); ok {
			lc.Replacement = r.APILifecycleReplacement()
		}
		out[gvk] = lc
	}
	return out
}

// apisBuiltinLifecycles is the table of every built-in type: client-go's
// scheme registers all of k8s.io/api's served groups, and is already linked
// into this binary (the workload clients use it), so it costs nothing more.
var apisBuiltinLifecycles = sync.OnceValue(func() apiLifecycles { return apiLifecyclesOf(clientgoscheme.Scheme) })

// kindOf finds the kind of a group-version's resource: from discovery when
// it served that resource, else by guessing each known kind's plural as a
// REST mapper does (the metric names resources, the lifecycle data kinds).
func (l apiLifecycles) kindOf(gv schema.GroupVersion, resource string, served []servedGroupVersion) (schema.GroupVersionKind, bool) {
	for _, s := range served {
		if s.GroupVersion == gv {
			if kind, ok := s.Resources[resource]; ok {
				return gv.WithKind(kind), true
			}
		}
	}
	for gvk := range l {
		if gvk.GroupVersion() != gv {
			continue
		}
		if plural, _ := meta.UnsafeGuessKindToResource(gvk); plural.Resource == resource {
			return gvk, true
		}
	}
	return schema.GroupVersionKind{}, false
}

// servedGroupVersion is one group-version discovery lists, with its resources.
type servedGroupVersion struct {
	GroupVersion schema.GroupVersion
	// Resources maps each resource (subresources left out) to its kind.
	Resources map[string]string
}

// apisServedFrom turns discovery's lists into served group-versions.
func apisServedFrom(lists []*metav1.APIResourceList) []servedGroupVersion {
	var out []servedGroupVersion
	for _, l := range lists {
		if l == nil {
			continue
		}
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		res := map[string]string{}
		for _, r := range l.APIResources {
			if !strings.Contains(r.Name, "/") {
				res[r.Name] = r.Kind
			}
		}
		out = append(out, servedGroupVersion{GroupVersion: gv, Resources: res})
	}
	return out
}

// removedAPIsInput is what the check read, for judgeRemovedAPIs.
type removedAPIsInput struct {
	Target semver.Version
	// Requested are the deprecated APIs requested; RequestedErr is why they
	// could not be read.
	Requested    []requestedAPI
	RequestedErr error
	// Served are the group-versions discovery listed; ServedFailed those of
	// its groups that did not answer; ServedErr why discovery failed whole.
	Served       []servedGroupVersion
	ServedFailed []schema.GroupVersion
	ServedErr    error
	Lifecycles   apiLifecycles
}

// apisRemovedBy says whether an API removed in release major.minor is gone
// in the target: a removal in the target's own minor counts, as that
// release is the first that no longer serves it.
func apisRemovedBy(major, minor int, target semver.Version) bool {
	return uint64(major) < target.Major || (uint64(major) == target.Major && uint64(minor) <= target.Minor)
}

// apisParseRelease parses a removed_release label, "<major>.<minor>".
func apisParseRelease(s string) (major, minor int, err error) {
	majorText, minorText, ok := strings.Cut(s, ".")
	if !ok {
		return 0, 0, fmt.Errorf("removed_release %q is not <major>.<minor>", s)
	}
	if major, err = strconv.Atoi(majorText); err == nil {
		minor, err = strconv.Atoi(minorText)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("removed_release %q is not <major>.<minor>", s)
	}
	return major, minor, nil
}

// apisVerdict gathers the parts of the check's finding: the worst result,
// and each part's found and do.
type apisVerdict struct {
	result    Result
	found, do []string
}

func (v *apisVerdict) add(r Result, found, do string) {
	if r == Block || (r == Warn && v.result != Block) {
		v.result = r
	}
	v.found = append(v.found, found)
	if do != "" {
		v.do = append(v.do, do)
	}
}

// judgeRemovedAPIs judges what the check read against the target.
func judgeRemovedAPIs(in removedAPIsInput) Finding {
	if in.RequestedErr != nil && in.ServedErr != nil {
		return notChecked("the workload API server's /metrics and discovery", errors.Join(in.RequestedErr, in.ServedErr))
	}
	target := fmt.Sprintf("v%d.%d", in.Target.Major, in.Target.Minor)
	v := apisVerdict{result: Pass}

	// Requested: a client that calls an API the target removes breaks.
	type requested struct {
		api         requestedAPI
		replacement schema.GroupVersionKind
	}
	var blocked []requested
	var later, malformed []string
	for _, r := range in.Requested {
		if r.RemovedRelease == "" {
			continue
		}
		major, minor, err := apisParseRelease(r.RemovedRelease)
		if err != nil {
			malformed = append(malformed, r.String()+": "+err.Error())
			continue
		}
		if !apisRemovedBy(major, minor, in.Target) {
			later = append(later, fmt.Sprintf("%s (removed in v%s)", r, r.RemovedRelease))
			continue
		}
		b := requested{api: r}
		if gvk, ok := in.Lifecycles.kindOf(r.groupVersion(), r.Resource, in.Served); ok {
			b.replacement = in.Lifecycles[gvk].Replacement
		}
		blocked = append(blocked, b)
	}
	if len(blocked) > 0 {
		names, moves := make([]string, 0, len(blocked)), make([]string, 0, len(blocked))
		for _, b := range blocked {
			names = append(names, fmt.Sprintf("%s (removed in v%s)", b.api, b.api.RemovedRelease))
			if b.replacement.Empty() {
				// The lifecycle data names no replacement: a version of
				// the same group that the target serves is where to look.
				list := "kubectl api-versions"
				if b.api.Group != "" {
					list += " | grep " + b.api.Group
				}
				moves = append(moves, fmt.Sprintf("off %s to a version of its group the target serves (`%s`)", b.api, list))
			} else {
				moves = append(moves, fmt.Sprintf("from %s to %s %s", b.api, b.replacement.GroupVersion(), b.replacement.Kind))
			}
		}
		v.add(Block,
			fmt.Sprintf("clients called APIs that %s removes, since the API server that answered started: %s", target, strings.Join(names, ", ")),
			fmt.Sprintf("migrate the clients %s before upgrading; the workload API server's audit log names the callers (user and userAgent of events annotated k8s.io/deprecated=true), and `kubectl get --raw /metrics | grep %s` on the workload cluster shows what is still requested (per API server, since its start)",
				strings.Join(moves, ", "), apisDeprecatedMetric))
	}
	if len(malformed) > 0 {
		v.add(Warn, "requested deprecated APIs with a removal release not understood: "+strings.Join(malformed, "; "),
			"check them by hand: `kubectl get --raw /metrics | grep "+apisDeprecatedMetric+"`")
	}
	if in.RequestedErr != nil {
		v.add(Warn, fmt.Sprintf("requests not checked: reading the workload API server's /metrics: %v", in.RequestedErr),
			"let the workload identity get the non-resource URL /metrics, or run `kubectl get --raw /metrics | grep "+apisDeprecatedMetric+"` on the workload cluster")
	}

	// Served: the target stops serving these; nothing seen calling them is
	// not proof that nothing will.
	blockedGVR := map[schema.GroupVersionResource]bool{}
	for _, b := range blocked {
		blockedGVR[b.api.groupVersion().WithResource(b.api.Resource)] = true
	}
	var servedRemoved, servedMoves []string
	for _, s := range in.Served {
		var resources []string
		var moves []string
		for _, res := range slices.Sorted(maps.Keys(s.Resources)) {
			lc, ok := in.Lifecycles[s.GroupVersion.WithKind(s.Resources[res])]
			if !ok || !apisRemovedBy(lc.RemovedMajor, lc.RemovedMinor, in.Target) {
				continue
			}
			if blockedGVR[s.GroupVersion.WithResource(res)] {
				continue // requested: blocks above
			}
			resources = append(resources, fmt.Sprintf("%s (removed in v%d.%d)", res, lc.RemovedMajor, lc.RemovedMinor))
			if !lc.Replacement.Empty() {
				moves = append(moves, fmt.Sprintf("%s to %s %s", res, lc.Replacement.GroupVersion(), lc.Replacement.Kind))
			}
		}
		if len(resources) == 0 {
			continue
		}
		servedRemoved = append(servedRemoved, s.GroupVersion.String()+" "+strings.Join(resources, ", "))
		for _, m := range moves {
			servedMoves = append(servedMoves, s.GroupVersion.String()+" "+m)
		}
	}
	slices.Sort(servedRemoved)
	if len(servedRemoved) > 0 {
		seen := "not requested since the API server that answered started"
		if in.RequestedErr != nil {
			seen = "not known whether requested"
		}
		do := "make sure nothing still uses them (manifests in Git, Helm charts, operators, jobs that run rarely: the metric forgets at each API server restart, the audit log does not)"
		if len(servedMoves) > 0 {
			do += " and move what does: " + strings.Join(servedMoves, ", ")
		}
		v.add(Warn, fmt.Sprintf("served and removed by %s, %s: %s", target, seen, strings.Join(servedRemoved, "; ")), do)
	}
	if len(in.ServedFailed) > 0 {
		failed := make([]string, 0, len(in.ServedFailed))
		for _, gv := range in.ServedFailed {
			failed = append(failed, gv.String())
		}
		slices.Sort(failed)
		v.add(Warn, "discovery did not answer for "+strings.Join(failed, ", ")+": those group-versions not checked",
			"fix or remove the APIService behind them (`kubectl get apiservices` on the workload cluster, those not Available): a group discovery cannot read also stalls namespace deletion and garbage collection")
	}
	if in.ServedErr != nil {
		v.add(Warn, fmt.Sprintf("served group-versions not checked: discovery on the workload cluster: %v", in.ServedErr),
			"fix the read and run `kubectl cp-rollout check` again")
	}

	if v.result == Pass {
		found := fmt.Sprintf("no API that %s removes requested since the API server that answered started; %d served group-versions, none removed by %s", target, len(in.Served), target)
		if len(in.Requested) == 0 {
			found = fmt.Sprintf("no deprecated API requested since the API server that answered started; %d served group-versions, none removed by %s", len(in.Served), target)
		}
		if len(later) > 0 {
			found += "; requested and removed later: " + strings.Join(later, ", ")
		}
		return Finding{Result: Pass, Found: found}
	}
	return Finding{Result: v.result, Found: strings.Join(v.found, "; "), Do: strings.Join(v.do, "; ")}
}

// removedAPIs reads the deprecated APIs the workload API server saw
// requested and the group-versions it serves, and judges them against the
// target with Kubernetes' lifecycle data.
func removedAPIs(ctx context.Context, c *Cluster) Finding {
	if c.Workload == nil {
		return notChecked("the workload cluster", errors.New("no client to it"))
	}
	in := removedAPIsInput{Target: c.Target, Lifecycles: apisBuiltinLifecycles()}
	in.Requested, in.RequestedErr = apisReadRequested(ctx, c)
	in.Served, in.ServedFailed, in.ServedErr = apisReadServed(c)
	return judgeRemovedAPIs(in)
}

// apisReadRequested reads /metrics of the workload API server. Through the
// cluster's endpoint this is whichever API server the load balancer picked:
// the gauge is per instance, which the finding's wording says.
func apisReadRequested(ctx context.Context, c *Cluster) ([]requestedAPI, error) {
	body, err := c.Workload.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").
		// Ask for the text format: the parser reads that one, and an API
		// server that negotiates would otherwise be free to pick another.
		SetHeader("Accept", "text/plain;version=0.0.4").
		DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return parseRequestedDeprecatedAPIs(bytes.NewReader(body))
}

// apisReadServed lists the workload cluster's group-versions with their
// resources. A group that does not answer (an aggregated API whose backend
// is down) leaves the others read: they are judged, and it is named.
func apisReadServed(c *Cluster) ([]servedGroupVersion, []schema.GroupVersion, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(c.Workload.Config)
	if err != nil {
		return nil, nil, err
	}
	_, lists, err := dc.ServerGroupsAndResources()
	var failed []schema.GroupVersion
	if groups, ok := discovery.GroupDiscoveryFailedErrorGroups(err); ok {
		for gv := range groups {
			failed = append(failed, gv)
		}
		err = nil
	}
	if err != nil {
		return nil, nil, err
	}
	return apisServedFrom(lists), failed, nil
}
