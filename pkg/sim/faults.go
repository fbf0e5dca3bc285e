package sim

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Fault hooks for tests and rehearsals. Each acts on the simulated hosts
// only; what the controllers and the tool make of it is theirs.

// StopMember stops the etcd member of the named node, as a crashed etcd
// would: it stays in the member list, unreachable. The node and its pods stay.
func (s *Sim) StopMember(nodeName string) error {
	n := s.provider.nodeByName(nodeName)
	if n == nil {
		return fmt.Errorf("%w: %s", errUnknownNode, nodeName)
	}
	s.provider.mu.Lock()
	m := n.member
	s.provider.mu.Unlock()
	if m == nil {
		return fmt.Errorf("node %s runs no etcd member", nodeName)
	}
	m.Stop()
	return nil
}

// RestartMember starts a member StopMember stopped again with its identity and
// data, as a node whose etcd comes back after a crash.
func (s *Sim) RestartMember(ctx context.Context, nodeName string) error {
	n := s.provider.nodeByName(nodeName)
	if n == nil {
		return fmt.Errorf("%w: %s", errUnknownNode, nodeName)
	}
	s.provider.mu.Lock()
	m := n.member
	s.provider.mu.Unlock()
	if m == nil {
		return fmt.Errorf("node %s runs no etcd member", nodeName)
	}
	return m.Restart(ctx)
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
