package sim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/cp-rollout/cp-rollout/internal/sim/kubelet"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

// This file is the simulated part of the simulator: an infrastructure and
// bootstrap provider whose "machines" are a Node object, four mirror pods, a
// kubelet stand-in and a real etcd member on a loopback address of their own.
// Everything it talks to — API servers, Machine and KCP controllers, etcd — is
// real.

const (
	// providerFinalizer holds an InfraMachine until its simulated host is gone,
	// so deletion takes DeleteDelay as a real provider's would.
	providerFinalizer = "sim.cp-rollout.io/machine"

	// pollInterval is how often an InfraMachine waiting for a capacity slot
	// looks again.
	pollInterval = 500 * time.Millisecond

	etcdImageTag = "3.6.14-0"
)

// Components are the kubeadm static pods of a control-plane node, by their
// `component` label; each runs as the mirror pod <component>-<node>.
var Components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// Node is one simulated control-plane host.
type Node struct {
	// Name is the workload Node's name; it differs from the Machine's.
	Name string
	// Machine is the name of the Machine (and InfraMachine) it belongs to.
	Machine string
	// IP is the node's loopback address: its InternalIP, kubelet stand-in and
	// etcd member listen there.
	IP string
	// ProviderID links the Node, the InfraMachine and the Machine.
	ProviderID string
	// EtcdClientURL is the node's etcd member's client URL.
	EtcdClientURL string

	slotSince   time.Time
	stuck       bool
	provisioned bool
	kubelet     *kubelet.Server
	member      *member.Member
}

type provider struct {
	s       *Sim
	c       client.Client // uncached, for writes and fresh reads
	dataDir string

	mu                 sync.Mutex
	nodes              map[string]*Node // by InfraMachine name
	usedIPs            map[int]bool
	nextIP             int
	neverProvisionNext bool

	apiServerCert *apiServerCertServer
}

func (s *Sim) newProviderManager() (ctrl.Manager, error) {
	dataDir, err := os.MkdirTemp("", "cp-rollout-sim-")
	if err != nil {
		return nil, err
	}
	p := &provider{
		s:       s,
		c:       s.mgmt,
		dataDir: dataDir,
		nodes:   map[string]*Node{},
		usedIPs: map[int]bool{},
		nextIP:  2,
	}
	s.provider = p
	if p.apiServerCert, err = startAPIServerCertServer(context.Background(), s.mgmt, s.ClusterKey()); err != nil {
		return nil, err
	}

	// The provider serves its own Cluster's machines only: a management
	// cluster hosts other clusters, simulated ones with providers of their
	// own (in this namespace too) and inert ones that nothing provisions.
	// What it watches carries the Cluster's name label: Machines from their
	// webhook, InfraMachines and the infrastructure cluster from their
	// creator (KCP, a MachineSet, the topology controller) or, at the latest,
	// together with the owner reference the provider waits for.
	infraMachine := &unstructured.Unstructured{}
	infraMachine.SetGroupVersionKind(infraMachineGVK)
	infraCluster := &unstructured.Unstructured{}
	infraCluster.SetGroupVersionKind(infraClusterGVK)
	ownCluster := ctrlcache.ByObject{Label: labels.SelectorFromSet(labels.Set{clusterv1.ClusterNameLabel: s.opts.ClusterName})}
	cacheOpts := ctrlcache.Options{
		DefaultNamespaces: map[string]ctrlcache.Config{s.opts.Namespace: {}},
		ByObject: map[client.Object]ctrlcache.ByObject{
			infraMachine:         ownCluster,
			infraCluster:         ownCluster,
			&clusterv1.Machine{}: ownCluster,
		},
	}
	mgr, err := ctrl.NewManager(s.mgmtConfig, managerOptions(s.opts.Log, "simulated-provider", cacheOpts, client.Options{}))
	if err != nil {
		return nil, err
	}
	// One worker: an etcd member joins as a learner and etcd allows one
	// learner at a time, so nodes come up one after another, as kubeadm join
	// serialises them in production.
	err = builder.ControllerManagedBy(mgr).
		Named("simulated-infrastructure").
		For(infraMachine).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(infraMachineOf)).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(p)
	if err != nil {
		return nil, err
	}
	err = builder.ControllerManagedBy(mgr).
		Named("simulated-infrastructure-cluster").
		For(infraCluster).
		Complete(reconcile.Func(p.reconcileCluster))
	if err != nil {
		return nil, err
	}
	return mgr, s.setupFaultController(mgr)
}

// reconcileCluster provisions the Cluster's infrastructure cluster, as a
// provider does once the Cluster owns it: there is nothing to build, only
// the control-plane failure domains to report.
func (p *provider) reconcileCluster(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ic := &unstructured.Unstructured{}
	ic.SetGroupVersionKind(infraClusterGVK)
	if err := p.c.Get(ctx, req.NamespacedName, ic); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	owned := false
	for _, o := range ic.GetOwnerReferences() {
		owned = owned || (o.Kind == "Cluster" && o.Name == p.s.opts.ClusterName)
	}
	if !p.s.ownObject(ic) || !owned || !ic.GetDeletionTimestamp().IsZero() {
		return reconcile.Result{}, nil
	}
	if done, _, _ := unstructured.NestedBool(ic.Object, "status", "initialization", "provisioned"); done {
		return reconcile.Result{}, nil
	}
	patch := client.MergeFrom(ic.DeepCopy())
	if err := unstructured.SetNestedField(ic.Object, true, "status", "initialization", "provisioned"); err != nil {
		return reconcile.Result{}, err
	}
	var domains []any
	for _, fd := range p.s.failureDomains() {
		domains = append(domains, map[string]any{"name": fd.Name, "controlPlane": true})
	}
	if len(domains) > 0 {
		if err := unstructured.SetNestedSlice(ic.Object, domains, "status", "failureDomains"); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, p.c.Status().Patch(ctx, ic, patch)
}

// ownObject reports whether a management-cluster object belongs to the
// simulator's Cluster: in its namespace and labelled with its name.
func (s *Sim) ownObject(o client.Object) bool {
	return o.GetNamespace() == s.opts.Namespace && o.GetLabels()[clusterv1.ClusterNameLabel] == s.opts.ClusterName
}

// infraMachineOf maps a Machine to its InfraMachine, as providers do to see
// the Machine's bootstrap data arrive.
func infraMachineOf(_ context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*clusterv1.Machine)
	if !ok || m.Spec.InfrastructureRef.Kind != infraMachineGVK.Kind {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}}}
}

// Reconcile moves one InfraMachine towards its simulated state.
func (p *provider) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	im := &unstructured.Unstructured{}
	im.SetGroupVersionKind(infraMachineGVK)
	if err := p.c.Get(ctx, req.NamespacedName, im); err != nil {
		if apierrors.IsNotFound(err) {
			p.forget(req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	// The request may come from a Machine; the InfraMachine it names is read
	// afresh, past the cache's filter.
	if !p.s.ownObject(im) {
		return reconcile.Result{}, nil
	}

	if !im.GetDeletionTimestamp().IsZero() {
		return p.reconcileDelete(ctx, im)
	}

	if !controllerutil.ContainsFinalizer(im, providerFinalizer) {
		patch := client.MergeFrom(im.DeepCopy())
		controllerutil.AddFinalizer(im, providerFinalizer)
		if err := p.c.Patch(ctx, im, patch); err != nil {
			return reconcile.Result{}, err
		}
	}

	// Like a real provider, act only on InfraMachines a Machine controls:
	// the Machine controller sets that owner reference once it sees both.
	owner := metav1.GetControllerOf(im)
	if owner == nil || owner.Kind != "Machine" {
		return reconcile.Result{}, nil
	}
	machine := &clusterv1.Machine{}
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: im.GetNamespace(), Name: owner.Name}, machine); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}

	node, wait := p.claimSlot(im.GetName(), machine.Name)
	if node == nil {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	if node.stuck || node.provisioned {
		return reconcile.Result{}, nil
	}
	// Like every infrastructure provider, boot only once the bootstrap
	// provider has written the machine's bootstrap data (the watch on
	// Machines brings us back when it has).
	if machine.Spec.Bootstrap.DataSecretName == nil {
		return reconcile.Result{}, nil
	}
	if remaining := time.Until(node.slotSince.Add(p.s.opts.ProvisionDelay)); remaining > 0 {
		return reconcile.Result{RequeueAfter: remaining}, nil
	}
	if err := p.provision(ctx, im, machine, node); err != nil {
		return reconcile.Result{}, fmt.Errorf("provisioning %s: %w", im.GetName(), err)
	}
	return reconcile.Result{}, nil
}

// claimSlot returns the node for an InfraMachine, taking a capacity slot and
// an address for it the first time; nil means it waits for a slot.
func (p *provider) claimSlot(infraMachine, machine string) (*Node, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n, ok := p.nodes[infraMachine]; ok {
		return n, 0
	}
	if p.neverProvisionNext {
		p.neverProvisionNext = false
		n := &Node{Machine: machine, stuck: true}
		p.nodes[infraMachine] = n
		return n, 0
	}
	used := 0
	for _, n := range p.nodes {
		if !n.stuck {
			used++
		}
	}
	if c := p.s.opts.Capacity; c > 0 && used >= c {
		return nil, pollInterval
	}
	last := p.allocateIP()
	if last == 0 {
		return nil, pollInterval
	}
	n := &Node{Machine: machine, slotSince: time.Now()}
	p.setAddress(n, last)
	p.nodes[infraMachine] = n
	return n, 0
}

// moveAddress gives a node whose address is in use elsewhere a new address
// and name; the old address stays marked used so it is not tried again.
func (p *provider) moveAddress(n *Node) {
	p.mu.Lock()
	defer p.mu.Unlock()
	last := p.allocateIP()
	if last == 0 {
		return
	}
	p.setAddress(n, last)
}

func (p *provider) setAddress(n *Node, last int) {
	n.IP = fmt.Sprintf("%s.%d", p.s.opts.addressPrefix(), last)
	n.Name = "ip-" + strings.ReplaceAll(n.IP, ".", "-")
	n.ProviderID = fmt.Sprintf("sim://%s/%s", p.s.opts.ClusterName, n.Name)
}

// allocateIP returns the next unused last octet, cycling through 2..254 so a
// freed address is reused as late as possible; 0 means none is free.
func (p *provider) allocateIP() int {
	for range 253 {
		candidate := p.nextIP
		p.nextIP++
		if p.nextIP > 254 {
			p.nextIP = 2
		}
		if !p.usedIPs[candidate] {
			p.usedIPs[candidate] = true
			return candidate
		}
	}
	return 0
}

// provision brings a node up in the order a real host does — static pods and
// etcd before the kubelet registers the Node as Ready — and then reports the
// InfraMachine provisioned: Node first, then spec.providerID, then
// status.initialization.provisioned, so the Machine controller finds the Node
// by providerID as soon as it looks.
func (p *provider) provision(ctx context.Context, im *unstructured.Unstructured, machine *clusterv1.Machine, n *Node) error {
	w := p.s.workload
	version := machine.Spec.Version
	// The host boots the image its InfraMachine names, as KCP or a
	// MachineSet cloned it from the machine template: a new image reaches a
	// node only through a new machine.
	image := InfraMachineImage(im)
	if image == "" {
		image = noImage
	}
	// A worker (kubeadm join without --control-plane) runs no etcd member
	// and no static pods, and its Node carries no control-plane role.
	controlPlane := util.IsControlPlaneMachine(machine)

	// The member starts before anything names the node: when its address is
	// taken by a process outside the simulator, the node moves to another
	// address and name without leaving objects behind.
	if controlPlane {
		if err := p.startMember(ctx, n); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use") {
				p.moveAddress(n)
			}
			return err
		}
	}

	node := &corev1.Node{}
	err := w.Get(ctx, client.ObjectKey{Name: n.Name}, node)
	if apierrors.IsNotFound(err) {
		node = &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:   n.Name,
				Labels: map[string]string{corev1.LabelHostname: n.Name, corev1.LabelOSStable: "linux"},
			},
			Spec: corev1.NodeSpec{ProviderID: n.ProviderID},
		}
		if controlPlane {
			node.Labels["node-role.kubernetes.io/control-plane"] = ""
			node.Labels["node.kubernetes.io/exclude-from-external-load-balancers"] = ""
			node.Spec.Taints = []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
		}
		err = w.Create(ctx, node)
	}
	if err != nil {
		return fmt.Errorf("creating Node %s: %w", n.Name, err)
	}

	if controlPlane {
		if err := p.ensureStaticPods(ctx, n, version); err != nil {
			return err
		}
	}
	if n.kubelet == nil {
		ip := n.IP
		apiServer := p.apiServerCert.addr
		memberAddr := strings.TrimPrefix(n.EtcdClientURL, "https://")
		nodeName := n.Name
		srv, err := kubelet.Start(context.Background(), kubelet.Config{
			IP: ip,
			Forward: func(namespace, pod string, port int32) (string, bool) {
				if namespace != metav1.NamespaceSystem {
					return "", false
				}
				switch {
				case pod == "etcd-"+nodeName && port == member.DefaultClientPort:
					return memberAddr, true
				case pod == "kube-apiserver-"+nodeName && port == 6443:
					return apiServer, true
				}
				return "", false
			},
		})
		if err != nil {
			return fmt.Errorf("starting the kubelet stand-in for %s: %w", n.Name, err)
		}
		n.kubelet = srv
	}

	now := metav1.Now()
	node.Status = corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IP}},
		// What a healthy kubelet reports; the Machine controller's NodeHealthy
		// condition (and so the Machine's Ready) waits for all four.
		Conditions:      kubelet.NodeConditions(now),
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(n.kubelet.Port())}},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion:          version,
			OSImage:                 image,
			OperatingSystem:         "linux",
			Architecture:            "amd64",
			ContainerRuntimeVersion: "containerd://2.0.0",
		},
		Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("110"),
		},
		Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("110"),
		},
	}
	if err := w.Status().Update(ctx, node); err != nil {
		return fmt.Errorf("setting status of Node %s: %w", n.Name, err)
	}
	if err := liftNotReadyTaint(ctx, w, n.Name); err != nil {
		return err
	}

	patch := client.MergeFrom(im.DeepCopy())
	if err := unstructured.SetNestedField(im.Object, n.ProviderID, "spec", "providerID"); err != nil {
		return err
	}
	if err := p.c.Patch(ctx, im, patch); err != nil {
		return fmt.Errorf("setting providerID: %w", err)
	}
	statusPatch := client.MergeFrom(im.DeepCopy())
	if err := unstructured.SetNestedField(im.Object, true, "status", "initialization", "provisioned"); err != nil {
		return err
	}
	if err := unstructured.SetNestedSlice(im.Object, []any{
		map[string]any{"type": string(clusterv1.MachineInternalIP), "address": n.IP},
		map[string]any{"type": string(clusterv1.MachineHostName), "address": n.Name},
	}, "status", "addresses"); err != nil {
		return err
	}
	if err := unstructured.SetNestedField(im.Object, image, "status", "image"); err != nil {
		return err
	}
	if err := p.c.Status().Patch(ctx, im, statusPatch); err != nil {
		return fmt.Errorf("marking provisioned: %w", err)
	}
	p.mu.Lock()
	n.provisioned = true
	p.mu.Unlock()
	p.s.opts.Log.Info("simulated machine provisioned", "machine", machine.Name, "node", n.Name, "ip", n.IP)
	return nil
}

// noImage is the OS image a host reports when its machine template names
// none: a template written by hand without spec.template.spec.image.
const noImage = "sim-image-none"

// InfraMachineImage is the machine image an InfraMachine of the generic
// infrastructure provider names in spec.image, cloned from its template's
// spec.template.spec.image; "" when it names none. The simulated provider
// boots the host from it and reports it in the InfraMachine's status.image
// and the Node's status.nodeInfo.osImage.
func InfraMachineImage(im *unstructured.Unstructured) string {
	image, _, _ := unstructured.NestedString(im.Object, "spec", "image")
	return image
}

// liftNotReadyTaint removes the node.kubernetes.io/not-ready taint the API
// server puts on every new Node, as kube-controller-manager's node lifecycle
// controller does once the kubelet reports Ready: no controller manager runs
// here, and pods without a toleration for it (CoreDNS's) would never be
// scheduled.
func liftNotReadyTaint(ctx context.Context, w client.Client, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := w.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
		kept := node.Spec.Taints[:0]
		for _, t := range node.Spec.Taints {
			if t.Key != corev1.TaintNodeNotReady {
				kept = append(kept, t)
			}
		}
		if len(kept) == len(node.Spec.Taints) {
			return nil
		}
		node.Spec.Taints = kept
		return w.Patch(ctx, node, patch)
	})
}

// startMember starts the node's etcd member: the first one bootstraps the
// cluster (kubeadm init), later ones join through the running members as a
// learner and are promoted (kubeadm join).
func (p *provider) startMember(ctx context.Context, n *Node) error {
	if n.member != nil {
		return nil
	}
	ca, err := p.etcdCASecret(ctx)
	if err != nil {
		return err
	}
	var existing []string
	p.mu.Lock()
	for _, other := range p.nodes {
		if other != n && other.member != nil && !memberStopped(other.member) {
			existing = append(existing, other.member.ClientURL())
		}
	}
	p.mu.Unlock()
	sort.Strings(existing)
	dir := filepath.Join(p.dataDir, n.Name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	m, err := member.Start(startCtx, member.Config{
		Name:               n.Name,
		IP:                 n.IP,
		ClientPort:         member.DefaultClientPort,
		PeerPort:           member.DefaultPeerPort,
		CACert:             ca.Data[secret.TLSCrtDataName],
		CAKey:              ca.Data[secret.TLSKeyDataName],
		DataDir:            dir,
		ExistingClientURLs: existing,
		// etcd's own heartbeat and election timing, as kubeadm runs it: faster
		// ticks only burned CPU that several simulators side by side need.
		UnsafeNoFsync: true,
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	n.member = m
	n.EtcdClientURL = m.ClientURL()
	p.mu.Unlock()
	return nil
}

func memberStopped(m *member.Member) bool {
	select {
	case <-m.Stopped():
		return true
	default:
		return false
	}
}

// etcdCASecret reads the cluster's etcd CA, the <cluster>-etcd Secret.
func (p *provider) etcdCASecret(ctx context.Context) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	name := secret.Name(p.s.opts.ClusterName, secret.EtcdCA)
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: p.s.opts.Namespace, Name: name}, s); err != nil {
		return nil, fmt.Errorf("reading the etcd CA: %w", err)
	}
	return s, nil
}

// ensureStaticPods creates the node's kubeadm static pods as the kubelet
// would: mirror pods (the annotation must be there at creation; drain skips
// mirror pods and the ServiceAccount admission leaves them alone), bound to the
// node, then Running and Ready through pods/status.
func (p *provider) ensureStaticPods(ctx context.Context, n *Node, version string) error {
	for _, component := range Components {
		if err := p.ensureStaticPod(ctx, n, component, version); err != nil {
			return err
		}
	}
	return nil
}

func (p *provider) ensureStaticPod(ctx context.Context, n *Node, component, version string) error {
	w := p.s.workload
	image := "registry.k8s.io/" + component + ":" + version
	if component == "etcd" {
		image = "registry.k8s.io/etcd:" + etcdImageTag
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceSystem,
			Name:      component + "-" + n.Name,
			Labels:    map[string]string{"component": component, "tier": "control-plane"},
			Annotations: map[string]string{
				corev1.MirrorPodAnnotationKey:   "sim-" + n.Name + "-" + component,
				"kubernetes.io/config.hash":     "sim-" + n.Name + "-" + component,
				"kubernetes.io/config.source":   "file",
				"kubeadm.kubernetes.io/version": version,
			},
		},
		Spec: corev1.PodSpec{
			NodeName:          n.Name,
			HostNetwork:       true,
			PriorityClassName: "system-node-critical",
			Containers:        []corev1.Container{{Name: component, Image: image}},
			Tolerations:       []corev1.Toleration{{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
		},
	}
	if err := w.Create(ctx, pod); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating static pod %s: %w", pod.Name, err)
		}
		if err := w.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
	}
	return setPodReady(ctx, w, pod, n.IP, true)
}

// setPodReady writes a kubelet-like status: Running with every condition and
// container ready, or Running with the container not ready.
func setPodReady(ctx context.Context, w client.Client, pod *corev1.Pod, ip string, ready bool) error {
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	now := metav1.Now()
	started := metav1.NewTime(pod.CreationTimestamp.Time)
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: status, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: status, LastTransitionTime: now},
		},
		HostIP:    ip,
		HostIPs:   []corev1.HostIP{{IP: ip}},
		PodIP:     ip,
		PodIPs:    []corev1.PodIP{{IP: ip}},
		StartTime: &started,
		ContainerStatuses: []corev1.ContainerStatus{{
			Name:         pod.Spec.Containers[0].Name,
			Image:        pod.Spec.Containers[0].Image,
			ImageID:      pod.Spec.Containers[0].Image,
			Ready:        ready,
			Started:      ptr.To(true),
			State:        corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
			ContainerID:  "containerd://" + pod.Name,
			RestartCount: 0,
		}},
	}
	return w.Status().Update(ctx, pod)
}

// reconcileDelete tears a simulated host down once DeleteDelay has passed
// since the InfraMachine's deletion: its etcd member stops (as the VM goes,
// whether or not anyone removed it from the cluster first), its static pods
// go, its slot frees. The Node is the Machine controller's to delete.
func (p *provider) reconcileDelete(ctx context.Context, im *unstructured.Unstructured) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(im, providerFinalizer) {
		return reconcile.Result{}, nil
	}
	if remaining := time.Until(im.GetDeletionTimestamp().Add(p.s.opts.DeleteDelay)); remaining > 0 {
		return reconcile.Result{RequeueAfter: remaining}, nil
	}
	p.mu.Lock()
	n := p.nodes[im.GetName()]
	p.mu.Unlock()
	if n != nil {
		if err := p.teardown(ctx, n); err != nil {
			return reconcile.Result{}, err
		}
	}
	patch := client.MergeFrom(im.DeepCopy())
	controllerutil.RemoveFinalizer(im, providerFinalizer)
	if err := p.c.Patch(ctx, im, patch); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	p.forget(im.GetName())
	return reconcile.Result{}, nil
}

func (p *provider) teardown(ctx context.Context, n *Node) error {
	p.stopHost(n)
	if n.Name == "" {
		return nil
	}
	for _, component := range Components {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: component + "-" + n.Name}}
		if err := p.s.workload.Delete(ctx, pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting static pod %s: %w", pod.Name, err)
		}
	}
	return nil
}

// stopHost stops the processes of a simulated host.
func (p *provider) stopHost(n *Node) {
	p.mu.Lock()
	m, k := n.member, n.kubelet
	p.mu.Unlock()
	if m != nil {
		m.Stop()
	}
	if k != nil {
		k.Stop()
	}
}

// forget frees an InfraMachine's capacity slot and address.
func (p *provider) forget(infraMachine string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.nodes[infraMachine]
	if !ok {
		return
	}
	delete(p.nodes, infraMachine)
	if n.IP != "" {
		if last, err := strconv.Atoi(n.IP[strings.LastIndex(n.IP, ".")+1:]); err == nil {
			delete(p.usedIPs, last)
		}
	}
}

// stopAll stops every simulated host and removes their data.
func (p *provider) stopAll() {
	p.mu.Lock()
	nodes := make([]*Node, 0, len(p.nodes))
	for _, n := range p.nodes {
		nodes = append(nodes, n)
	}
	p.mu.Unlock()
	for _, n := range nodes {
		p.stopHost(n)
	}
	if p.apiServerCert != nil {
		p.apiServerCert.stop()
	}
	_ = os.RemoveAll(p.dataDir)
}

// snapshot returns copies of the simulated nodes, by Machine name.
func (p *provider) snapshot() map[string]Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]Node, len(p.nodes))
	for _, n := range p.nodes {
		out[n.Machine] = Node{Name: n.Name, Machine: n.Machine, IP: n.IP, ProviderID: n.ProviderID, EtcdClientURL: n.EtcdClientURL}
	}
	return out
}

func (p *provider) nodeByName(name string) *Node {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

var errUnknownNode = errors.New("no such simulated node")
