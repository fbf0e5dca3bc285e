package readiness

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	ctrlfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/pkg/workload"
	"github.com/cp-rollout/cp-rollout/rollout"
)

func skewTV(s string) semver.Version { return semver.MustParse(s) }

func TestVersionSkewPolicy(t *testing.T) {
	for _, tc := range []struct {
		v, target string
		ok        bool
	}{
		{"1.33.0", "1.33.0", true},
		{"1.33.9", "1.33.0", true},  // a newer patch is the same minor
		{"1.30.9", "1.33.0", true},  // exactly three minors older
		{"1.29.9", "1.33.5", false}, // four minors older
		{"1.34.0", "1.33.9", false}, // newer than kube-apiserver
		{"1.34.0-alpha.1", "1.33.0", false},
		{"1.33.0-rc.1", "1.33.0", true},
		{"2.0.0", "1.33.0", false},
		{"1.24.3", "1.26.0", true},  // before v1.25: two minors older is the most
		{"1.24.3", "1.27.0", false}, // before v1.25: three older is too many
		{"1.25.0", "1.28.0", true},  // from v1.25: three older is allowed
	} {
		why := skewAgainst(skewTV(tc.v), skewTV(tc.target))
		if (why == "") != tc.ok {
			t.Errorf("v%s under kube-apiserver v%s: %q, want allowed=%v", tc.v, tc.target, why, tc.ok)
		}
	}
	for target, want := range map[string]string{"1.33.2": "1.30.0", "1.28.0": "1.25.0", "1.27.0": "1.25.0", "1.26.0": "1.24.0"} {
		if got := skewOldestAllowed(skewTV(target)); got.String() != want {
			t.Errorf("oldest worker under v%s: v%s, want v%s", target, got, want)
		}
	}
}

func skewIn(target string) skewInput {
	return skewInput{Target: skewTV(target), From: skewTV("1.32.4"), CAPIVersion: "v1.14.2"}
}

func skewKubelets(versions map[string]string) []skewComponent {
	var out []skewComponent
	for node, v := range versions {
		out = append(out, skewComponent{What: "kubelet", Where: node, OnNode: true, Version: v})
	}
	return out
}

func TestVersionSkewPassSaysWhatWasLookedAt(t *testing.T) {
	in := skewIn("1.33.0")
	in.Kubelets = skewKubelets(map[string]string{"w-1": "v1.30.2", "w-2": "v1.32.4"})
	in.WorkerNodes = 2
	in.KubeProxies = []skewComponent{{What: "kube-proxy", Where: "DaemonSet kube-system/kube-proxy", Version: "v1.32.4", Image: "registry.k8s.io/kube-proxy:v1.32.4"}}
	in.Workers = []skewWorkerSet{{Kind: "MachineDeployment", Namespace: "ns", Name: "md-0", Version: "v1.30.2"}}
	f := judgeVersionSkew(in)
	want := "kubelets of 2 worker nodes (v1.30.2–v1.32.4), kube-proxy (v1.32.4) and 1 MachineDeployments/MachinePools within skew of v1.33; Cluster API v1.14.2 supports v1.33 (v1.31–v1.37)"
	if f.Result != Pass || f.Found != want || f.Do != "" {
		t.Fatalf("got %s %q / %q\nwant pass %q", f.Result, f.Found, f.Do, want)
	}
}

func TestVersionSkewWorkerKubelets(t *testing.T) {
	in := skewIn("1.33.0")
	in.Kubelets = skewKubelets(map[string]string{"w-1": "v1.29.8", "w-2": "v1.29.8", "w-3": "v1.30.0", "w-4": "v1.29.8", "w-5": "v1.29.8"})
	f := judgeVersionSkew(in)
	if f.Result != Block {
		t.Fatalf("kubelets four minors older: %s %q", f.Result, f.Found)
	}
	if want := "kubelet v1.29.8 on nodes w-1, w-2, w-4 and 1 more: 4 minor versions older than v1.33, where the skew policy allows 3"; !strings.Contains(f.Found, want) {
		t.Errorf("found %q lacks %q", f.Found, want)
	}
	if strings.Contains(f.Found, "w-3") {
		t.Errorf("found names w-3, three minors older: %q", f.Found)
	}
	if want := "upgrade the workers first, to v1.30 or later, and no newer than the control plane's current v1.32.4"; !strings.Contains(f.Do, want) {
		t.Errorf("do %q lacks %q", f.Do, want)
	}

	in = skewIn("1.33.0")
	in.Kubelets = skewKubelets(map[string]string{"w-1": "v1.34.1"})
	f = judgeVersionSkew(in)
	if f.Result != Block || !strings.Contains(f.Found, "kubelet v1.34.1 on node w-1: newer than v1.33") || !strings.Contains(f.Do, "newer than kube-apiserver") {
		t.Errorf("a kubelet newer than the target: %s %q / %q", f.Result, f.Found, f.Do)
	}

	in = skewIn("1.33.0")
	in.Kubelets = skewKubelets(map[string]string{"w-1": "not-a-version"})
	if f = judgeVersionSkew(in); f.Result != Warn || !strings.Contains(f.Found, `kubelet "not-a-version" of w-1`) {
		t.Errorf("an unreadable kubelet version: %s %q", f.Result, f.Found)
	}
}

func TestVersionSkewMachineDeploymentsAndPools(t *testing.T) {
	in := skewIn("1.33.0")
	in.Workers = []skewWorkerSet{
		{Kind: "MachineDeployment", Namespace: "ns", Name: "md-ok", Version: "v1.30.0"},
		{Kind: "MachineDeployment", Namespace: "ns", Name: "md-old", Version: "v1.29.3"},
		{Kind: "MachinePool", Namespace: "ns", Name: "mp-old", Version: "v1.28.0"},
		{Kind: "MachineDeployment", Namespace: "ns", Name: "md-unset"},
	}
	f := judgeVersionSkew(in)
	if f.Result != Block {
		t.Fatalf("workers four and five minors older: %s %q", f.Result, f.Found)
	}
	for _, want := range []string{"MachineDeployment ns/md-old at v1.29.3: 4 minor versions older than v1.33", "MachinePool ns/mp-old at v1.28.0: 5 minor versions older"} {
		if !strings.Contains(f.Found, want) {
			t.Errorf("found %q lacks %q", f.Found, want)
		}
	}
	if strings.Contains(f.Found, "md-ok") || strings.Contains(f.Found, "md-unset") {
		t.Errorf("found names a worker within skew: %q", f.Found)
	}
	for _, want := range []string{
		"upgrade the workers first",
		`kubectl patch machinedeployment -n ns md-old --type merge -p '{"spec":{"template":{"spec":{"version":"v1.32.4"}}}}'`,
		`kubectl patch machinepool -n ns mp-old`,
	} {
		if !strings.Contains(f.Do, want) {
			t.Errorf("do %q lacks %q", f.Do, want)
		}
	}

	in = skewIn("1.33.0")
	in.Workers = []skewWorkerSet{{Kind: "MachineDeployment", Namespace: "ns", Name: "md-topo", Version: "v1.29.3", Topology: true}}
	f = judgeVersionSkew(in)
	if f.Result != Block || !strings.Contains(f.Do, "topology manages MachineDeployment ns/md-topo") || !strings.Contains(f.Do, clusterv1.ClusterTopologyDeferUpgradeAnnotation) || strings.Contains(f.Do, "kubectl patch") {
		t.Errorf("a topology-managed MachineDeployment: %s %q / %q", f.Result, f.Found, f.Do)
	}

	in = skewIn("1.33.0")
	in.Workers = []skewWorkerSet{{Kind: "MachineDeployment", Namespace: "ns", Name: "md-new", Version: "v1.34.0"}}
	if f = judgeVersionSkew(in); f.Result != Block || !strings.Contains(f.Found, "md-new at v1.34.0: newer than v1.33") {
		t.Errorf("a MachineDeployment newer than the target: %s %q", f.Result, f.Found)
	}
}

func TestVersionSkewWorkerNodesLeaveControlPlaneOut(t *testing.T) {
	machines := collections.FromMachines(
		&clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "cp-a"}, Status: clusterv1.MachineStatus{NodeRef: clusterv1.MachineNodeReference{Name: "node-cp-a"}}},
		&clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "cp-b"}}, // no node yet
	)
	kubelets, proxies := skewWorkerNodes([]skewNode{
		{Name: "node-cp-a", Kubelet: "v1.28.0", KubeProxy: "v1.28.0"},
		{Name: "w-1", Kubelet: "v1.32.0"},
		{Name: "w-2", Kubelet: "v1.31.0", KubeProxy: "v1.31.0"},
	}, machines)
	if len(kubelets) != 2 || kubelets[0].Where != "w-1" || kubelets[1].Where != "w-2" || !kubelets[0].OnNode {
		t.Errorf("worker kubelets: %+v", kubelets)
	}
	if len(proxies) != 1 || proxies[0].Where != "w-2" || proxies[0].What != "kube-proxy" {
		t.Errorf("worker kube-proxies from NodeInfo: %+v", proxies)
	}
}

func TestVersionSkewKubeProxyImage(t *testing.T) {
	for _, tc := range []struct {
		images  map[string]string
		version string
		found   bool
		err     bool
	}{
		{map[string]string{"kube-proxy": "registry.k8s.io/kube-proxy:v1.32.4"}, "v1.32.4", true, false},
		{map[string]string{"kube-proxy": "my.registry:5000/k8s/kube-proxy:v1.32.4_build.1"}, "v1.32.4+build.1", true, false},
		{map[string]string{"other": "registry.k8s.io/pause:3.10"}, "", false, false},
		{map[string]string{"kube-proxy": "registry.k8s.io/kube-proxy@sha256:" + strings.Repeat("a", 64)}, "", false, true},
		{map[string]string{"kube-proxy": "registry.k8s.io/kube-proxy:latest"}, "", false, true},
	} {
		c, found, err := skewKubeProxyImage(tc.images)
		if found != tc.found || (err != nil) != tc.err || c.Version != tc.version {
			t.Errorf("%v: %+v %v %v; want version %q found %v err %v", tc.images, c, found, err, tc.version, tc.found, tc.err)
		}
	}

	in := skewIn("1.33.0")
	proxy, _, _ := skewKubeProxyImage(map[string]string{"kube-proxy": "registry.k8s.io/kube-proxy:v1.29.1"})
	in.KubeProxies = []skewComponent{proxy}
	f := judgeVersionSkew(in)
	if f.Result != Block || !strings.Contains(f.Found, "kube-proxy v1.29.1 in DaemonSet kube-system/kube-proxy: 4 minor versions older") ||
		!strings.Contains(f.Do, "kubectl -n kube-system set image daemonset/kube-proxy kube-proxy=registry.k8s.io/kube-proxy:v1.32.4") {
		t.Errorf("an old kube-proxy: %s %q / %q", f.Result, f.Found, f.Do)
	}
}

func TestVersionSkewCAPISupport(t *testing.T) {
	for _, tc := range []struct {
		capi, target string
		want         Result
		found, do    string
	}{
		{"v1.14.2", "1.31.0", Pass, "supports v1.31 (v1.31–v1.37)", ""},
		{"v1.14.2", "1.37.1", Pass, "supports v1.37", ""},
		{"v1.14.2", "1.30.9", Block, "supports workload clusters v1.31–v1.37, not v1.30", "v1.13.x"},
		{"v1.14.0", "1.37.0", Warn, "tested with workload clusters v1.31–v1.36, not v1.37", "upgrade Cluster API to v1.14.1 or later"},
		{"v1.14.0", "1.36.0", Pass, "supports v1.36", ""},
		{"v1.14.2", "1.38.0", Warn, "not v1.38", "upgrade Cluster API to a release tested with v1.38"},
		{"v1.12.7", "1.36.0", Warn, "v1.29–v1.35, not v1.36", "upgrade Cluster API to v1.12.8 or later"},
		{"v1.12.9", "1.37.0", Warn, "not v1.37", "upgrade Cluster API to v1.13.6 or later"},
		{"v1.13.2", "1.37.0", Warn, "not v1.37", "upgrade Cluster API to v1.13.6 or later"},
		{"v1.13.7", "1.29.0", Block, "not v1.29", "v1.12.x"},
		{"v1.15.0", "1.37.0", Warn, "not in the support table", "Cluster API v1.15.0"},
		{"", "1.33.0", Warn, "Cluster API release is unknown", "KCP controller's version"},
		{"garbage", "1.33.0", Warn, "not understood", ""},
		{"v1.14.2", "1.21.5", Block, "cannot bootstrap v1.21", ""}, // what Cluster API's code refuses, whatever its release
	} {
		res, found, do := judgeCAPISupport(tc.capi, skewTV(tc.target))
		if res != tc.want || !strings.Contains(found, tc.found) || !strings.Contains(do, tc.do) {
			t.Errorf("Cluster API %q, target v%s: %s %q / %q; want %s, found with %q, do with %q", tc.capi, tc.target, res, found, do, tc.want, tc.found, tc.do)
		}
	}
}

func TestVersionSkewReadsThatFailed(t *testing.T) {
	in := skewIn("1.33.0")
	in.Unread = []skewUnread{{What: "the cluster's MachineDeployments", Err: errors.New("forbidden")}}
	f := judgeVersionSkew(in)
	if f.Result != Warn || !strings.Contains(f.Found, "not checked: the cluster's MachineDeployments: forbidden") {
		t.Errorf("an unread list: %s %q", f.Result, f.Found)
	}
	// A block found elsewhere stands beside it.
	in.Kubelets = skewKubelets(map[string]string{"w-1": "v1.28.0"})
	if f = judgeVersionSkew(in); f.Result != Block || !strings.Contains(f.Found, "not checked") {
		t.Errorf("an unread list beside a block: %s %q", f.Result, f.Found)
	}
}

// The check's reads through fake clients: worker nodes only, the
// kube-proxy DaemonSet's tag, and the cluster's own MachineDeployments and
// MachinePools (by its label, in its namespace).
func TestVersionSkewReadsTheClusters(t *testing.T) {
	node := func(name, kubelet string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: kubelet}}}
	}
	proxy := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:v1.32.4"},
		}}}},
	}
	kube := kubefake.NewClientset(node("cp-node", "v1.28.0"), node("w-1", "v1.29.0"), node("w-2", "v1.31.0"), proxy)

	labels := map[string]string{clusterv1.ClusterNameLabel: "c1"}
	md := func(ns, name, version string, labels map[string]string) *clusterv1.MachineDeployment {
		md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
		md.Spec.Template.Spec.Version = version
		return md
	}
	mp := &clusterv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mp-0", Labels: labels}}
	mp.Spec.Template.Spec.Version = "v1.28.2"
	scheme := runtime.NewScheme()
	if err := clusterv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mgmt := ctrlfake.NewClientBuilder().WithScheme(scheme).WithObjects(
		md("ns", "md-0", "v1.29.1", labels),
		md("ns", "other-cluster", "v1.20.0", map[string]string{clusterv1.ClusterNameLabel: "c2"}),
		md("elsewhere", "md-0", "v1.20.0", labels),
		mp,
	).Build()

	cp := &kcpstate.ControlPlane{
		Cluster:  &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1"}},
		Machines: collections.FromMachines(&clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "cp-0"}, Status: clusterv1.MachineStatus{NodeRef: clusterv1.MachineNodeReference{Name: "cp-node"}}}),
	}
	c := &Cluster{
		Snapshot: &rollout.Snapshot{CP: cp}, From: skewTV("1.32.4"), Target: skewTV("1.33.0"), CAPIVersion: "v1.14.2",
		Management: mgmt, Workload: &workload.Client{Kube: kube},
	}
	f := versionSkew(context.Background(), c)
	if f.Result != Block {
		t.Fatalf("got %s %q", f.Result, f.Found)
	}
	for _, want := range []string{"kubelet v1.29.0 on node w-1: 4 minor versions older", "MachineDeployment ns/md-0 at v1.29.1", "MachinePool ns/mp-0 at v1.28.2"} {
		if !strings.Contains(f.Found, want) {
			t.Errorf("found %q lacks %q", f.Found, want)
		}
	}
	for _, unwanted := range []string{"cp-node", "w-2", "other-cluster", "elsewhere", "kube-proxy"} {
		if strings.Contains(f.Found, unwanted) {
			t.Errorf("found %q names %q", f.Found, unwanted)
		}
	}
}
