package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/internal/sim/kubelet"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

// Fault hooks for tests and rehearsals. Each acts on the simulated hosts
// only; what the controllers and the tool make of it is theirs.

// StopMember stops the etcd member of the named node, as a crashed etcd
// would: it stays in the member list, unreachable. The node and its pods stay.
func (s *Sim) StopMember(nodeName string) error {
	m, err := s.memberOf(nodeName)
	if err != nil {
		return err
	}
	m.Stop()
	return nil
}

// RestartMember starts a member StopMember stopped again with its identity and
// data, as a node whose etcd comes back after a crash.
func (s *Sim) RestartMember(ctx context.Context, nodeName string) error {
	m, err := s.memberOf(nodeName)
	if err != nil {
		return err
	}
	return m.Restart(ctx)
}

// memberOf returns the etcd member running on the named node.
func (s *Sim) memberOf(nodeName string) (*member.Member, error) {
	n := s.provider.nodeByName(nodeName)
	if n == nil {
		return nil, fmt.Errorf("%w: %s", errUnknownNode, nodeName)
	}
	s.provider.mu.Lock()
	m := n.member
	s.provider.mu.Unlock()
	if m == nil {
		return nil, fmt.Errorf("node %s runs no etcd member", nodeName)
	}
	return m, nil
}

// SetStaticPodReady turns the named node's static pod of component (one of
// Components) ready or unready, as its kubelet would report a failing probe.
func (s *Sim) SetStaticPodReady(ctx context.Context, nodeName, component string, ready bool) error {
	n := s.provider.nodeByName(nodeName)
	if n == nil {
		return fmt.Errorf("%w: %s", errUnknownNode, nodeName)
	}
	pod := &corev1.Pod{}
	if err := s.workload.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: component + "-" + nodeName}, pod); err != nil {
		return err
	}
	return setPodReady(ctx, s.workload, pod, n.IP, ready)
}

// NeverProvisionNext makes the next InfraMachine that reaches the simulated
// provider stay unprovisioned for good, without taking a capacity slot: a
// host that never boots.
func (s *Sim) NeverProvisionNext() {
	s.provider.mu.Lock()
	s.provider.neverProvisionNext = true
	s.provider.mu.Unlock()
}

// RecoverProvisioning lets every host NeverProvisionNext held back boot after
// all, as a provider whose outage is fixed: each provisions in the ordinary
// way from now on.
func (s *Sim) RecoverProvisioning(ctx context.Context) error {
	p := s.provider
	p.mu.Lock()
	var stuck []string
	for name, n := range p.nodes {
		if n.stuck {
			stuck = append(stuck, name)
			delete(p.nodes, name)
		}
	}
	p.mu.Unlock()
	// The provider stopped requeueing them; an annotation wakes it.
	for _, name := range stuck {
		im := &unstructured.Unstructured{}
		im.SetGroupVersionKind(infraMachineGVK)
		im.SetNamespace(s.opts.Namespace)
		im.SetName(name)
		patch := fmt.Sprintf(`{"metadata":{"annotations":{"sim.cp-rollout.io/recovered":%q}}}`, time.Now().UTC().Format(time.RFC3339Nano))
		if err := s.mgmt.Patch(ctx, im, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			return fmt.Errorf("waking the provider for %s: %w", name, err)
		}
	}
	return nil
}

// FreezeWorkloadAPIServer stops the workload cluster's kube-apiserver process
// in its tracks (SIGSTOP), as a network that drops every packet to it would:
// connections hang rather than fail. thaw lets it go on.
func (s *Sim) FreezeWorkloadAPIServer() (thaw func() error, err error) {
	port := s.workloadEnv.ControlPlane.APIServer.SecureServing.Port
	pid, _, err := findChild("kube-apiserver", "--secure-port="+port)
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("freezing the workload API server: %w", err)
	}
	return func() error { return syscall.Kill(pid, syscall.SIGCONT) }, nil
}

// AddStrayLearner adds an etcd member as a learner at peerURL and never
// starts it, as a join that failed after kubeadm's MemberAddAsLearner
// leaves one: listed without a name, owned by no machine. It returns the
// member's ID.
func (s *Sim) AddStrayLearner(ctx context.Context, peerURL string) (uint64, error) {
	c, err := s.runningMembersClient(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	// etcd refuses a new member until the one that takes the request has
	// been connected to its peers for a while: try again as kubeadm does.
	for {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.MemberAddAsLearner(callCtx, []string{peerURL})
		cancel()
		if err == nil {
			return resp.Member.ID, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("adding a learner at %s: %w", peerURL, err)
		case <-time.After(time.Second):
		}
	}
}

// SetNodeReady makes the named node's kubelet report Ready or NotReady (a
// kubelet whose container network is down), with the not-ready NoSchedule
// taint kube-controller-manager's node lifecycle controller adds to a
// NotReady node and lifts once it is Ready: no controller manager runs in
// the workload cluster. The kubelet stand-in keeps serving port-forward, as
// a live kubelet with a broken network plugin does.
func (s *Sim) SetNodeReady(ctx context.Context, nodeName string, ready bool) error {
	if s.provider.nodeByName(nodeName) == nil {
		return fmt.Errorf("%w: %s", errUnknownNode, nodeName)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := s.workload.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
			return err
		}
		node.Status.Conditions = kubelet.SetReady(node.Status.Conditions, ready, metav1.Now())
		return s.workload.Status().Update(ctx, node)
	})
	if err != nil {
		return fmt.Errorf("setting node %s Ready=%t: %w", nodeName, ready, err)
	}
	if ready {
		return liftNotReadyTaint(ctx, s.workload, nodeName)
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node := &corev1.Node{}
		if err := s.workload.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
			return err
		}
		for _, t := range node.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady && t.Effect == corev1.TaintEffectNoSchedule {
				return nil
			}
		}
		patch := client.MergeFromWithOptions(node.DeepCopy(), client.MergeFromWithOptimisticLock{})
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule, TimeAdded: ptr.To(metav1.Now())})
		return s.workload.Patch(ctx, node, patch)
	})
}

// DrainBlockerNamespace is the workload-cluster namespace of the pods and
// PodDisruptionBudgets that block drains (BlockDrain).
const DrainBlockerNamespace = "sim-drain-blockers"

// drainBlockerMachineLabel names the Machine a drain blocker was put on for,
// so the blocker can be found again once the Machine (and its node) are gone.
const drainBlockerMachineLabel = "sim.cp-rollout.io/machine"

// BlockDrain puts a Running, Ready pod on the named node of machine behind a
// PodDisruptionBudget that allows no disruption, as an application with a
// single replica and minAvailable 1 does: the Eviction API refuses to evict
// it (429) for the tool's drain and Cluster API's alike, and a drain waits
// until the budget goes (or the Machine's nodeDrainTimeout passes). The pod
// is plain (no controller): both drains evict such a pod, Cluster API's with
// a warning.
func (s *Sim) BlockDrain(ctx context.Context, machine, nodeName string) error {
	n := s.provider.nodeByName(nodeName)
	if n == nil {
		return fmt.Errorf("%w: %s", errUnknownNode, nodeName)
	}
	w := s.workload
	// No kube-controller-manager creates the namespace's default
	// ServiceAccount, which the API server's ServiceAccount admission wants.
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DrainBlockerNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: DrainBlockerNamespace, Name: "default"}},
	} {
		if err := w.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	name := "drain-blocker-" + nodeName
	labels := map[string]string{"app.kubernetes.io/name": "drain-blocker", corev1.LabelHostname: nodeName, drainBlockerMachineLabel: machine}

	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: DrainBlockerNamespace, Name: name, Labels: labels},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "drain-blocker", corev1.LabelHostname: nodeName}},
		},
	}
	if err := w.Create(ctx, pdb); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating PodDisruptionBudget %s: %w", name, err)
	}
	if err := w.Get(ctx, client.ObjectKeyFromObject(pdb), pdb); err != nil {
		return err
	}
	// What the disruption controller (kube-controller-manager, absent here)
	// would compute for one healthy pod and minAvailable 1. Without it the
	// budget is "still being processed", which refuses evictions too, but
	// with a message no real cluster shows for long.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{
		ObservedGeneration: pdb.Generation,
		DisruptionsAllowed: 0,
		CurrentHealthy:     1,
		DesiredHealthy:     1,
		ExpectedPods:       1,
		Conditions: []metav1.Condition{{
			Type: policyv1.DisruptionAllowedCondition, Status: metav1.ConditionFalse, Reason: policyv1.InsufficientPodsReason,
			ObservedGeneration: pdb.Generation, LastTransitionTime: metav1.Now(),
		}},
	}
	if err := w.Status().Update(ctx, pdb); err != nil {
		return fmt.Errorf("setting the status of PodDisruptionBudget %s: %w", name, err)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: DrainBlockerNamespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                     nodeName,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
			// Bound by name, as the scheduler would bind it; the control-plane
			// taint would have kept the scheduler away.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
	if err := w.Create(ctx, pod); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating pod %s: %w", name, err)
		}
		if err := w.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
	}
	// Ready, or the Eviction API lets an unhealthy pod go despite the budget.
	return setPodReady(ctx, w, pod, n.IP, true)
}

// UnblockDrain deletes the drain blockers BlockDrain put on machine's node:
// the budget, and the pod at once (no kubelet would ever end it). A drain
// under way evicts what is left on its next try.
func (s *Sim) UnblockDrain(ctx context.Context, machine string) error {
	onMachine := []client.DeleteAllOfOption{client.InNamespace(DrainBlockerNamespace), client.MatchingLabels{drainBlockerMachineLabel: machine}}
	if err := s.workload.DeleteAllOf(ctx, &policyv1.PodDisruptionBudget{}, onMachine...); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the drain blocker's budget: %w", err)
	}
	if err := s.workload.DeleteAllOf(ctx, &corev1.Pod{}, append(onMachine, client.GracePeriodSeconds(0))...); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the drain blocker's pod: %w", err)
	}
	return nil
}

// DisarmNeverProvision takes back a NeverProvisionNext that no machine has
// met yet.
func (s *Sim) DisarmNeverProvision() {
	s.provider.mu.Lock()
	s.provider.neverProvisionNext = false
	s.provider.mu.Unlock()
}

// strayLearnerPeerURL is where the stale-learner fault's learner would
// listen: an address of the cluster's /24 that no node is ever given (the
// provider hands out .2 to .254), so nothing ever answers there.
func (s *Sim) strayLearnerPeerURL() string {
	return fmt.Sprintf("https://%s.255:%d", s.opts.addressPrefix(), member.DefaultPeerPort)
}

// membersAt returns the IDs of the etcd members whose peer URLs include
// peerURL.
func membersAt(ctx context.Context, c *clientv3.Client, peerURL string) ([]uint64, error) {
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.MemberList(callCtx)
	if err != nil {
		return nil, fmt.Errorf("listing etcd members: %w", err)
	}
	var ids []uint64
	for _, m := range resp.Members {
		if slices.Contains(m.PeerURLs, peerURL) {
			ids = append(ids, m.ID)
		}
	}
	return ids, nil
}

// RemoveMembersAt removes the etcd members whose peer URLs include peerURL,
// as an operator cleans up after a failed join.
func (s *Sim) RemoveMembersAt(ctx context.Context, peerURL string) error {
	c, err := s.runningMembersClient(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	ids, err := membersAt(ctx, c, peerURL)
	if err != nil {
		return err
	}
	for _, id := range ids {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.MemberRemove(callCtx, id)
		cancel()
		if err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
			return fmt.Errorf("removing etcd member %x at %s: %w", id, peerURL, err)
		}
	}
	return nil
}

// addStrayLearnerOnce is AddStrayLearner unless a member at peerURL exists
// already: etcd would refuse a second one, and the fault is in effect.
func (s *Sim) addStrayLearnerOnce(ctx context.Context, peerURL string) (added bool, err error) {
	c, err := s.runningMembersClient(ctx)
	if err != nil {
		return false, err
	}
	defer c.Close()
	if ids, err := membersAt(ctx, c, peerURL); err != nil || len(ids) > 0 {
		return false, err
	}
	_, err = s.AddStrayLearner(ctx, peerURL)
	return err == nil, err
}
