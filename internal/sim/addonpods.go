package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// The workload cluster has no kube-controller-manager, scheduler or kubelets,
// so nothing would run the pods of kube-proxy and CoreDNS: KCP's retagging of
// the one and migration of the other would change specs that no pod follows,
// and a drain would find nothing to evict. addonPods stands in, for these two
// add-ons alone, for the DaemonSet and Deployment controllers (one kube-proxy
// pod per node; CoreDNS's replicas through a ReplicaSet per pod template,
// placed on schedulable nodes, the new template's pods replacing the old
// ones), for the kubelet (a new pod reports Running and Ready, but
// kube-proxy's on a node that joined after the addon-unready fault, which
// stays Running and not Ready; a pod being deleted, as an eviction leaves
// it, goes at once) and for the pod garbage
// collector (a pod whose node is gone goes). Static pods stay the
// provider's.
type addonPods struct {
	c client.Client
	// staged says which kube-proxy pods the addon-unready fault keeps
	// unready (staging.go).
	staged *staged
}

// addonRequest is the one request the stand-in reconciles: every change to
// nodes, pods or the two add-ons is a reason to look at all of them again.
var addonRequest = reconcile.Request{NamespacedName: client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: kubeProxyName}}

// startAddonPods runs the add-on pods' stand-in on the workload cluster.
func (s *Sim) startAddonPods(startCtx, runCtx context.Context) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	inKubeSystem := ctrlcache.ByObject{Namespaces: map[string]ctrlcache.Config{metav1.NamespaceSystem: {}}}
	opts := managerOptions(s.opts.Log, "simulated-addon-pods", ctrlcache.Options{ByObject: map[client.Object]ctrlcache.ByObject{
		&corev1.Pod{}:        inKubeSystem,
		&appsv1.DaemonSet{}:  inKubeSystem,
		&appsv1.Deployment{}: inKubeSystem,
		&appsv1.ReplicaSet{}: inKubeSystem,
	}}, client.Options{})
	opts.Scheme = scheme
	mgr, err := ctrl.NewManager(s.workloadConfig, opts)
	if err != nil {
		return err
	}
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{addonRequest}
	})
	// The addon-unready fault changes nothing in the workload cluster
	// itself: it wakes the stand-in through this channel.
	wake := make(chan event.GenericEvent, 1)
	s.staged.mu.Lock()
	s.staged.addonPods = wake
	s.staged.mu.Unlock()
	err = builder.ControllerManagedBy(mgr).
		Named("simulated-addon-pods").
		Watches(&appsv1.DaemonSet{}, all).
		Watches(&appsv1.Deployment{}, all).
		Watches(&appsv1.ReplicaSet{}, all).
		Watches(&corev1.Pod{}, all).
		Watches(&corev1.Node{}, all).
		WatchesRawSource(source.Channel(wake, all)).
		Complete(&addonPods{c: mgr.GetClient(), staged: &s.staged})
	if err != nil {
		return err
	}
	const name = "simulated-addon-pods"
	s.goRun(name, func() error { return mgr.Start(runCtx) })
	return waitForCaches(startCtx, []ctrl.Manager{mgr}, []string{name})
}

func (a *addonPods) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	nodes := &corev1.NodeList{}
	if err := a.c.List(ctx, nodes); err != nil {
		return reconcile.Result{}, err
	}
	pods := &corev1.PodList{}
	if err := a.c.List(ctx, pods, client.InNamespace(metav1.NamespaceSystem)); err != nil {
		return reconcile.Result{}, err
	}
	byName := map[string]*corev1.Node{}
	for i := range nodes.Items {
		byName[nodes.Items[i].Name] = &nodes.Items[i]
	}
	// Only the add-ons' pods: those a DaemonSet or ReplicaSet controls.
	var live []corev1.Pod
	var errs []error
	for _, pod := range pods.Items {
		ref := metav1.GetControllerOf(&pod)
		if ref == nil || (ref.Kind != "DaemonSet" && ref.Kind != "ReplicaSet") {
			continue
		}
		if _, ok := byName[pod.Spec.NodeName]; !ok || pod.DeletionTimestamp != nil {
			// The node's kubelet has stopped the containers, or the node is
			// gone and the pod garbage collector removes what was bound to it.
			errs = append(errs, client.IgnoreNotFound(a.c.Delete(ctx, &pod, client.GracePeriodSeconds(0))))
			continue
		}
		// Running and Ready, but for kube-proxy on a node the addon-unready
		// fault holds back: Running, its readiness probe failing.
		node := byName[pod.Spec.NodeName]
		ready := !(isKubeProxyPod(&pod) && a.staged.kubeProxyUnready(node))
		if pod.Status.Phase != corev1.PodRunning || podIsReady(&pod) != ready {
			errs = append(errs, client.IgnoreNotFound(setPodReady(ctx, a.c, &pod, nodeIP(node), ready)))
		}
		live = append(live, pod)
	}
	errs = append(errs, a.kubeProxy(ctx, nodes.Items, live), a.coreDNS(ctx, nodes.Items, live))
	return reconcile.Result{}, errors.Join(errs...)
}

// kubeProxy keeps one pod of the DaemonSet's current template on every node,
// as the DaemonSet controller does (its tolerations admit every node), and
// reports the DaemonSet's status.
func (a *addonPods) kubeProxy(ctx context.Context, nodes []corev1.Node, pods []corev1.Pod) error {
	ds := &appsv1.DaemonSet{}
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: kubeProxyName}, ds); err != nil {
		return client.IgnoreNotFound(err)
	}
	hash := templateHash(ds.Spec.Template)
	current := map[string]bool{} // nodes with a pod of the current template
	ready := 0
	for i := range pods {
		pod := &pods[i]
		if !controlledBy(pod, ds) {
			continue
		}
		if pod.Labels[appsv1.ControllerRevisionHashLabelKey] != hash {
			if err := client.IgnoreNotFound(a.c.Delete(ctx, pod, client.GracePeriodSeconds(0))); err != nil {
				return err
			}
			continue
		}
		current[pod.Spec.NodeName] = true
		if podIsReady(pod) {
			ready++
		}
	}
	for _, n := range nodes {
		if current[n.Name] {
			continue
		}
		pod := podOf(ds, ds.Spec.Template, appsv1.ControllerRevisionHashLabelKey, hash, podName(kubeProxyName, n.Name+"/"+hash), n.Name)
		if err := a.c.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating a kube-proxy pod on %s: %w", n.Name, err)
		}
	}
	status := appsv1.DaemonSetStatus{
		ObservedGeneration:     ds.Generation,
		DesiredNumberScheduled: int32(len(nodes)),
		CurrentNumberScheduled: int32(len(current)),
		UpdatedNumberScheduled: int32(len(current)),
		NumberReady:            int32(ready),
		NumberAvailable:        int32(ready),
		NumberUnavailable:      int32(len(nodes) - ready),
	}
	if equality.Semantic.DeepEqual(ds.Status, status) {
		return nil
	}
	ds.Status = status
	return client.IgnoreNotFound(a.c.Status().Update(ctx, ds))
}

// coreDNS keeps the Deployment's replicas running from a ReplicaSet of its
// current template, each new pod on the schedulable node with the fewest
// CoreDNS pods; once the new template's pods run, the older ReplicaSets'
// pods go (a rollout in one step). It reports both status.
func (a *addonPods) coreDNS(ctx context.Context, nodes []corev1.Node, pods []corev1.Pod) error {
	dep := &appsv1.Deployment{}
	if err := a.c.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: coreDNSName}, dep); err != nil {
		return client.IgnoreNotFound(err)
	}
	hash := templateHash(dep.Spec.Template)
	rs, err := a.replicaSet(ctx, dep, hash)
	if err != nil {
		return err
	}
	perNode := map[string]int{}
	var ownPods, oldPods []*corev1.Pod
	for i := range pods {
		pod := &pods[i]
		if ref := metav1.GetControllerOf(pod); ref == nil || ref.Kind != "ReplicaSet" || pod.Labels["k8s-app"] != dep.Spec.Template.Labels["k8s-app"] {
			continue
		}
		perNode[pod.Spec.NodeName]++
		if controlledBy(pod, rs) {
			ownPods = append(ownPods, pod)
		} else {
			oldPods = append(oldPods, pod)
		}
	}
	want := int(ptr.Deref(dep.Spec.Replicas, 1))
	for len(ownPods) > want { // scaled down
		last := ownPods[len(ownPods)-1]
		if err := client.IgnoreNotFound(a.c.Delete(ctx, last, client.GracePeriodSeconds(0))); err != nil {
			return err
		}
		ownPods = ownPods[:len(ownPods)-1]
	}
	taken := map[string]bool{}
	for _, pod := range ownPods {
		taken[pod.Name] = true
	}
	for created, slot := len(ownPods), 0; created < want; created++ {
		node := leastLoaded(nodes, perNode, dep.Spec.Template.Spec.Tolerations)
		if node == "" {
			break // nowhere to schedule: the pod would stay Pending
		}
		name := podName(rs.Name, fmt.Sprint(slot))
		for taken[name] {
			slot++
			name = podName(rs.Name, fmt.Sprint(slot))
		}
		taken[name] = true
		pod := podOf(rs, dep.Spec.Template, appsv1.DefaultDeploymentUniqueLabelKey, hash, name, node)
		if err := a.c.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating a CoreDNS pod on %s: %w", node, err)
		}
		perNode[node]++
	}
	ready := 0
	for _, pod := range ownPods {
		if pod.Status.Phase == corev1.PodRunning {
			ready++
		}
	}
	if ready >= want {
		for _, pod := range oldPods {
			if err := client.IgnoreNotFound(a.c.Delete(ctx, pod, client.GracePeriodSeconds(0))); err != nil {
				return err
			}
		}
		oldPods = nil
	}
	if err := a.updateReplicaSetStatus(ctx, rs, len(ownPods), ready); err != nil {
		return err
	}
	status := appsv1.DeploymentStatus{
		ObservedGeneration:  dep.Generation,
		Replicas:            int32(len(ownPods) + len(oldPods)),
		UpdatedReplicas:     int32(len(ownPods)),
		ReadyReplicas:       int32(ready + len(oldPods)),
		AvailableReplicas:   int32(ready + len(oldPods)),
		UnavailableReplicas: int32(max(0, want-ready-len(oldPods))),
		Conditions:          append([]appsv1.DeploymentCondition(nil), dep.Status.Conditions...),
	}
	available := corev1.ConditionFalse
	if status.AvailableReplicas >= int32(want)-1 { // maxUnavailable 1, as kubeadm sets it
		available = corev1.ConditionTrue
	}
	setDeploymentCondition(&status, appsv1.DeploymentAvailable, available, "MinimumReplicasAvailable")
	setDeploymentCondition(&status, appsv1.DeploymentProgressing, corev1.ConditionTrue, "NewReplicaSetAvailable")
	if equality.Semantic.DeepEqual(dep.Status, status) {
		return nil
	}
	dep.Status = status
	return client.IgnoreNotFound(a.c.Status().Update(ctx, dep))
}

// replicaSet returns the Deployment's ReplicaSet for the template hash,
// creating it first, and scales every older one to 0, as the Deployment
// controller leaves them.
func (a *addonPods) replicaSet(ctx context.Context, dep *appsv1.Deployment, hash string) (*appsv1.ReplicaSet, error) {
	list := &appsv1.ReplicaSetList{}
	if err := a.c.List(ctx, list, client.InNamespace(dep.Namespace)); err != nil {
		return nil, err
	}
	var current *appsv1.ReplicaSet
	for i := range list.Items {
		rs := &list.Items[i]
		if !controlledBy(rs, dep) {
			continue
		}
		if rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey] == hash {
			current = rs
			continue
		}
		if ptr.Deref(rs.Spec.Replicas, 0) != 0 {
			patch := client.MergeFrom(rs.DeepCopy())
			rs.Spec.Replicas = ptr.To(int32(0))
			if err := a.c.Patch(ctx, rs, patch); err != nil {
				return nil, err
			}
		}
	}
	if current != nil {
		if !equality.Semantic.DeepEqual(current.Spec.Replicas, dep.Spec.Replicas) {
			patch := client.MergeFrom(current.DeepCopy())
			current.Spec.Replicas = dep.Spec.Replicas
			if err := a.c.Patch(ctx, current, patch); err != nil {
				return nil, err
			}
		}
		return current, nil
	}
	template := *dep.Spec.Template.DeepCopy()
	template.Labels = withLabel(template.Labels, appsv1.DefaultDeploymentUniqueLabelKey, hash)
	selector := dep.Spec.Selector.DeepCopy()
	selector.MatchLabels = withLabel(selector.MatchLabels, appsv1.DefaultDeploymentUniqueLabelKey, hash)
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       dep.Namespace,
			Name:            dep.Name + "-" + hash,
			Labels:          template.Labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(dep, appsv1.SchemeGroupVersion.WithKind("Deployment"))},
		},
		Spec: appsv1.ReplicaSetSpec{Replicas: dep.Spec.Replicas, Selector: selector, Template: template},
	}
	if err := a.c.Create(ctx, rs); err != nil {
		return nil, fmt.Errorf("creating ReplicaSet %s: %w", rs.Name, err)
	}
	return rs, nil
}

func (a *addonPods) updateReplicaSetStatus(ctx context.Context, rs *appsv1.ReplicaSet, replicas, ready int) error {
	status := appsv1.ReplicaSetStatus{
		Replicas:             int32(replicas),
		FullyLabeledReplicas: int32(replicas),
		ReadyReplicas:        int32(ready),
		AvailableReplicas:    int32(ready),
		ObservedGeneration:   rs.Generation,
	}
	if equality.Semantic.DeepEqual(rs.Status, status) {
		return nil
	}
	rs.Status = status
	return client.IgnoreNotFound(a.c.Status().Update(ctx, rs))
}

// podName names a pod after what it is for (its node and template, or its
// replica slot), the way the controllers' random suffixes look. The
// controllers keep a read that lags behind their own creations from making a
// pod twice with expectations; here the second creation of a name fails.
func podName(prefix, key string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	suffix := rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
	return prefix + "-" + suffix[:min(5, len(suffix))]
}

// podOf is a pod of owner's template, labelled with its hash under hashKey,
// bound to node as the scheduler (or the DaemonSet controller) binds it.
func podOf(owner client.Object, template corev1.PodTemplateSpec, hashKey, hash, name, node string) *corev1.Pod {
	kind := "DaemonSet"
	if _, ok := owner.(*appsv1.ReplicaSet); ok {
		kind = "ReplicaSet"
	}
	spec := *template.Spec.DeepCopy()
	spec.NodeName = node
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       owner.GetNamespace(),
			Name:            name,
			Labels:          withLabel(template.Labels, hashKey, hash),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(owner, appsv1.SchemeGroupVersion.WithKind(kind))},
		},
		Spec: spec,
	}
}

// leastLoaded is the schedulable, ready node with the fewest CoreDNS pods
// whose taints the pods tolerate, or "" when there is none: a cordoned node,
// as a drain leaves it, takes no pod. Ties go to the newest node (the
// scheduler picks at random among equals): in a rolling replacement that is
// the new machine's, so CoreDNS is not evicted again by every drain.
func leastLoaded(nodes []corev1.Node, perNode map[string]int, tolerations []corev1.Toleration) string {
	var best *corev1.Node
	for i := range nodes {
		n := &nodes[i]
		if n.Spec.Unschedulable || !nodeReady(n) || !tolerates(tolerations, n.Spec.Taints) {
			continue
		}
		if best == nil || perNode[n.Name] < perNode[best.Name] ||
			perNode[n.Name] == perNode[best.Name] && newer(n, best) {
			best = n
		}
	}
	if best == nil {
		return ""
	}
	return best.Name
}

// newer orders nodes by creation, then name, so the choice is stable.
func newer(a, b *corev1.Node) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return b.CreationTimestamp.Before(&a.CreationTimestamp)
	}
	return a.Name > b.Name
}

// nodeReady: a node whose Ready condition is not False (a node the simulated
// kubelet has not reported on yet counts as ready).
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return true
}

// tolerates: every NoSchedule and NoExecute taint is tolerated.
func tolerates(tolerations []corev1.Toleration, taints []corev1.Taint) bool {
	for _, taint := range taints {
		if taint.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		ok := false
		for _, t := range tolerations {
			if t.ToleratesTaint(klog.Background(), &taint, false) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// isKubeProxyPod: a pod of the kube-proxy DaemonSet.
func isKubeProxyPod(pod *corev1.Pod) bool {
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == "DaemonSet" && ref.Name == kubeProxyName
}

// podIsReady: a Running pod whose Ready condition is True.
func podIsReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeIP(n *corev1.Node) string {
	if n == nil {
		return ""
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

func controlledBy(obj, owner client.Object) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == owner.GetUID()
}

// templateHash names a pod template as the controllers' hash labels do: a
// short, stable string of the template's content. (The controllers' own
// ComputeHash lives in k8s.io/kubernetes, which this module does not import.)
func templateHash(t corev1.PodTemplateSpec) string {
	raw, _ := json.Marshal(t)
	h := fnv.New32a()
	_, _ = h.Write(raw)
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

func withLabel(labels map[string]string, key, value string) map[string]string {
	out := make(map[string]string, len(labels)+1)
	for k, v := range labels {
		out[k] = v
	}
	out[key] = value
	return out
}

func setDeploymentCondition(status *appsv1.DeploymentStatus, t appsv1.DeploymentConditionType, s corev1.ConditionStatus, reason string) {
	for i := range status.Conditions {
		if c := &status.Conditions[i]; c.Type == t {
			if c.Status != s || c.Reason != reason {
				now := metav1.Now()
				*c = appsv1.DeploymentCondition{Type: t, Status: s, Reason: reason, LastUpdateTime: now, LastTransitionTime: now}
			}
			return
		}
	}
	now := metav1.Now()
	status.Conditions = append(status.Conditions, appsv1.DeploymentCondition{Type: t, Status: s, Reason: reason, LastUpdateTime: now, LastTransitionTime: now})
}
