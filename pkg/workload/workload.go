// Package workload answers "is this control-plane node healthy?" for a workload
// cluster: it connects with the cluster's <cluster>-kubeconfig Secret, as CAPI's
// controllers do, and reads Nodes and their static control-plane pods live.
// Those live reads, not the Machine conditions KCP sets (which freeze while KCP
// is paused), are what the rollout's health guards look at.
package workload

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"k8s.io/client-go/util/flowcontrol"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/controllers/noderefutil"
)

// Components are the static pods kubeadm runs on every control-plane node, named
// <component>-<node> in kube-system. etcd is left out when etcd is external.
var Components = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// EtcdComponent is the static pod of a stacked etcd member.
const EtcdComponent = "etcd"

// Client reads one workload cluster.
type Client struct {
	Config *rest.Config
	Kube   Kube
	// Watching is Kube for watches: Config's timeout (Cluster API's 10 s for
	// a workload cluster) bounds a whole request, a watch's stream included,
	// and would end every watch after 10 s.
	Watching Kube
	// Name is namespace/cluster, for messages.
	Name string
}

// New connects to the workload cluster of namespace/cluster through its
// kubeconfig Secret on the management cluster. A kubeconfig there that holds
// anything but embedded credentials is refused (exit code Unsafe) before any
// client is built: see restConfigFromSecret.
func New(ctx context.Context, mgmt client.Reader, namespace, cluster string, wrap ...transport.WrapperFunc) (*Client, error) {
	cfg, err := restConfigFromSecret(ctx, mgmt, client.ObjectKey{Namespace: namespace, Name: cluster})
	if err != nil {
		return nil, err
	}
	for _, w := range wrap {
		cfg.Wrap(w)
	}
	// A rollout reads a handful of objects per step; client-go's default of 5
	// requests a second would make every snapshot wait on the limiter.
	cfg.QPS, cfg.Burst = 50, 100
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	c.Name = namespace + "/" + cluster
	return c, nil
}

// watchTimeout bounds a request of Client.Watching. An informer's watch asks
// the API server to end it after 5 to 10 minutes (client-go's reflector), so
// the bound ends none of them and still ends a list that hangs. Cluster
// API's cluster cache sets the same for its informers.
const watchTimeout = 11 * time.Minute

func newClient(cfg *rest.Config) (*Client, error) {
	kube, err := newKube(cfg)
	if err != nil {
		return nil, err
	}
	watchCfg := rest.CopyConfig(cfg)
	watchCfg.Timeout = watchTimeout
	watching, err := newKube(watchCfg)
	if err != nil {
		return nil, err
	}
	return &Client{Config: cfg, Kube: kube, Watching: watching}, nil
}

// Kube is the part of client-go's clientset the tool uses on a workload
// cluster; *kubernetes.Clientset (and its fake) implement it. Building only
// these two typed clients, not the whole clientset, keeps every other API
// group's client out of the binary.
type Kube interface {
	CoreV1() corev1client.CoreV1Interface
	AppsV1() appsv1client.AppsV1Interface
}

type kube struct {
	core *corev1client.CoreV1Client
	apps *appsv1client.AppsV1Client
}

func (k *kube) CoreV1() corev1client.CoreV1Interface { return k.core }
func (k *kube) AppsV1() appsv1client.AppsV1Interface { return k.apps }

// newKube builds the typed clients as kubernetes.NewForConfig does: on one
// HTTP client and one rate limiter.
func newKube(cfg *rest.Config) (*kube, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	core, err := corev1client.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	apps, err := appsv1client.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	return &kube{core: core, apps: apps}, nil
}

// Node is the health of one control-plane node as read just now.
type Node struct {
	Name       string
	Found      bool
	Ready      bool
	InternalIP string
	// Pods maps each static-pod component to whether its pod exists and is Ready.
	Pods map[string]bool
}

// Problem names the first thing wrong with the node, or "" when it is healthy.
func (n Node) Problem(components []string) string {
	switch {
	case !n.Found:
		return fmt.Sprintf("node %s not found among the control-plane nodes (label %s)", n.Name, ControlPlaneNodeLabel)
	case !n.Ready:
		return fmt.Sprintf("node %s not Ready", n.Name)
	}
	for _, c := range components {
		if !n.Pods[c] {
			return fmt.Sprintf("static pod %s-%s not Ready", c, n.Name)
		}
	}
	return ""
}

// NodeByProviderID names the node whose spec.providerID is providerID, "" when
// not exactly one has it. It lists every node (the API server offers no field
// selector on providerID), so it is only for the rare machine whose nodeRef
// was never set.
func (c *Client) NodeByProviderID(ctx context.Context, providerID string) (string, error) {
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("workload cluster %s: listing nodes: %w", c.Name, err)
	}
	var found []string
	for _, n := range nodes.Items {
		if n.Spec.ProviderID == providerID {
			found = append(found, n.Name)
		}
	}
	if len(found) != 1 {
		return "", nil
	}
	return found[0], nil
}

// ControlPlaneNodeLabel marks a control-plane node: kubeadm sets it when a
// control-plane node joins, and KCP finds the control plane's nodes by it.
const ControlPlaneNodeLabel = "node-role.kubernetes.io/control-plane"

// StaticPodSelector selects kubeadm's static control-plane pods.
const StaticPodSelector = "tier=control-plane"

// Nodes reads each named node and its static pods: one list of the
// control-plane nodes and one of kube-system's control-plane pods, whatever
// the number of machines (a snapshot is read before every step, and on a
// large cluster the other nodes and kube-system pods are many). A node that is
// not among the control-plane nodes, or a pod that does not exist, is reported
// as such, not as an error: it is a state to wait on. The two lists are
// read side by side.
func (c *Client) Nodes(ctx context.Context, names []string, components []string) (map[string]Node, error) {
	var (
		nodes *corev1.NodeList
		pods  *corev1.PodList
		g     errgroup.Group
	)
	g.Go(func() (err error) {
		if nodes, err = c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: ControlPlaneNodeLabel}); err != nil {
			return fmt.Errorf("workload cluster %s: listing control-plane nodes: %w", c.Name, err)
		}
		return nil
	})
	g.Go(func() (err error) {
		if pods, err = c.Kube.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{LabelSelector: StaticPodSelector}); err != nil {
			return fmt.Errorf("workload cluster %s: listing static control-plane pods: %w", c.Name, err)
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return Health(pointers(nodes.Items), pointers(pods.Items), names, components), nil
}

// Health is the health of each named node and its static pods, from the
// control-plane nodes and static pods there are (selected by
// ControlPlaneNodeLabel and StaticPodSelector): read live by Nodes, or from
// the watches' caches. Only names, nodes' Ready condition and addresses, and
// pods' node, phase, deletion and Ready condition are looked at.
func Health(nodes []*corev1.Node, pods []*corev1.Pod, names []string, components []string) map[string]Node {
	out := make(map[string]Node, len(names))
	for _, name := range names {
		out[name] = Node{Name: name, Pods: map[string]bool{}}
	}
	for _, node := range nodes {
		n, ok := out[node.Name]
		if !ok {
			continue
		}
		n.Found = true
		n.Ready = noderefutil.IsNodeReady(node)
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				n.InternalIP = a.Address
				break
			}
		}
		for _, comp := range components {
			n.Pods[comp] = false
		}
		out[node.Name] = n
	}
	for _, pod := range pods {
		n, ok := out[pod.Spec.NodeName]
		if !ok || !n.Found {
			continue
		}
		if comp, ok := strings.CutSuffix(pod.Name, "-"+n.Name); ok && slices.Contains(components, comp) {
			n.Pods[comp] = podReady(pod)
		}
	}
	return out
}

func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
