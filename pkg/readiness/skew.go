package readiness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/blang/semver/v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	bootstraptypes "sigs.k8s.io/cluster-api/bootstrap/kubeadm/pkg/types"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/container"
	capiversion "sigs.k8s.io/cluster-api/util/version"
)

// The version-skew check holds the workers and the target to Kubernetes'
// version skew policy (https://kubernetes.io/releases/version-skew-policy/):
// a kubelet or kube-proxy must not be newer than kube-apiserver, and may be
// at most three minor versions older (two, for one older than v1.25). The
// control-plane nodes are about to be replaced at the target, so only the
// workers are held to it: a worker out of skew of the new API servers is
// outside what Kubernetes tests, and the upgrade is where it would begin.
// The target is also held to the Kubernetes versions the running Cluster
// API release supports for workload clusters.
//
// Two rules of the policy need no check of their own: a kube-proxy may be
// three minors older or newer than the kubelet beside it, and KCP retags
// kube-proxy to the target once every machine is up to date, so kubelets
// within skew of the target are within skew of that kube-proxy; and while
// the API servers run both versions, a kubelet must be no newer than the
// older one, the current version, which it already must be today.

// skewOlderAllowed is how many minor versions older than kube-apiserver a
// kubelet or kube-proxy of version v may be: three, but two for one older
// than v1.25, as the policy's text has it.
func skewOlderAllowed(v semver.Version) uint64 {
	if v.Major == 1 && v.Minor < 25 {
		return 2
	}
	return 3
}

// skewAgainst says how a kubelet's or kube-proxy's version v stands against
// a kube-apiserver at target: "" when the policy allows it, else why not.
// The policy speaks of minor versions: patches do not count.
func skewAgainst(v, target semver.Version) string {
	t := fmt.Sprintf("v%d.%d", target.Major, target.Minor)
	switch {
	case v.Major != target.Major:
		return fmt.Sprintf("another major version than %s", t)
	case skewNewer(v, target):
		return fmt.Sprintf("newer than %s", t)
	case target.Minor-v.Minor > skewOlderAllowed(v):
		return fmt.Sprintf("%d minor versions older than %s, where the skew policy allows %d", target.Minor-v.Minor, t, skewOlderAllowed(v))
	}
	return ""
}

// skewNewer says whether v is of a newer minor version than target.
func skewNewer(v, target semver.Version) bool {
	return v.Major > target.Major || (v.Major == target.Major && v.Minor > target.Minor)
}

// skewOldestAllowed is the oldest minor version a worker may run under a
// kube-apiserver at target.
func skewOldestAllowed(target semver.Version) semver.Version {
	for m := uint64(0); m < target.Minor; m++ {
		if v := (semver.Version{Major: target.Major, Minor: m}); skewAgainst(v, target) == "" {
			return v
		}
	}
	return semver.Version{Major: target.Major, Minor: target.Minor}
}

// skewComponent is a kubelet or a kube-proxy with its version.
type skewComponent struct {
	// What is "kubelet" or "kube-proxy".
	What string
	// Where is where it runs: a node's name, or the DaemonSet's.
	Where string
	// OnNode says Where is a node's name.
	OnNode bool
	// Version is as reported: a node's version, or an image tag.
	Version string
	// Image is the kube-proxy DaemonSet's image, for the command to retag it.
	Image string
}

// skewWorkerSet is a MachineDeployment or MachinePool of the cluster.
type skewWorkerSet struct {
	Kind, Namespace, Name string
	// Version is spec.template.spec.version; "" when unset.
	Version string
	// Topology is set when the Cluster's topology manages the object: then
	// the topology controller, not a patch, sets its version.
	Topology bool
}

// skewUnread is a read that failed.
type skewUnread struct {
	What string
	Err  error
}

// skewInput is what the check read, for judgeVersionSkew.
type skewInput struct {
	Target, From semver.Version
	// Kubelets and KubeProxies are those of the worker nodes, and the
	// kube-proxy DaemonSet's image.
	Kubelets, KubeProxies []skewComponent
	// WorkerNodes is how many worker nodes were read.
	WorkerNodes int
	Workers     []skewWorkerSet
	// CAPIVersion is the KCP controller's version, "" when unknown.
	CAPIVersion string
	Unread      []skewUnread
}

// skewVerdict gathers the parts of the check's finding: the worst result,
// and each part's found and do.
type skewVerdict struct {
	result    Result
	found, do []string
}

func (v *skewVerdict) add(r Result, found, do string) {
	if r == Block || (r == Warn && v.result != Block) {
		v.result = r
	}
	if found != "" {
		v.found = append(v.found, found)
	}
	if do != "" && !slices.Contains(v.do, do) {
		v.do = append(v.do, do)
	}
}

// skewNames lists names, the first three and how many more: a finding
// names objects without reading as an inventory.
func skewNames(names []string) string {
	slices.Sort(names)
	if len(names) <= 3 {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:3], ", "), len(names)-3)
}

func skewV(v semver.Version) string { return "v" + v.String() }

// judgeVersionSkew judges what the check read.
func judgeVersionSkew(in skewInput) Finding {
	v := skewVerdict{result: Pass}
	target := fmt.Sprintf("v%d.%d", in.Target.Major, in.Target.Minor)
	oldest := skewOldestAllowed(in.Target)
	// Where to upgrade workers to: not older than the target allows, nor
	// newer than the API servers they talk to until the last one is
	// replaced, which run the control plane's current version.
	upTo := fmt.Sprintf("v%d.%d or later, and no newer than the control plane's current %s", oldest.Major, oldest.Minor, skewV(in.From))
	example := skewV(in.From)
	if skewAgainst(in.From, in.Target) != "" {
		example = fmt.Sprintf("v%d.%d.x", oldest.Major, oldest.Minor)
	}

	// Kubelets and kube-proxies, grouped by what they run and their version.
	type group struct {
		what, version, why string
		where              []string
		image              string
		newer, onNode      bool
	}
	var groups []*group
	var unparsed []string
	// oldNodes: some worker kubelet is too old; the commands to upgrade
	// workers come with the MachineDeployments and MachinePools below.
	var oldNodes bool
	judge := func(cs []skewComponent) {
		for _, c := range cs {
			ver, err := semver.ParseTolerant(c.Version)
			if err != nil {
				unparsed = append(unparsed, fmt.Sprintf("%s %q of %s", c.What, c.Version, c.Where))
				continue
			}
			why := skewAgainst(ver, in.Target)
			if why == "" {
				continue
			}
			i := slices.IndexFunc(groups, func(g *group) bool { return g.what == c.What && g.version == c.Version })
			if i < 0 {
				groups = append(groups, &group{what: c.What, version: c.Version, why: why, image: c.Image, newer: skewNewer(ver, in.Target), onNode: c.OnNode})
				i = len(groups) - 1
			}
			groups[i].where = append(groups[i].where, c.Where)
		}
	}
	judge(in.Kubelets)
	judge(in.KubeProxies)
	for _, g := range groups {
		where := "in " + skewNames(g.where)
		if g.onNode {
			where = "on node " + skewNames(g.where)
			if len(g.where) > 1 {
				where = "on nodes " + skewNames(g.where)
			}
		}
		v.add(Block, fmt.Sprintf("%s %s %s: %s", g.what, g.version, where, g.why), "")
		switch {
		case g.newer:
			v.add(Block, "", fmt.Sprintf("a %s newer than kube-apiserver is outside the skew policy: choose a target no older than its minor version, or replace those workers with ones at most %s", g.what, target))
		case g.image != "":
			// KCP retags kube-proxy to its version only once every machine is
			// up to date: until then the old kube-proxy runs under the new
			// API servers.
			retag, err := container.ModifyImageTag(g.image, example)
			if err != nil {
				retag = "<its image at " + example + ">"
			}
			v.add(Block, "", fmt.Sprintf("upgrade kube-proxy first, to %s: `kubectl -n kube-system set image daemonset/kube-proxy kube-proxy=%s` on the workload cluster", upTo, retag))
		default:
			oldNodes = true
		}
	}
	if len(unparsed) > 0 {
		v.add(Warn, "versions not understood, so not judged: "+skewNames(unparsed), "check them by hand against "+target+" and the skew policy")
	}

	// MachineDeployments and MachinePools: what the workers will be made
	// of, including those not yet scaled up.
	var patches []string
	for _, w := range in.Workers {
		if w.Version == "" {
			continue // no version to hold: its nodes were judged above
		}
		ver, err := semver.ParseTolerant(w.Version)
		if err != nil {
			v.add(Warn, fmt.Sprintf("%s %s/%s: version %q not understood", w.Kind, w.Namespace, w.Name, w.Version), "check it by hand against "+target+" and the skew policy")
			continue
		}
		why := skewAgainst(ver, in.Target)
		if why == "" {
			continue
		}
		v.add(Block, fmt.Sprintf("%s %s/%s at %s: %s", w.Kind, w.Namespace, w.Name, w.Version, why), "")
		resource := strings.ToLower(w.Kind)
		switch {
		case skewNewer(ver, in.Target):
			v.add(Block, "", fmt.Sprintf("%s %s/%s is newer than the target: choose a target no older than %s, or set it back to at most %s", w.Kind, w.Namespace, w.Name, w.Version, target))
		case w.Topology:
			v.add(Block, "", fmt.Sprintf("the Cluster's topology manages %s %s/%s and upgrades it after its control plane: let it finish bringing it to the control plane's %s first (remove a %s or %s annotation if one holds it)",
				w.Kind, w.Namespace, w.Name, skewV(in.From), clusterv1.ClusterTopologyDeferUpgradeAnnotation, clusterv1.ClusterTopologyHoldUpgradeSequenceAnnotation))
		default:
			patches = append(patches, fmt.Sprintf("`kubectl patch %s -n %s %s --type merge -p '{\"spec\":{\"template\":{\"spec\":{\"version\":\"%s\"}}}}'`",
				resource, w.Namespace, w.Name, example))
		}
	}
	switch {
	case len(patches) > 0:
		v.add(Block, "", fmt.Sprintf("upgrade the workers first, to %s, on the management cluster with machine templates whose image carries that version: %s",
			upTo, strings.Join(patches, "; ")))
	case oldNodes:
		// The nodes' MachineDeployments already ask for a version within
		// skew (or a topology manages them), or no Machine owns the nodes.
		v.add(Block, "", fmt.Sprintf("upgrade the workers first, to %s: let their MachineDeployments or MachinePools finish rolling out, or upgrade by hand the nodes no Machine owns", upTo))
	}

	// The target against the Cluster API release that will build it.
	capiResult, capiFound, capiDo := judgeCAPISupport(in.CAPIVersion, in.Target)
	if capiResult != Pass {
		v.add(capiResult, capiFound, capiDo)
	}

	for _, u := range in.Unread {
		v.add(Warn, fmt.Sprintf("not checked: %s: %v", u.What, u.Err), "fix the read and run `kubectl cp-rollout check` again")
	}

	if v.result == Pass {
		sets := 0
		for _, w := range in.Workers {
			if w.Version != "" {
				sets++
			}
		}
		kubelets := "no worker nodes"
		if in.WorkerNodes > 0 {
			kubelets = fmt.Sprintf("kubelets of %d worker nodes%s", in.WorkerNodes, skewSpan(in.Kubelets))
		}
		found := fmt.Sprintf("%s, %s and %d MachineDeployments/MachinePools within skew of %s; %s",
			kubelets, skewProxies(in.KubeProxies), sets, target, capiFound)
		return Finding{Result: Pass, Found: found}
	}
	return Finding{Result: v.result, Found: strings.Join(v.found, "; "), Do: strings.Join(v.do, "; ")}
}

// skewSpan says which versions components run: " (v1.31.2–v1.32.4)".
func skewSpan(cs []skewComponent) string {
	var vs []semver.Version
	for _, c := range cs {
		if v, err := semver.ParseTolerant(c.Version); err == nil {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return ""
	}
	lo, hi := slices.MinFunc(vs, semver.Version.Compare), slices.MaxFunc(vs, semver.Version.Compare)
	if lo.EQ(hi) {
		return " (" + skewV(lo) + ")"
	}
	return " (" + skewV(lo) + "–" + skewV(hi) + ")"
}

// skewProxies says what kube-proxy runs, for a pass.
func skewProxies(cs []skewComponent) string {
	if len(cs) == 0 {
		return "no kube-proxy DaemonSet"
	}
	return "kube-proxy" + skewSpan(cs)
}

// Cluster API states the Kubernetes versions each release supports for
// workload clusters only in its book: docs/book/src/reference/versions.md,
// "Core provider (cluster-api-controller)", as shipped in Cluster API
// v1.14.2. Its code enforces no range: the KCP webhook only refuses
// skipping a minor version, and the kubeadm bootstrap refuses a version its
// kubeadm API types cannot express (below v1.22, see judgeCAPISupport). So
// this table is kept by hand from that page and says so; a release it does
// not know is named as unknown, never passed.
const skewCAPITableSource = "Cluster API book, reference/versions.md, as of Cluster API v1.14.2"

// skewCAPIRange is what one Cluster API minor release supports.
type skewCAPIRange struct {
	// Oldest is the oldest workload Kubernetes minor version (1.x).
	Oldest uint64
	// Newest are the newest supported Kubernetes minors, each from the
	// patch release that added it: support for a new Kubernetes release
	// comes in a patch release.
	Newest []skewCAPIStep
}

type skewCAPIStep struct{ Minor, SincePatch uint64 }

// skewCAPISupport is the book's matrix, by Cluster API minor (v1.x).
var skewCAPISupport = map[uint64]skewCAPIRange{
	12: {Oldest: 29, Newest: []skewCAPIStep{{34, 0}, {35, 1}, {36, 8}}},
	13: {Oldest: 30, Newest: []skewCAPIStep{{35, 0}, {36, 1}, {37, 6}}},
	14: {Oldest: 31, Newest: []skewCAPIStep{{36, 0}, {37, 1}}},
}

// newestFor is the newest Kubernetes minor the patch release supports.
func (r skewCAPIRange) newestFor(patch uint64) uint64 {
	var newest uint64
	for _, st := range r.Newest {
		if patch >= st.SincePatch && st.Minor > newest {
			newest = st.Minor
		}
	}
	return newest
}

// supportsFrom is the first patch release of the line that supports
// Kubernetes 1.minor, if any does. Newest is in ascending order.
func (r skewCAPIRange) supportsFrom(minor uint64) (uint64, bool) {
	if minor < r.Oldest {
		return 0, false
	}
	for _, st := range r.Newest {
		if st.Minor >= minor {
			return st.SincePatch, true
		}
	}
	return 0, false
}

// skewCAPIUpgradeTo names the first Cluster API release the table knows,
// at or after capi, that supports Kubernetes 1.minor: where to upgrade to.
func skewCAPIUpgradeTo(minor uint64, capi semver.Version) string {
	capi = semver.Version{Major: capi.Major, Minor: capi.Minor, Patch: capi.Patch}
	for _, line := range slices.Sorted(maps.Keys(skewCAPISupport)) {
		patch, ok := skewCAPISupport[line].supportsFrom(minor)
		if !ok {
			continue
		}
		cand := semver.Version{Major: 1, Minor: line, Patch: patch}
		if cand.LT(capi) {
			if capi.Minor != line {
				continue // a downgrade: not advice
			}
			cand = capi
		}
		return skewV(cand)
	}
	return ""
}

// skewCAPILineSupporting names the newest Cluster API release line the
// table knows that still supports Kubernetes 1.minor.
func skewCAPILineSupporting(minor uint64) string {
	lines := slices.Sorted(maps.Keys(skewCAPISupport))
	for _, line := range slices.Backward(lines) {
		if _, ok := skewCAPISupport[line].supportsFrom(minor); ok {
			return fmt.Sprintf("v1.%d.x", line)
		}
	}
	return ""
}

// judgeCAPISupport holds the target to what the Cluster API release capi
// supports for workload clusters: below the oldest blocks (Cluster API no
// longer builds or tests it); above the newest warns (not yet tested: it may
// work, and a later patch release may add it).
func judgeCAPISupport(capi string, target semver.Version) (Result, string, string) {
	t := fmt.Sprintf("v%d.%d", target.Major, target.Minor)
	// The one limit Cluster API's code enforces: its kubeadm bootstrap has no
	// kubeadm API version for older Kubernetes, so no machine could join.
	if _, err := bootstraptypes.KubeVersionToKubeadmAPIGroupVersion(target); err != nil {
		return Block, fmt.Sprintf("Cluster API cannot bootstrap %s: %v", t, err), "choose a newer target"
	}
	book := "the Kubernetes versions it supports in the Cluster API book (reference/versions)"
	if capi == "" {
		return Warn, fmt.Sprintf("the Cluster API release is unknown, so %s is not checked against it", t),
			"find the KCP controller's version (`kubectl get deploy -A -l cluster.x-k8s.io/provider=control-plane-kubeadm -o wide`) and check " + t + " against " + book
	}
	cv, err := semver.ParseTolerant(capi)
	if err != nil {
		return Warn, fmt.Sprintf("Cluster API version %q not understood, so %s is not checked against it", capi, t), "check " + t + " against " + book
	}
	r, known := skewCAPISupport[cv.Minor]
	if cv.Major != 1 || !known || target.Major != 1 {
		return Warn, fmt.Sprintf("Cluster API %s is not in the support table this tool carries (v1.12–v1.14, from the %s), so %s is not checked against it", capi, skewCAPITableSource, t),
			"check " + t + " against " + book + " of Cluster API " + capi
	}
	newest := r.newestFor(cv.Patch)
	span := fmt.Sprintf("v1.%d–v1.%d", r.Oldest, newest)
	switch {
	case target.Minor < r.Oldest:
		do := fmt.Sprintf("Cluster API %s no longer supports it: upgrade the cluster with a Cluster API release that does", capi)
		if older := skewCAPILineSupporting(target.Minor); older != "" {
			do = fmt.Sprintf("Cluster API %s no longer supports it: upgrade the cluster with one that does (%s) to v1.%d or later, or choose such a target", capi, older, r.Oldest)
		}
		return Block, fmt.Sprintf("Cluster API %s supports workload clusters %s, not %s (%s)", capi, span, t, skewCAPITableSource), do
	case target.Minor > newest:
		do := fmt.Sprintf("upgrade Cluster API to a release tested with %s first, or choose an older target", t)
		if first := skewCAPIUpgradeTo(target.Minor, cv); first != "" {
			do = fmt.Sprintf("upgrade Cluster API to %s or later first (tested with %s), or choose an older target", first, t)
		}
		return Warn, fmt.Sprintf("Cluster API %s is tested with workload clusters %s, not %s (%s)", capi, span, t, skewCAPITableSource), do
	}
	return Pass, fmt.Sprintf("Cluster API %s supports %s (%s)", capi, t, span), ""
}

// skewWorkerNodes splits the nodes' kubelets and kube-proxies off those of
// the control-plane machines, which the rollout replaces at the target.
// NodeInfo.KubeProxyVersion is deprecated and no longer set by recent
// kubelets; where one still sets it, it is judged too.
func skewWorkerNodes(nodes []skewNode, machines collections.Machines) (kubelets, proxies []skewComponent) {
	cp := map[string]bool{}
	for _, m := range machines {
		if m != nil && m.Status.NodeRef.IsDefined() {
			cp[m.Status.NodeRef.Name] = true
		}
	}
	for _, n := range nodes {
		if cp[n.Name] {
			continue
		}
		kubelets = append(kubelets, skewComponent{What: "kubelet", Where: n.Name, OnNode: true, Version: n.Kubelet})
		if n.KubeProxy != "" {
			proxies = append(proxies, skewComponent{What: "kube-proxy", Where: n.Name, OnNode: true, Version: n.KubeProxy})
		}
	}
	return kubelets, proxies
}

// skewNode is what the check needs of a node.
type skewNode struct{ Name, Kubelet, KubeProxy string }

// skewKubeProxyImage finds the kube-proxy container's image and its tag in
// the DaemonSet kubeadm installs, as KCP does (container named kube-proxy).
func skewKubeProxyImage(images map[string]string) (skewComponent, bool, error) {
	image, ok := images["kube-proxy"]
	if !ok {
		return skewComponent{}, false, nil
	}
	img, err := container.ImageFromString(image)
	if err != nil {
		return skewComponent{}, false, fmt.Errorf("kube-proxy image %q: %w", image, err)
	}
	if img.Tag == "" {
		return skewComponent{}, false, fmt.Errorf("kube-proxy image %q has no tag to read a version from", image)
	}
	// Image tags cannot hold "+": Kubernetes' build metadata is written
	// with "_" there, which Cluster API's parser turns back.
	v, err := capiversion.ParseTolerantImageTag(img.Tag)
	if err != nil {
		return skewComponent{}, false, fmt.Errorf("kube-proxy image %q: tag not a version: %w", image, err)
	}
	return skewComponent{What: "kube-proxy", Where: "DaemonSet kube-system/kube-proxy", Version: skewV(v), Image: image}, true, nil
}

// versionSkew reads the worker nodes, the kube-proxy DaemonSet and the
// cluster's MachineDeployments and MachinePools, and judges them and the
// target.
func versionSkew(ctx context.Context, c *Cluster) Finding {
	in := skewInput{Target: c.Target, From: c.From, CAPIVersion: c.CAPIVersion}
	if c.Snapshot == nil || c.Snapshot.CP == nil || c.Snapshot.CP.Cluster == nil {
		return notChecked("the control plane", errors.New("no snapshot of it"))
	}
	cluster := c.Snapshot.CP.Cluster

	if c.Workload == nil {
		in.Unread = append(in.Unread, skewUnread{"the workload cluster's nodes and kube-proxy", errors.New("no client to it")})
	} else {
		nodes, err := c.Workload.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			in.Unread = append(in.Unread, skewUnread{"the workload cluster's nodes", err})
		} else {
			ns := make([]skewNode, 0, len(nodes.Items))
			for _, n := range nodes.Items {
				ns = append(ns, skewNode{Name: n.Name, Kubelet: n.Status.NodeInfo.KubeletVersion, KubeProxy: n.Status.NodeInfo.KubeProxyVersion})
			}
			in.Kubelets, in.KubeProxies = skewWorkerNodes(ns, c.Snapshot.CP.Machines)
			in.WorkerNodes = len(in.Kubelets)
		}
		ds, err := c.Workload.Kube.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(ctx, "kube-proxy", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			// No kube-proxy (a CNI that replaces it): nothing to hold.
		case err != nil:
			in.Unread = append(in.Unread, skewUnread{"the kube-proxy DaemonSet", err})
		default:
			images := map[string]string{}
			for _, ctr := range ds.Spec.Template.Spec.Containers {
				images[ctr.Name] = ctr.Image
			}
			proxy, ok, err := skewKubeProxyImage(images)
			if err != nil {
				in.Unread = append(in.Unread, skewUnread{"the kube-proxy DaemonSet's version", err})
			} else if ok {
				in.KubeProxies = append(in.KubeProxies, proxy)
			}
		}
	}

	if c.Management == nil {
		in.Unread = append(in.Unread, skewUnread{"the cluster's MachineDeployments and MachinePools", errors.New("no client to the management cluster")})
	} else {
		opts := []client.ListOption{client.InNamespace(cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: cluster.Name}}
		var mds clusterv1.MachineDeploymentList
		if err := c.Management.List(ctx, &mds, opts...); err != nil {
			in.Unread = append(in.Unread, skewUnread{"the cluster's MachineDeployments", err})
		}
		for _, md := range mds.Items {
			_, topo := md.Labels[clusterv1.ClusterTopologyOwnedLabel]
			in.Workers = append(in.Workers, skewWorkerSet{Kind: "MachineDeployment", Namespace: md.Namespace, Name: md.Name, Version: md.Spec.Template.Spec.Version, Topology: topo})
		}
		var mps clusterv1.MachinePoolList
		err := c.Management.List(ctx, &mps, opts...)
		switch {
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			// MachinePools are not installed: there are none.
		case err != nil:
			in.Unread = append(in.Unread, skewUnread{"the cluster's MachinePools", err})
		}
		for _, mp := range mps.Items {
			_, topo := mp.Labels[clusterv1.ClusterTopologyOwnedLabel]
			in.Workers = append(in.Workers, skewWorkerSet{Kind: "MachinePool", Namespace: mp.Namespace, Name: mp.Name, Version: mp.Spec.Template.Spec.Version, Topology: topo})
		}
	}
	return judgeVersionSkew(in)
}
