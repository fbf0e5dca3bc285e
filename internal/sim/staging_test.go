package sim_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/corefile-migration/migration"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// TestStagedFindings: each fault that stages a finding of the readiness
// check takes effect where the check looks (the workload API server's
// /metrics, its Nodes, webhooks and EndpointSlices, kube-proxy's pods,
// etcd's alarms as the tool's etcd client reads them, the CoreDNS
// Corefile), leaves the simulator and the tool's view of the control plane
// working, and is undone when the annotation goes. One simulator, the
// subtests in turn.
func TestStagedFindings(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, sim.Options{Replicas: 3}).Sim
	ctx := context.Background()
	c, w := s.ManagementClient(), s.WorkloadClient()
	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, s.ClusterKey(), cluster); err != nil {
		t.Fatal(err)
	}
	machines, err := s.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("deprecated-api-client shows in apiserver_requested_deprecated_apis until undone", func(t *testing.T) {
		if sim.DeprecatedAPIRemovedRelease != "1.37" {
			t.Errorf("removed release %q, want 1.37 (k8s.io/api v0.36.3)", sim.DeprecatedAPIRemovedRelease)
		}
		if got := deprecatedMetric(t, s); got != "" {
			t.Fatalf("before the fault: %s", got)
		}
		setFault(t, c, cluster, "deprecated-api-client")
		awaitApplied(t, c, cluster, "deprecated-api-client")
		got := deprecatedMetric(t, s)
		want := `apiserver_requested_deprecated_apis{group="storage.k8s.io",removed_release="1.37",resource="volumeattributesclasses",subresource="",version="v1beta1"} 1`
		if got != want {
			t.Fatalf("metric %q, want %q", got, want)
		}
		t.Log(got)

		setFault(t, c, cluster, "")
		awaitApplied(t, c, cluster, "")
		if got := deprecatedMetric(t, s); got != "" {
			t.Fatalf("after the undo: %s", got)
		}
	})

	t.Run("old-workers join Ready, kube-proxy unready on them under addon-unready, the webhook intercepting none of it", func(t *testing.T) {
		// The webhook and addon-unready first: the old workers join after.
		setFault(t, c, cluster, "addon-unready,fail-closed-webhook")
		awaitApplied(t, c, cluster, "addon-unready,fail-closed-webhook")

		vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := w.Get(ctx, client.ObjectKey{Name: sim.WebhookName}, vwc); err != nil {
			t.Fatal(err)
		}
		if len(vwc.Webhooks) != 1 || *vwc.Webhooks[0].FailurePolicy != admissionregistrationv1.Fail || vwc.Webhooks[0].ClientConfig.Service.Name != sim.WebhookName {
			t.Fatalf("webhook configuration %+v", vwc.Webhooks)
		}
		oldest := slices.MinFunc(machines, func(a, b clusterv1.Machine) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
		endpoints := webhookEndpoints(t, w)
		if len(endpoints) != 1 || !*endpoints[0].Conditions.Ready || *endpoints[0].NodeName != oldest.Status.NodeRef.Name {
			t.Fatalf("endpoints %+v, want one, ready, on node %s", endpoints, oldest.Status.NodeRef.Name)
		}
		node := &corev1.Node{}
		if err := w.Get(ctx, client.ObjectKey{Name: *endpoints[0].NodeName}, node); err != nil {
			t.Fatal(err)
		}
		if _, ok := node.Labels[workload.ControlPlaneNodeLabel]; !ok {
			t.Fatalf("endpoint's node %s is not a control-plane node: %v", node.Name, node.Labels)
		}

		setFault(t, c, cluster, "addon-unready,fail-closed-webhook,old-workers=v1.32.4")
		awaitApplied(t, c, cluster, "addon-unready,fail-closed-webhook,old-workers=v1.32.4")
		for _, name := range sim.OldWorkerNames() {
			n := &corev1.Node{}
			if err := w.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
				t.Fatal(err)
			}
			_, cp := n.Labels[workload.ControlPlaneNodeLabel]
			if n.Status.NodeInfo.KubeletVersion != "v1.32.4" || cp || n.Spec.ProviderID != "" || len(n.Spec.Taints) != 0 || !readyNode(n) {
				t.Errorf("node %s: kubelet %s, control-plane label %t, providerID %q, taints %v, Ready %t; want v1.32.4, an untainted, Ready worker",
					name, n.Status.NodeInfo.KubeletVersion, cp, n.Spec.ProviderID, n.Spec.Taints, readyNode(n))
			}
		}
		// The stand-in's pod creations pass the fail-closed webhook: its
		// selectors match nothing.
		simtest.Eventually(t, time.Minute, "kube-proxy Running on every node, not Ready on the old workers alone", func(ctx context.Context) (bool, string, error) {
			pods, err := kubeProxyPods(ctx, w)
			if err != nil {
				return false, "", err
			}
			var seen []string
			ok := len(pods) == len(machines)+len(sim.OldWorkerNames())
			for node, pod := range pods {
				wantReady := !slices.Contains(sim.OldWorkerNames(), node)
				ok = ok && pod.Status.Phase == corev1.PodRunning && podIsReady(pod) == wantReady
				seen = append(seen, fmt.Sprintf("%s: %s ready=%t", node, pod.Status.Phase, podIsReady(pod)))
			}
			return ok, strings.Join(seen, ", "), nil
		})
		simtest.Eventually(t, 30*time.Second, "the DaemonSet counting the unready pods", func(ctx context.Context) (bool, string, error) {
			ds := &appsv1.DaemonSet{}
			if err := w.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "kube-proxy"}, ds); err != nil {
				return false, "", err
			}
			st := ds.Status
			return st.DesiredNumberScheduled == 5 && st.NumberReady == 3 && st.NumberUnavailable == 2, fmt.Sprintf("%+v", st), nil
		})

		// Neither the tool nor the simulator takes the workers for
		// control-plane nodes.
		if ok, why, err := s.Ready(ctx); err != nil || !ok {
			t.Errorf("simulator not ready with the old workers: %s %v", why, err)
		}
		wl, err := workload.New(ctx, c, cluster.Namespace, cluster.Name)
		if err != nil {
			t.Fatal(err)
		}
		names := sim.OldWorkerNames()
		for _, m := range machines {
			names = append(names, m.Status.NodeRef.Name)
			if got, err := wl.NodeByProviderID(ctx, m.Spec.ProviderID); err != nil || got != m.Status.NodeRef.Name {
				t.Errorf("node of machine %s by its providerID: %q, %v; want %s", m.Name, got, err, m.Status.NodeRef.Name)
			}
		}
		health, err := wl.Nodes(ctx, names, workload.Components)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if want := !slices.Contains(sim.OldWorkerNames(), name); health[name].Found != want || want && health[name].Problem(workload.Components) != "" {
				t.Errorf("tool's read of node %s: %+v (%s); want found %t", name, health[name], health[name].Problem(workload.Components), want)
			}
		}

		// A new version replaces the old.
		setFault(t, c, cluster, "addon-unready,fail-closed-webhook,old-workers=v1.33.0")
		awaitApplied(t, c, cluster, "addon-unready,fail-closed-webhook,old-workers=v1.33.0")
		for _, name := range sim.OldWorkerNames() {
			n := &corev1.Node{}
			if err := w.Get(ctx, client.ObjectKey{Name: name}, n); err != nil || n.Status.NodeInfo.KubeletVersion != "v1.33.0" {
				t.Errorf("node %s: kubelet %q, %v; want v1.33.0", name, n.Status.NodeInfo.KubeletVersion, err)
			}
		}

		setFault(t, c, cluster, "fail-closed-webhook,old-workers=v1.33.0")
		awaitApplied(t, c, cluster, "fail-closed-webhook,old-workers=v1.33.0")
		simtest.Eventually(t, time.Minute, "every kube-proxy pod Ready after addon-unready's undo", func(ctx context.Context) (bool, string, error) {
			pods, err := kubeProxyPods(ctx, w)
			if err != nil {
				return false, "", err
			}
			var unready []string
			for node, pod := range pods {
				if !podIsReady(pod) {
					unready = append(unready, node)
				}
			}
			return len(pods) == 5 && len(unready) == 0, fmt.Sprintf("%d pods, unready on %v", len(pods), unready), nil
		})

		setFault(t, c, cluster, "")
		awaitApplied(t, c, cluster, "")
		for _, o := range []client.Object{
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: sim.OldWorkerNames()[0]}},
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: sim.OldWorkerNames()[1]}},
			&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: sim.WebhookName}},
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: sim.WebhookNamespace, Name: sim.WebhookName}},
			&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: sim.WebhookNamespace, Name: sim.WebhookName}},
		} {
			if err := w.Get(ctx, client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
				t.Errorf("%T %s after the undo: %v, want it gone", o, o.GetName(), err)
			}
		}
		simtest.Eventually(t, time.Minute, "the old workers' kube-proxy pods gone with them", func(ctx context.Context) (bool, string, error) {
			pods, err := kubeProxyPods(ctx, w)
			return len(pods) == len(machines), fmt.Sprintf("%d pods", len(pods)), err
		})
	})

	t.Run("etcd-alarm raises NOSPACE for the member, the tool reads it unhealthy, the undo disarms it", func(t *testing.T) {
		m := &machines[1]
		node := m.Status.NodeRef.Name
		for _, member := range toolMembers(t, s) {
			if !member.Healthy {
				t.Fatalf("before the fault, member %s: %q", member.Name, member.Errors)
			}
		}
		setFault(t, c, m, "etcd-alarm")
		awaitApplied(t, c, m, "etcd-alarm")
		awaitEvent(t, c, m, "FaultApplied", "NOSPACE alarm raised for etcd member")

		for _, member := range toolMembers(t, s) {
			t.Logf("tool's read: member %s healthy=%t alarms=%v errors=%q", member.Name, member.Healthy, member.Alarms, member.Errors)
			switch {
			case member.Name == node && (member.Healthy || !slices.Equal(member.Alarms, []string{"NOSPACE"})):
				t.Errorf("alarmed member %s: healthy %t, alarms %v; want unhealthy with NOSPACE", member.Name, member.Healthy, member.Alarms)
			case member.Name != node && len(member.Alarms) != 0:
				t.Errorf("member %s: alarms %v, want none of its own", member.Name, member.Alarms)
			}
		}

		setFault(t, c, m, "")
		awaitApplied(t, c, m, "")
		for _, member := range toolMembers(t, s) {
			if !member.Healthy || len(member.Alarms) != 0 {
				t.Errorf("after the undo, member %s: healthy %t, alarms %v, errors %q", member.Name, member.Healthy, member.Alarms, member.Errors)
			}
		}
	})

	t.Run("corefile-unknown-plugin adds a plugin the migration does not know, its undo restores the Corefile", func(t *testing.T) {
		before := corefileOf(t, w)
		setFault(t, c, cluster, "corefile-unknown-plugin")
		awaitApplied(t, c, cluster, "corefile-unknown-plugin")
		after := corefileOf(t, w)
		if !strings.Contains(after, "\n    "+sim.UnknownCorefilePlugin+" example.com\n") {
			t.Fatalf("Corefile without %s:\n%s", sim.UnknownCorefilePlugin, after)
		}
		// Every upgrade between the CoreDNS versions the simulator deploys
		// (kubeadm's for v1.33 to v1.36): the library reports the plugin as
		// unsupported, and Migrate, as KCP calls it, carries it over
		// without an error.
		var tags []string
		for _, v := range []string{"v1.33.0", "v1.34.0", "v1.35.0", "v1.36.0"} {
			tag, err := sim.CoreDNSVersion(v)
			if err != nil {
				t.Fatal(err)
			}
			tags = append(tags, strings.TrimPrefix(tag, "v"))
		}
		for i, from := range tags {
			for _, to := range tags[i+1:] {
				if notices, err := migration.Unsupported(from, to, before); err != nil || len(notices) != 0 {
					t.Errorf("%s to %s, the simulator's own Corefile: unsupported %v, %v", from, to, notices, err)
				}
				notices, err := migration.Unsupported(from, to, after)
				if err != nil || !slices.ContainsFunc(notices, func(n migration.Notice) bool { return n.Plugin == sim.UnknownCorefilePlugin }) {
					t.Errorf("%s to %s: unsupported %v, %v; want %s", from, to, notices, err, sim.UnknownCorefilePlugin)
				}
				migrated, err := migration.Migrate(from, to, after, false)
				if err != nil || !strings.Contains(migrated, sim.UnknownCorefilePlugin+" example.com") {
					t.Errorf("%s to %s: Migrate %v, the plugin kept %t", from, to, err, strings.Contains(migrated, sim.UnknownCorefilePlugin))
				}
			}
		}

		setFault(t, c, cluster, "")
		awaitApplied(t, c, cluster, "")
		if got := corefileOf(t, w); got != before {
			t.Fatalf("Corefile after the undo:\n%s\nwant:\n%s", got, before)
		}
	})
}

// deprecatedMetric is the workload API server's
// apiserver_requested_deprecated_apis line for sim.DeprecatedAPI, "" when
// there is none.
func deprecatedMetric(t *testing.T, s *sim.Sim) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(s.WorkloadConfig())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(raw)) {
		if strings.HasPrefix(line, "apiserver_requested_deprecated_apis{") && strings.Contains(line, `resource="`+sim.DeprecatedAPI.Resource+`"`) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

func webhookEndpoints(t *testing.T, w client.Client) []discoveryv1.Endpoint {
	t.Helper()
	list := &discoveryv1.EndpointSliceList{}
	if err := w.List(context.Background(), list, client.InNamespace(sim.WebhookNamespace), client.MatchingLabels{discoveryv1.LabelServiceName: sim.WebhookName}); err != nil {
		t.Fatal(err)
	}
	var out []discoveryv1.Endpoint
	for _, slice := range list.Items {
		out = append(out, slice.Endpoints...)
	}
	return out
}

// kubeProxyPods are the kube-proxy DaemonSet's pods by node.
func kubeProxyPods(ctx context.Context, w client.Client) (map[string]*corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := w.List(ctx, pods, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{"k8s-app": "kube-proxy"}); err != nil {
		return nil, err
	}
	out := map[string]*corev1.Pod{}
	for i := range pods.Items {
		out[pods.Items[i].Spec.NodeName] = &pods.Items[i]
	}
	return out, nil
}

func podIsReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func readyNode(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// toolMembers reads the etcd members as the tool does (package etcd), at
// each node's address.
func toolMembers(t *testing.T, s *sim.Sim) []etcd.Member {
	t.Helper()
	ctx := context.Background()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := s.ManagementClient().Get(ctx, s.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	creds, err := etcd.LoadCredentials(ctx, s.ManagementClient(), s.ClusterKey(), kcp)
	if err != nil {
		t.Fatal(err)
	}
	dialer, err := etcd.NewDirectDialer("https://{{.NodeIP}}:2379")
	if err != nil {
		t.Fatal(err)
	}
	ec, err := etcd.New(etcd.Config{Dialer: dialer, Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	var nodes []etcd.Node
	for _, n := range s.Nodes() {
		nodes = append(nodes, etcd.Node{Name: n.Name, IP: n.IP})
	}
	members, err := ec.Members(ctx, nodes)
	if err != nil {
		t.Fatal(err)
	}
	return members
}

func corefileOf(t *testing.T, w client.Client) string {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := w.Get(context.Background(), client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "coredns"}, cm); err != nil {
		t.Fatal(err)
	}
	return cm.Data["Corefile"]
}
