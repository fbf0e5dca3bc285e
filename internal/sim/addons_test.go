package sim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coredns/corefile-migration/migration"
	"github.com/coredns/corefile-migration/migration/corefile"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// TestCoreDNSVersion: the CoreDNS release kubeadm pairs with each Kubernetes
// minor the simulator and the tests use.
func TestCoreDNSVersion(t *testing.T) {
	t.Parallel()
	for k8s, want := range map[string]string{
		"v1.34.0": "v1.12.1",
		"v1.35.2": "v1.13.1",
		"v1.36.3": "v1.14.2",
		"v1.30.0": "v1.12.0", // below the table: its first entry
		"v1.40.1": "v1.14.2", // above the table: its last entry
	} {
		got, err := sim.CoreDNSVersion(k8s)
		if err != nil || got != want {
			t.Errorf("CoreDNSVersion(%s) = %q, %v; want %q", k8s, got, err, want)
		}
	}
	if _, err := sim.CoreDNSVersion("latest"); err == nil {
		t.Error("CoreDNSVersion(latest): want an error")
	}
}

// addonsBefore checks kube-proxy, CoreDNS, kubeadm's ConfigMaps and
// bindings as kubeadm init of version from leaves them, and returns the
// Corefile, which KCP keeps as its backup when it migrates it.
func addonsBefore(t *testing.T, w client.Client, from string) (initialCorefile string) {
	t.Helper()
	ctx := context.Background()
	fromDNS, err := sim.CoreDNSVersion(from)
	if err != nil {
		t.Fatal(err)
	}
	if got := addonKubeProxyImage(t, w); got != "registry.k8s.io/kube-proxy:"+from {
		t.Fatalf("kube-proxy image %q before the upgrade, want registry.k8s.io/kube-proxy:%s", got, from)
	}
	dep, cm := addonCoreDNS(t, w)
	if got := addonCoreDNSImage(dep); got != "registry.k8s.io/coredns/coredns:"+fromDNS {
		t.Fatalf("CoreDNS image %q before the upgrade, want registry.k8s.io/coredns/coredns:%s", got, fromDNS)
	}
	addonPodsAt(t, w, "registry.k8s.io/kube-proxy:"+from, "registry.k8s.io/coredns/coredns:"+fromDNS)
	initialCorefile = cm.Data["Corefile"]
	addonCheckCorefile(t, initialCorefile, strings.TrimPrefix(fromDNS, "v"))
	addonCheckConfigMaps(t, w)
	kubeletClient := client.ObjectKey{Name: "kubeadm:apiserver-kubelet-client"}
	if err := w.Get(ctx, kubeletClient, &rbacv1.ClusterRoleBinding{}); !apierrors.IsNotFound(err) {
		t.Fatalf("ClusterRoleBinding %s before the upgrade: %v, want none (kubeadm %s does not create it)", kubeletClient.Name, err, from)
	}
	return initialCorefile
}

// addonsFollow waits until KCP, upgraded to version to with the CoreDNS tag
// kubeadm pairs with it, has moved kube-proxy and CoreDNS there, and checks
// that every object is left in a shape KCP accepts again.
func addonsFollow(t *testing.T, w client.Client, to, initialCorefile string) {
	t.Helper()
	ctx := context.Background()
	toDNS, err := sim.CoreDNSVersion(to)
	if err != nil {
		t.Fatal(err)
	}
	wantProxy, wantDNS := "registry.k8s.io/kube-proxy:"+to, "registry.k8s.io/coredns/coredns:"+toDNS
	simtest.Eventually(t, 2*time.Minute, "kube-proxy and CoreDNS updated by KCP", func(ctx context.Context) (bool, string, error) {
		if got := addonKubeProxyImage(t, w); got != wantProxy {
			return false, "kube-proxy image " + got, nil
		}
		d := &appsv1.Deployment{}
		if err := w.Get(ctx, addonKey("coredns"), d); err != nil {
			return false, "", err
		}
		if got := addonCoreDNSImage(d); got != wantDNS {
			return false, "CoreDNS image " + got, nil
		}
		return true, "", nil
	})
	addonPodsAt(t, w, wantProxy, wantDNS)
	dep, cm := addonCoreDNS(t, w)
	addonCheckCorefile(t, cm.Data["Corefile"], strings.TrimPrefix(toDNS, "v"))
	if got := cm.Data["Corefile-backup"]; got != initialCorefile {
		t.Errorf("Corefile-backup %q, want kubeadm's Corefile KCP migrated from", got)
	}
	if got := addonCoreDNSVolumeKey(dep); got != "Corefile" {
		t.Errorf("CoreDNS config-volume reads key %q after the upgrade, want Corefile", got)
	}

	// KCP wrote both versions into kubeadm-config, as kubeadm upgrade would.
	kubeadmConfig := &corev1.ConfigMap{}
	if err := w.Get(ctx, addonKey("kubeadm-config"), kubeadmConfig); err != nil {
		t.Fatal(err)
	}
	var cc struct {
		KubernetesVersion string `json:"kubernetesVersion"`
		DNS               struct {
			ImageTag string `json:"imageTag"`
		} `json:"dns"`
	}
	if err := yaml.Unmarshal([]byte(kubeadmConfig.Data["ClusterConfiguration"]), &cc); err != nil {
		t.Fatal(err)
	}
	if cc.KubernetesVersion != to || cc.DNS.ImageTag != toDNS {
		t.Errorf("kubeadm-config kubernetesVersion %q, dns.imageTag %q; want %s and %s", cc.KubernetesVersion, cc.DNS.ImageTag, to, toDNS)
	}

	// KCP ensured the binding kubeadm releases from v1.35.5 on create.
	kubeletClient := client.ObjectKey{Name: "kubeadm:apiserver-kubelet-client"}
	if err := w.Get(ctx, kubeletClient, &rbacv1.ClusterRoleBinding{}); err != nil {
		t.Errorf("ClusterRoleBinding %s after the upgrade: %v, want KCP's", kubeletClient.Name, err)
	}
}

// addonPodsAt waits until the add-ons' pods run the images given, as the
// DaemonSet and Deployment controllers, the scheduler and the kubelets leave
// them: one Running kube-proxy pod on every node and no other, CoreDNS's
// replicas Running on nodes that exist and are not cordoned, and both
// controllers' status saying so.
func addonPodsAt(t *testing.T, w client.Client, proxyImage, dnsImage string) {
	t.Helper()
	simtest.Eventually(t, 2*time.Minute, "kube-proxy pods at "+proxyImage+", CoreDNS pods at "+dnsImage, func(ctx context.Context) (bool, string, error) {
		nodes := &corev1.NodeList{}
		if err := w.List(ctx, nodes); err != nil {
			return false, "", err
		}
		schedulable := map[string]bool{}
		for _, n := range nodes.Items {
			schedulable[n.Name] = !n.Spec.Unschedulable
		}
		pods := &corev1.PodList{}
		if err := w.List(ctx, pods, client.InNamespace("kube-system")); err != nil {
			return false, "", err
		}
		proxies, dns := map[string]int{}, map[string]int{}
		for _, p := range pods.Items {
			running := p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil
			switch p.Labels["k8s-app"] {
			case "kube-proxy":
				if !running || addonContainerImage(p.Spec, "kube-proxy") != proxyImage {
					return false, "kube-proxy pod " + p.Name + " on " + p.Spec.NodeName + " at " + addonContainerImage(p.Spec, "kube-proxy") + ", " + string(p.Status.Phase), nil
				}
				proxies[p.Spec.NodeName]++
			case "kube-dns":
				if !running || addonContainerImage(p.Spec, "coredns") != dnsImage || !schedulable[p.Spec.NodeName] {
					return false, "CoreDNS pod " + p.Name + " on " + p.Spec.NodeName + " at " + addonContainerImage(p.Spec, "coredns") + ", " + string(p.Status.Phase), nil
				}
				dns[p.Spec.NodeName]++
			}
		}
		for _, n := range nodes.Items {
			if proxies[n.Name] != 1 {
				return false, fmt.Sprintf("%d kube-proxy pods on node %s", proxies[n.Name], n.Name), nil
			}
		}
		if len(proxies) != len(nodes.Items) {
			return false, fmt.Sprintf("kube-proxy pods on %d nodes, %d nodes", len(proxies), len(nodes.Items)), nil
		}
		dep, _ := addonCoreDNS(t, w)
		total := 0
		for _, n := range dns {
			total += n
		}
		if want := int(*dep.Spec.Replicas); total != want {
			return false, fmt.Sprintf("CoreDNS pods on %v, want %d", dns, want), nil
		}
		ds := &appsv1.DaemonSet{}
		if err := w.Get(ctx, addonKey("kube-proxy"), ds); err != nil {
			return false, "", err
		}
		if st := ds.Status; st.ObservedGeneration != ds.Generation || int(st.UpdatedNumberScheduled) != len(nodes.Items) ||
			int(st.NumberReady) != len(nodes.Items) || st.DesiredNumberScheduled != st.NumberReady {
			return false, fmt.Sprintf("kube-proxy DaemonSet status %+v", st), nil
		}
		if st := dep.Status; st.ObservedGeneration != dep.Generation || st.UpdatedReplicas != *dep.Spec.Replicas || st.AvailableReplicas != *dep.Spec.Replicas {
			return false, fmt.Sprintf("CoreDNS Deployment status %+v", st), nil
		}
		return true, "", nil
	})
}

// addonCheckConfigMaps: kube-proxy's and the kubelet's configuration are
// where and in the shape kubeadm init leaves them.
func addonCheckConfigMaps(t *testing.T, w client.Client) {
	t.Helper()
	ctx := context.Background()
	proxyConfig := &corev1.ConfigMap{}
	if err := w.Get(ctx, addonKey("kube-proxy"), proxyConfig); err != nil {
		t.Fatal(err)
	}
	var kpc struct {
		Kind             string `json:"kind"`
		ClientConnection struct {
			Kubeconfig string `json:"kubeconfig"`
		} `json:"clientConnection"`
	}
	if err := yaml.Unmarshal([]byte(proxyConfig.Data["config.conf"]), &kpc); err != nil || kpc.Kind != "KubeProxyConfiguration" ||
		kpc.ClientConnection.Kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || proxyConfig.Data["kubeconfig.conf"] == "" {
		t.Errorf("kube-proxy ConfigMap %v (%v): want a KubeProxyConfiguration under config.conf reading kubeconfig.conf", proxyConfig.Data, err)
	}

	kubelet := &corev1.ConfigMap{}
	if err := w.Get(ctx, addonKey("kubelet-config"), kubelet); err != nil {
		t.Fatal(err)
	}
	var kc struct {
		Kind          string `json:"kind"`
		StaticPodPath string `json:"staticPodPath"`
	}
	if err := yaml.Unmarshal([]byte(kubelet.Data["kubelet"]), &kc); err != nil || kc.Kind != "KubeletConfiguration" || kc.StaticPodPath != "/etc/kubernetes/manifests" {
		t.Errorf("kubelet-config %v (%v): want a KubeletConfiguration under kubelet", kubelet.Data, err)
	}
}

func addonKey(name string) client.ObjectKey {
	return client.ObjectKey{Namespace: "kube-system", Name: name}
}

func addonContainerImage(spec corev1.PodSpec, name string) string {
	for _, c := range spec.Containers {
		if c.Name == name {
			return c.Image
		}
	}
	return ""
}

func addonKubeProxyImage(t *testing.T, w client.Client) string {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := w.Get(context.Background(), addonKey("kube-proxy"), ds); err != nil {
		t.Fatal(err)
	}
	return addonContainerImage(ds.Spec.Template.Spec, "kube-proxy")
}

func addonCoreDNS(t *testing.T, w client.Client) (*appsv1.Deployment, *corev1.ConfigMap) {
	t.Helper()
	dep, cm := &appsv1.Deployment{}, &corev1.ConfigMap{}
	if err := w.Get(context.Background(), addonKey("coredns"), dep); err != nil {
		t.Fatal(err)
	}
	if err := w.Get(context.Background(), addonKey("coredns"), cm); err != nil {
		t.Fatal(err)
	}
	return dep, cm
}

func addonCoreDNSImage(d *appsv1.Deployment) string {
	return addonContainerImage(d.Spec.Template.Spec, "coredns")
}

// addonCoreDNSVolumeKey is the ConfigMap key CoreDNS's config-volume mounts.
func addonCoreDNSVolumeKey(d *appsv1.Deployment) string {
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "config-volume" && v.ConfigMap != nil && v.ConfigMap.Name == "coredns" && len(v.ConfigMap.Items) == 1 {
			return v.ConfigMap.Items[0].Key
		}
	}
	return ""
}

// addonCheckCorefile: the Corefile parses with the migration library KCP uses,
// and every plugin and option in it is one that library knows up to its
// newest CoreDNS release, so KCP can migrate it again.
func addonCheckCorefile(t *testing.T, cf, coreDNSVersion string) {
	t.Helper()
	parsed, err := corefile.New(cf)
	if err != nil {
		t.Fatalf("Corefile does not parse: %v\n%s", err, cf)
	}
	if len(parsed.Servers) == 0 {
		t.Fatalf("Corefile has no server block:\n%s", cf)
	}
	versions := migration.ValidVersions()
	newest := versions[len(versions)-1]
	notices, err := migration.Unsupported(coreDNSVersion, newest, cf)
	if err != nil || len(notices) > 0 {
		t.Errorf("Corefile for CoreDNS %s up to %s: notices %v, %v\n%s", coreDNSVersion, newest, notices, err, cf)
	}
}
