package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	storagev1beta1 "k8s.io/api/storage/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim/kubelet"
)

// Faults that stage, one each, what the upgrade-readiness check
// (`kubectl cp-rollout check`, pkg/readiness) looks for in a workload
// cluster before an upgrade: a client of a deprecated API, workers whose
// kubelets an upgrade would leave too far behind, a fail-closed admission
// webhook served from one control-plane node, an etcd alarm, a Corefile
// plugin the CoreDNS migration does not know, and add-on pods that do not
// turn Ready on new nodes. Each acts on the workload cluster (or its etcd)
// as the real thing would, and its undo puts it back.

// Fault names of the staged findings.
const (
	FaultDeprecatedAPIClient   = "deprecated-api-client"
	FaultOldWorkers            = "old-workers" // =VERSION, a kubelet version
	FaultFailClosedWebhook     = "fail-closed-webhook"
	FaultEtcdAlarm             = "etcd-alarm"
	FaultCorefileUnknownPlugin = "corefile-unknown-plugin"
	FaultAddonUnready          = "addon-unready"
)

// staged is what the staging faults keep in the simulator's process.
type staged struct {
	mu sync.Mutex
	// stopDeprecatedClient stops the deprecated-api-client fault's client
	// and waits for it; nil while none runs.
	stopDeprecatedClient func()
	// alarmed is the etcd member whose alarm the etcd-alarm fault raised,
	// by Machine name: the undo disarms it even once the member is gone.
	alarmed map[string]uint64
	// joined holds the workload Nodes there were when addon-unready was
	// applied, by UID; nil while the fault is off. kube-proxy's pod on any
	// other node stays unready.
	joined map[types.UID]bool
	// addonPods wakes the add-on pods' stand-in (addonpods.go) when
	// addon-unready changes.
	addonPods chan event.GenericEvent
}

// ---- deprecated-api-client ----

// DeprecatedAPI is the API the deprecated-api-client fault's client calls:
// VolumeAttributesClasses at storage.k8s.io/v1beta1, deprecated since v1.34
// and removed in v1.37 (k8s.io/api v0.36.3's generated APILifecycle
// methods). The v1.36 kube-apiserver serves no group-version that is
// deprecated with a release it goes in by default: every alpha and beta is
// off (k8s.io/kubernetes pkg/controlplane/instance.go). Of those it can
// serve, the ones removed soonest (v1.37) are this one,
// networking.k8s.io/v1beta1's ServiceCIDRs and IPAddresses, and the alpha
// ClusterTrustBundles; this is the kind of API an old client keeps calling
// (a CSI sidecar built for the beta of volume attribute classes, say), and
// the only resource its group-version serves. The workload API server
// enables it (workloadRuntimeConfig); nothing else uses it.
var DeprecatedAPI = storagev1beta1.SchemeGroupVersion.WithResource("volumeattributesclasses")

// DeprecatedAPIRemovedRelease is the release DeprecatedAPI goes in, as the
// API server's apiserver_requested_deprecated_apis metric gives it in its
// removed_release label: "1.37".
var DeprecatedAPIRemovedRelease = func() string {
	major, minor := (&storagev1beta1.VolumeAttributesClass{}).APILifecycleRemoved()
	return fmt.Sprintf("%d.%d", major, minor)
}()

// workloadRuntimeConfig is the workload API server's --runtime-config:
// DeprecatedAPI's group-version on.
const workloadRuntimeConfig = "storage.k8s.io/v1beta1=true"

// DeprecatedAPIClientUserAgent is the user agent of the
// deprecated-api-client fault's client, as the API server's audit log and
// request metrics see it.
const DeprecatedAPIClientUserAgent = "cp-rollout-sim-deprecated-api-client"

// deprecatedClientInterval is how often the client lists DeprecatedAPI, as
// an informer's relist or a poll would.
const deprecatedClientInterval = 10 * time.Second

// StartDeprecatedAPIClient starts a client that lists DeprecatedAPI on the
// workload API server now and every deprecatedClientInterval until
// StopDeprecatedAPIClient: the API server's apiserver_requested_deprecated_apis
// gauge (on /metrics) then reports it, with removed_release
// DeprecatedAPIRemovedRelease, and its audit log marks each request
// k8s.io/deprecated.
func (s *Sim) StartDeprecatedAPIClient(ctx context.Context) error {
	st := &s.staged
	st.mu.Lock()
	running := st.stopDeprecatedClient != nil
	st.mu.Unlock()
	if running {
		return nil
	}
	cfg := rest.CopyConfig(s.workloadConfig)
	cfg.UserAgent = DeprecatedAPIClientUserAgent
	cfg.WarningHandler = rest.NoWarnings{} // the API server's deprecation warning, every call
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	list := func(ctx context.Context) error {
		_, err := cs.StorageV1beta1().VolumeAttributesClasses().List(ctx, metav1.ListOptions{Limit: 1})
		return err
	}
	// The first call before the fault counts as applied: the gauge is set.
	if err := list(ctx); err != nil {
		return fmt.Errorf("listing %s: %w", DeprecatedAPI, err)
	}
	runCtx, cancel := context.WithCancel(s.runCtx)
	done := make(chan struct{})
	s.goRun("deprecated-api-client", func() error {
		defer close(done)
		tick := time.NewTicker(deprecatedClientInterval)
		defer tick.Stop()
		for {
			select {
			case <-runCtx.Done():
				return nil
			case <-tick.C:
				_ = list(runCtx) // a client that fails tries again
			}
		}
	})
	// The fault controller applies one cluster fault at a time: nothing
	// started another client meanwhile.
	st.mu.Lock()
	st.stopDeprecatedClient = func() { cancel(); <-done }
	st.mu.Unlock()
	return nil
}

// StopDeprecatedAPIClient stops the client StartDeprecatedAPIClient started
// and resets the workload API server's metrics, as `kubectl delete --raw
// /metrics` does: the deprecated-API gauge is never unset otherwise until
// the API server restarts. Every other metric of the API server's starts
// over too.
func (s *Sim) StopDeprecatedAPIClient(ctx context.Context) error {
	st := &s.staged
	st.mu.Lock()
	stop := st.stopDeprecatedClient
	st.stopDeprecatedClient = nil
	st.mu.Unlock()
	if stop != nil {
		stop()
	}
	cs, err := kubernetes.NewForConfig(s.workloadConfig)
	if err != nil {
		return err
	}
	// The API server serves DELETE /metrics while profiling is on, its
	// default.
	if err := cs.CoreV1().RESTClient().Delete().AbsPath("/metrics").Do(ctx).Error(); err != nil {
		return fmt.Errorf("resetting the workload API server's metrics: %w", err)
	}
	return nil
}

// ---- old-workers ----

// OldWorkerLabel marks the old-workers fault's Nodes.
const OldWorkerLabel = "sim.cp-rollout.io/old-worker"

// oldWorkers is how many worker Nodes the old-workers fault adds.
const oldWorkers = 2

// OldWorkerNames are the old-workers fault's Nodes.
func OldWorkerNames() []string {
	names := make([]string, oldWorkers)
	for i := range names {
		names[i] = fmt.Sprintf("old-worker-%d", i+1)
	}
	return names
}

// parseKubeletVersion checks an old-workers value: a version as a kubelet
// reports it, v1.32.4.
func parseKubeletVersion(value string) error {
	if !strings.HasPrefix(value, "v") {
		return fmt.Errorf("%q: want a kubelet version such as v1.32.4", value)
	}
	if _, err := version.ParseSemantic(value); err != nil {
		return fmt.Errorf("%q: want a kubelet version such as v1.32.4: %w", value, err)
	}
	return nil
}

// SetOldWorkers registers OldWorkerNames as worker Nodes of the workload
// cluster whose kubelets report kubeletVersion, Ready, or sets the version
// of the ones there are: nodes joined by hand (no Machine owns them, no
// providerID names them, no control-plane label or taint marks them), as a
// cluster keeps workers nobody upgraded. Each has an address of the
// cluster's /24 that no host takes while it is there; nothing listens on it.
// Like any node, each gets a kube-proxy pod, and CoreDNS may be placed there.
func (s *Sim) SetOldWorkers(ctx context.Context, kubeletVersion string) error {
	w := s.workload
	for _, name := range OldWorkerNames() {
		node := &corev1.Node{}
		err := w.Get(ctx, client.ObjectKey{Name: name}, node)
		if apierrors.IsNotFound(err) {
			node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{
				Name:   name,
				Labels: map[string]string{corev1.LabelHostname: name, corev1.LabelOSStable: "linux", OldWorkerLabel: ""},
			}}
			err = w.Create(ctx, node)
		}
		if err != nil {
			return fmt.Errorf("registering Node %s: %w", name, err)
		}
		ip := nodeIP(node)
		if ip == "" {
			last := s.provider.reserveAddress()
			if last == 0 {
				return fmt.Errorf("no free address for Node %s", name)
			}
			ip = fmt.Sprintf("%s.%d", s.opts.addressPrefix(), last)
		}
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := w.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
				return err
			}
			now := metav1.Now()
			conditions := node.Status.Conditions
			if len(conditions) == 0 {
				conditions = kubelet.NodeConditions(now)
			}
			node.Status = corev1.NodeStatus{
				Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}},
				Conditions: conditions,
				NodeInfo: corev1.NodeSystemInfo{
					KubeletVersion:          kubeletVersion,
					OSImage:                 "sim-image-old-worker",
					OperatingSystem:         "linux",
					Architecture:            "amd64",
					ContainerRuntimeVersion: "containerd://1.7.24",
				},
				Capacity: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("110"),
				},
				Allocatable: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("110"),
				},
			}
			return w.Status().Update(ctx, node)
		})
		if err != nil {
			return fmt.Errorf("setting the status of Node %s: %w", name, err)
		}
		if err := liftNotReadyTaint(ctx, w, name); err != nil {
			return err
		}
	}
	return nil
}

// RemoveOldWorkers deletes the old-workers fault's Nodes and frees their
// addresses; the pods bound to them go with them (addonpods.go).
func (s *Sim) RemoveOldWorkers(ctx context.Context) error {
	nodes := &corev1.NodeList{}
	if err := s.workload.List(ctx, nodes, client.HasLabels{OldWorkerLabel}); err != nil {
		return err
	}
	for i := range nodes.Items {
		node := &nodes.Items[i]
		if err := s.workload.Delete(ctx, node); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Node %s: %w", node.Name, err)
		}
		s.provider.releaseAddress(nodeIP(node))
	}
	return nil
}

// reserveAddress takes an address of the cluster's /24 for a node that is
// not a host of the provider's; 0 means none is free.
func (p *provider) reserveAddress() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocateIP()
}

// releaseAddress gives back an address reserveAddress took.
func (p *provider) releaseAddress(ip string) {
	last, err := strconv.Atoi(ip[strings.LastIndex(ip, ".")+1:])
	if ip == "" || err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.usedIPs, last)
}

// ---- fail-closed-webhook ----

const (
	// WebhookNamespace holds the fail-closed-webhook fault's Service and
	// EndpointSlice; it stays after the undo (no namespace controller runs
	// in the workload cluster to finish deleting one).
	WebhookNamespace = "sim-webhooks"
	// WebhookName names its ValidatingWebhookConfiguration, Service and
	// EndpointSlice.
	WebhookName = "sim-fail-closed-webhook"
	// WebhookSelectorLabel is the label the webhook's namespace and object
	// selectors ask for: nothing the simulator, Cluster API or the tool
	// writes carries it, so the API server never calls the webhook (and
	// never dials the Service's cluster IP, which leads nowhere here).
	WebhookSelectorLabel = "sim.cp-rollout.io/fail-closed-webhook"
	webhookPort          = 9443
)

// AddFailClosedWebhook registers a ValidatingWebhookConfiguration with
// failurePolicy Fail whose Service's only endpoint, ready, is on the
// control-plane node of the oldest control-plane machine (the first a
// rollout replaces), as a policy webhook with one replica pinned to the
// control plane: once that node is drained, nothing the webhook intercepts
// can be written. Its rule (CREATE and UPDATE of namespaced pods) is scoped
// by namespace and object selectors that match WebhookSelectorLabel, which
// nothing has, so it intercepts nothing. It returns the node.
func (s *Sim) AddFailClosedWebhook(ctx context.Context) (string, error) {
	node, err := s.oldestControlPlaneNode(ctx)
	if err != nil {
		return "", err
	}
	n := s.provider.nodeByName(node)
	if n == nil {
		return "", fmt.Errorf("%w: %s", errUnknownNode, node)
	}
	w := s.workload
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{WebhookSelectorLabel: "enforced"}}
	appLabels := map[string]string{"app.kubernetes.io/name": WebhookName}
	objects := []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: WebhookNamespace}},
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: WebhookNamespace, Name: WebhookName, Labels: appLabels},
			Spec: corev1.ServiceSpec{
				Selector: appLabels,
				Ports:    []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(webhookPort), Protocol: corev1.ProtocolTCP}},
			},
		},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: WebhookName, Labels: appLabels},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name: "validate.fail-closed.sim.cp-rollout.io",
				ClientConfig: admissionregistrationv1.WebhookClientConfig{
					Service: &admissionregistrationv1.ServiceReference{Namespace: WebhookNamespace, Name: WebhookName, Path: ptr.To("/validate"), Port: ptr.To(int32(443))},
				},
				Rules: []admissionregistrationv1.RuleWithOperations{{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{
						APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
						// A namespace selector does not hold a cluster-scoped
						// object back; this rule has none.
						Scope: ptr.To(admissionregistrationv1.NamespacedScope),
					},
				}},
				FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
				NamespaceSelector:       selector,
				ObjectSelector:          selector,
				SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
				AdmissionReviewVersions: []string{"v1"},
				TimeoutSeconds:          ptr.To(int32(10)),
			}},
		},
	}
	for _, o := range objects {
		if err := w.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	// What the EndpointSlice controller (kube-controller-manager, absent
	// here) writes for the one ready pod behind the Service. The API server
	// takes no loopback address for an endpoint, so the pod's is one of
	// TEST-NET-1 (192.0.2.0/24, for documentation: no host is there); nothing
	// dials it, as nothing calls the webhook.
	podIP := "192.0.2." + n.IP[strings.LastIndex(n.IP, ".")+1:]
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: WebhookNamespace, Name: WebhookName}}
	_, err = controllerutil.CreateOrUpdate(ctx, w, slice, func() error {
		slice.Labels = map[string]string{
			discoveryv1.LabelServiceName: WebhookName,
			discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
		}
		slice.AddressType = discoveryv1.AddressTypeIPv4
		slice.Endpoints = []discoveryv1.Endpoint{{
			Addresses:  []string{podIP},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(node),
		}}
		slice.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(webhookPort)), Protocol: ptr.To(corev1.ProtocolTCP)}}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("writing EndpointSlice %s: %w", WebhookName, err)
	}
	return node, nil
}

// RemoveFailClosedWebhook deletes what AddFailClosedWebhook created but its
// namespace.
func (s *Sim) RemoveFailClosedWebhook(ctx context.Context) error {
	for _, o := range []client.Object{
		&admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: WebhookName}},
		&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: WebhookNamespace, Name: WebhookName}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: WebhookNamespace, Name: WebhookName}},
	} {
		if err := s.workload.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// oldestControlPlaneNode names the node of the oldest control-plane machine
// that has one and is not being deleted.
func (s *Sim) oldestControlPlaneNode(ctx context.Context) (string, error) {
	machines, err := s.Machines(ctx)
	if err != nil {
		return "", err
	}
	machines = slices.DeleteFunc(machines, func(m clusterv1.Machine) bool {
		return !m.Status.NodeRef.IsDefined() || !m.DeletionTimestamp.IsZero()
	})
	if len(machines) == 0 {
		return "", errors.New("no control-plane machine has a node yet")
	}
	slices.SortStableFunc(machines, func(a, b clusterv1.Machine) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	return machines[0].Status.NodeRef.Name, nil
}

// ---- etcd-alarm ----

// RaiseEtcdAlarm raises a NOSPACE alarm for the etcd member on the named
// node of machine through etcd's maintenance API (AlarmRequest ACTIVATE), as
// a member whose database reached its quota raises it. etcd keeps alarms
// cluster-wide: while it is raised every member refuses writes that grow the
// database, and every member's Status lists it among its errors. It returns
// the member's ID.
func (s *Sim) RaiseEtcdAlarm(ctx context.Context, machine, nodeName string) (uint64, error) {
	m, err := s.memberOf(nodeName)
	if err != nil {
		return 0, err
	}
	id := m.ID()
	if id == 0 {
		return 0, fmt.Errorf("the etcd member of node %s has not joined yet", nodeName)
	}
	c, err := s.runningMembersClient(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = etcdserverpb.NewMaintenanceClient(c.ActiveConnection()).Alarm(callCtx, &etcdserverpb.AlarmRequest{
		Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: id, Alarm: etcdserverpb.AlarmType_NOSPACE,
	})
	if err != nil {
		return 0, fmt.Errorf("raising NOSPACE for etcd member %x: %w", id, err)
	}
	s.staged.mu.Lock()
	if s.staged.alarmed == nil {
		s.staged.alarmed = map[string]uint64{}
	}
	s.staged.alarmed[machine] = id
	s.staged.mu.Unlock()
	return id, nil
}

// DisarmEtcdAlarm disarms the NOSPACE alarm RaiseEtcdAlarm raised for
// machine's member (AlarmRequest DEACTIVATE, as `etcdctl alarm disarm`),
// whether or not the member is still there: etcd keeps the alarm of a
// removed member. Without a record of one, the member on nodeName is
// disarmed. It returns the member's ID, 0 when there is none to disarm.
func (s *Sim) DisarmEtcdAlarm(ctx context.Context, machine, nodeName string) (uint64, error) {
	s.staged.mu.Lock()
	id, ok := s.staged.alarmed[machine]
	s.staged.mu.Unlock()
	if !ok {
		if nodeName == "" {
			return 0, nil
		}
		m, err := s.memberOf(nodeName)
		if err != nil {
			return 0, err
		}
		if id = m.ID(); id == 0 {
			return 0, nil
		}
	}
	c, err := s.runningMembersClient(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := c.AlarmDisarm(callCtx, &clientv3.AlarmMember{MemberID: id, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		return 0, fmt.Errorf("disarming NOSPACE of etcd member %x: %w", id, err)
	}
	s.staged.mu.Lock()
	delete(s.staged.alarmed, machine)
	s.staged.mu.Unlock()
	return id, nil
}

// disarmGoneMachine disarms the alarm raised for a Machine that is gone:
// the fault went with its host, as the others do.
func (s *Sim) disarmGoneMachine(ctx context.Context, machine string) error {
	s.staged.mu.Lock()
	_, ok := s.staged.alarmed[machine]
	s.staged.mu.Unlock()
	if !ok {
		return nil
	}
	_, err := s.DisarmEtcdAlarm(ctx, machine, "")
	return err
}

// ---- corefile-unknown-plugin ----

// UnknownCorefilePlugin is the plugin the corefile-unknown-plugin fault adds
// to the Corefile: k8s_gateway, an external CoreDNS plugin that custom
// CoreDNS builds carry and the registry.k8s.io/coredns image KCP moves
// CoreDNS to does not. github.com/coredns/corefile-migration does not know
// it: migration.Unsupported reports it for every version, and
// migration.Migrate (KCP's) does not fail on it but carries it over as it is.
const UnknownCorefilePlugin = "k8s_gateway"

// unknownPluginLine is the fault's line of the Corefile.
const unknownPluginLine = UnknownCorefilePlugin + " example.com"

// AddUnknownCorefilePlugin adds UnknownCorefilePlugin to the first server
// block of the Corefile in kube-system/coredns.
func (s *Sim) AddUnknownCorefilePlugin(ctx context.Context) error {
	return s.editCorefile(ctx, withCorefileLine)
}

// RemoveUnknownCorefilePlugin takes the line AddUnknownCorefilePlugin added
// out again, which gives back the Corefile as it was (or, after KCP
// migrated it meanwhile, as KCP wrote it).
func (s *Sim) RemoveUnknownCorefilePlugin(ctx context.Context) error {
	return s.editCorefile(ctx, withoutCorefileLine)
}

func (s *Sim) editCorefile(ctx context.Context, edit func(corefile, line string) string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm := &corev1.ConfigMap{}
		if err := s.workload.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: coreDNSName}, cm); err != nil {
			return err
		}
		corefile, ok := cm.Data["Corefile"]
		if !ok {
			return fmt.Errorf("ConfigMap %s/%s has no Corefile", metav1.NamespaceSystem, coreDNSName)
		}
		edited := edit(corefile, unknownPluginLine)
		if edited == corefile {
			return nil
		}
		cm.Data["Corefile"] = edited
		return s.workload.Update(ctx, cm)
	})
}

// withCorefileLine adds line as the first plugin of corefile's first server
// block (the order of plugins in a Corefile does not matter: CoreDNS orders
// them itself), unless a line of the Corefile is line already.
func withCorefileLine(corefile, line string) string {
	lines := strings.SplitAfter(corefile, "\n")
	for _, l := range lines {
		if strings.TrimSpace(l) == line {
			return corefile
		}
	}
	for i, l := range lines {
		if strings.HasSuffix(strings.TrimSpace(l), "{") {
			return strings.Join(slices.Insert(lines, i+1, "    "+line+"\n"), "")
		}
	}
	return corefile + ".:53 {\n    " + line + "\n}\n"
}

// withoutCorefileLine removes every line of corefile that is line.
func withoutCorefileLine(corefile, line string) string {
	lines := strings.SplitAfter(corefile, "\n")
	return strings.Join(slices.DeleteFunc(lines, func(l string) bool { return strings.TrimSpace(l) == line }), "")
}

// ---- addon-unready ----

// SetAddonUnready turns the addon-unready fault on or off. On, kube-proxy's
// pod on every Node that registers from now on stays Running but not Ready
// (as a kube-proxy that cannot program the node's rules fails its
// readiness probe), while the pods of the nodes there are stay Ready; off,
// every kube-proxy pod is Ready again. It returns how many nodes there
// are now.
func (s *Sim) SetAddonUnready(ctx context.Context, on bool) (int, error) {
	var joined map[types.UID]bool
	nodes := &corev1.NodeList{}
	if err := s.workload.List(ctx, nodes); err != nil {
		return 0, err
	}
	if on {
		joined = map[types.UID]bool{}
		for _, n := range nodes.Items {
			joined[n.UID] = true
		}
	}
	st := &s.staged
	st.mu.Lock()
	st.joined = joined
	wake := st.addonPods
	st.mu.Unlock()
	if wake != nil {
		select {
		case wake <- event.GenericEvent{Object: &corev1.Node{}}:
		default: // a reconcile is due already, and reads the new state
		}
	}
	return len(nodes.Items), nil
}

// kubeProxyUnready reports whether addon-unready keeps kube-proxy's pod on
// node from turning Ready.
func (st *staged) kubeProxyUnready(node *corev1.Node) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.joined != nil && node != nil && !st.joined[node.UID]
}
