package sim

import (
	"context"
	"fmt"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/pkg/sim/member"
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
	endpoints, err := s.etcdEndpoints()
	if err != nil {
		return 0, err
	}
	c, err := s.EtcdClient(ctx, endpoints...)
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
