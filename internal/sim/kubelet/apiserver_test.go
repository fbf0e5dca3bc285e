package kubelet_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/streaming/pkg/httpstream"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

// envtestAssets finds the kube-apiserver and etcd binaries as the simulator
// does. Missing binaries fail the test: a skipped end-to-end check proves
// nothing.
func envtestAssets(t *testing.T) string {
	t.Helper()
	dir, err := member.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

type simNode struct {
	name, ip, tag string
}

// TestPortForwardThroughAPIServer drives a real kube-apiserver's
// pods/portforward to two kubelet stand-ins and checks that each etcd pod's
// port reaches its own node's target, with every dialer the tool, kubectl and
// KCP use. The API server runs with envtest's flags only: none are added.
func TestPortForwardThroughAPIServer(t *testing.T) {
	// A busy two-core machine can take longer than envtest's 20 s default to
	// start a kube-apiserver; the simulator allows a minute too.
	env := &envtest.Environment{BinaryAssetsDirectory: envtestAssets(t), ControlPlaneStartTimeout: time.Minute, ControlPlaneStopTimeout: time.Minute}
	start := time.Now()
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping kube-apiserver: %v", err)
		}
	})
	t.Logf("kube-apiserver up in %s", time.Since(start).Round(time.Millisecond))
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := t.Context()

	// The API server creates kube-system itself shortly after it starts;
	// creating it here as well removes the race without masking anything.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kube-system namespace: %v", err)
	}

	nodes := []simNode{
		{name: "wl-node-a", ip: "127.0.0.221", tag: "member-a"},
		{name: "wl-node-b", ip: "127.0.0.222", tag: "member-b"},
	}
	for _, n := range nodes {
		target := startEcho(t, n.ip, n.tag)
		srv := startStandIn(t, n.ip, routes(map[string]string{
			fmt.Sprintf("kube-system/etcd-%s:%d", n.name, etcdPort): target,
		}))
		registerNode(t, cs, n, srv.Port())
	}

	portForwardURL := func(pod string) *url.URL {
		return cs.CoreV1().RESTClient().Post().Resource("pods").Namespace("kube-system").
			Name(pod).SubResource("portforward").URL()
	}
	for _, n := range nodes {
		u := portForwardURL("etcd-" + n.name)
		t.Run(n.name+"/websocket", func(t *testing.T) {
			// Tunnelled WebSocket only, no fallback: proves the API server
			// translates it to SPDY for a node without ExtendWebSocketsToKubelet.
			roundTrip(t, forwardLocal(t, websocketDialer(t, cfg, u)), n.tag, "over websocket", "twice")
		})
		t.Run(n.name+"/spdy", func(t *testing.T) {
			roundTrip(t, forwardLocal(t, spdyDialer(t, cfg, u)), n.tag, "over spdy")
		})
		t.Run(n.name+"/kubectl-fallback", func(t *testing.T) {
			roundTrip(t, forwardLocal(t, fallbackDialer(t, cfg, u)), n.tag, "as kubectl does")
		})
	}

	// The pitfall the package comment warns about, pinned down: a Node that
	// declares ExtendWebSocketsToKubelet gets the WebSocket upgrade passed
	// through, the stand-in refuses it, and only SPDY (or kubectl's fallback
	// to it) works.
	t.Run("node declaring ExtendWebSocketsToKubelet", func(t *testing.T) {
		n := simNode{name: "wl-node-c", ip: "127.0.0.223", tag: "member-c"}
		target := startEcho(t, n.ip, n.tag)
		srv := startStandIn(t, n.ip, routes(map[string]string{
			fmt.Sprintf("kube-system/etcd-%s:%d", n.name, etcdPort): target,
		}))
		registerNode(t, cs, n, srv.Port(), "ExtendWebSocketsToKubelet")
		u := portForwardURL("etcd-" + n.name)

		_, _, err := websocketDialer(t, cfg, u).Dial(portforward.PortForwardProtocolV1Name)
		if !httpstream.IsUpgradeFailure(err) || !strings.Contains(err.Error(), "ExtendWebSocketsToKubelet") {
			t.Fatalf("websocket to a node declaring the feature: err = %v, want the stand-in's refusal", err)
		}
		roundTrip(t, forwardLocal(t, fallbackDialer(t, cfg, u)), n.tag, "fell back to spdy")
	})

	t.Run("unrouted port reports the stand-in's error", func(t *testing.T) {
		msg := forwardError(t, websocketDialer(t, cfg, portForwardURL("etcd-"+nodes[0].name)), 2380)
		if !strings.Contains(msg, "no target for port 2380 of pod kube-system/etcd-wl-node-a") {
			t.Fatalf("error stream = %q", msg)
		}
	})
}

// registerNode creates the Node and its etcd mirror pod the way the simulator
// must: addresses and kubelet port through nodes/status, the pod bound to the
// node and Running through pods/status.
func registerNode(t *testing.T, cs kubernetes.Interface, n simNode, kubeletPort int, declaredFeatures ...string) {
	t.Helper()
	ctx := t.Context()
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", n.name, err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.ip}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(kubeletPort)
	node.Status.DeclaredFeatures = declaredFeatures
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node %s status: %v", n.name, err)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "kube-system",
			Name:      "etcd-" + n.name,
			// A mirror pod, as the kubelet creates for a static pod; it needs
			// no service account, so no controller has to have run.
			Annotations: map[string]string{"kubernetes.io/config.mirror": "sim"},
			Labels:      map[string]string{"component": "etcd", "tier": "control-plane"},
		},
		Spec: corev1.PodSpec{
			NodeName:   n.name,
			Containers: []corev1.Container{{Name: "etcd", Image: "registry.k8s.io/etcd:3.6.14-0"}},
		},
	}
	// The namespace may still be initialising right after the API server
	// starts; retry briefly rather than sleep.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		created, err := cs.CoreV1().Pods("kube-system").Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Logf("create pod %s: %v (retrying)", pod.Name, err)
			return false, nil
		}
		pod = created
		return true, nil
	})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := cs.CoreV1().Pods("kube-system").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("pod %s status: %v", pod.Name, err)
	}
}
