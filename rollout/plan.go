package rollout

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// maxPlannedSteps bounds a projection; a real plan has a few steps per machine.
const maxPlannedSteps = 200

// Plan projects the steps the loop would take from s towards t: it asks Next,
// applies the step's expected outcome to a copy of the snapshot (a new machine
// joins healthy, a deleted machine and its member go, leadership moves to the
// first candidate, a member no machine owns goes), and asks again — so a plan is what the loop decides, not a
// second implementation of it. It stops at Done or at a refusal, which it
// includes.
func Plan(ctx context.Context, s *Snapshot, t Target) []Step {
	steps, _ := project(ctx, s.clone(), t, 0)
	return steps
}

// PlanHops is Plan for every hop of a prepared upgrade, from its first
// remaining hop: after a hop's steps every machine runs that hop's version,
// and the next hop finds them all outdated. The i-th list holds the steps of
// p.Hops[p.FirstHop+i]; the lists stop at a refusal.
func PlanHops(ctx context.Context, p *Prepared) [][]Step {
	s, t := p.Snapshot.clone(), p.Target
	var out [][]Step
	made := 0
	for i := p.FirstHop; i < len(p.Hops); i++ {
		if i > p.FirstHop {
			s = s.nextHop(p.Hops[i])
			t.Version = p.Hops[i]
		}
		steps, n := project(ctx, s, t, made)
		made += n
		out = append(out, steps)
		if len(steps) > 0 && steps[len(steps)-1].Action == Refuse {
			break
		}
	}
	return out
}

// project applies the steps towards t to s and returns them, and how many
// machines it made (named new-<made+1>, ...).
func project(ctx context.Context, s *Snapshot, t Target, made int) ([]Step, int) {
	var steps []Step
	for n := 0; n < maxPlannedSteps; n++ {
		step := Next(ctx, s, t)
		// A sync is shown once, where it comes; after it, the machines
		// count as in sync — the ones the projection adds are bare stand-ins
		// that would otherwise never be (OutOfSync).
		s.projected = true
		if step.Action == Done {
			return steps, made
		}
		steps = append(steps, step)
		switch step.Action {
		case Refuse:
			return steps, made
		case Create:
			made++
			s.join(fmt.Sprintf("new-%d", made), step.FailureDomain)
			s.setRemediation("") // as the run does once the replacement exists
		case AwaitJoin:
			s.heal(step.Machine)
		case Delete:
			if r, ok := RemediationRecord(s, t, step.Machine); ok {
				s.setRemediation(r.Marshal())
			}
			s.remove(step.Machine)
		case ServeCleanupHook, AwaitDeletion:
			s.remove(step.Machine)
		case RemoveStaleMember:
			s.Members = slices.DeleteFunc(s.Members, func(m etcd.Member) bool { return m.ID == step.Member.ID })
		}
	}
	return steps, made
}

// nextHop is s, its hop done, as the next hop to version finds it: the
// KubeadmControlPlane (and a topology) asks for version, and every machine
// is outdated.
func (s *Snapshot) nextHop(version string) *Snapshot {
	c := s.clone()
	kcp := c.CP.KCP.DeepCopy()
	kcp.Spec.Version = version
	c.CP.KCP = kcp
	if c.CP.Cluster.Spec.Topology.IsDefined() {
		cluster := c.CP.Cluster.DeepCopy()
		cluster.Spec.Topology.Version = version
		c.CP.Cluster = cluster
	}
	c.CP.MachinesNotUpToDate = c.CP.Machines.Filter()
	return c
}

// clone copies what a projection changes; machines themselves are only ever
// replaced, never mutated.
func (s *Snapshot) clone() *Snapshot {
	c := *s
	cp := *s.CP
	cp.Machines = s.CP.Machines.Filter() // a new set holding the same machines
	cp.MachinesNotUpToDate = s.CP.MachinesNotUpToDate.Filter()
	cp.InfraResources = map[string]*unstructured.Unstructured{}
	for k, v := range s.CP.InfraResources {
		cp.InfraResources[k] = v
	}
	cp.KubeadmConfigs = map[string]*bootstrapv1.KubeadmConfig{}
	for k, v := range s.CP.KubeadmConfigs {
		cp.KubeadmConfigs[k] = v
	}
	c.CP = &cp
	c.Nodes = map[string]workload.Node{}
	for k, v := range s.Nodes {
		c.Nodes[k] = v
	}
	c.Members = append([]etcd.Member{}, s.Members...)
	return &c
}

// setRemediation sets (or with "" removes) KCP's remediation-in-progress
// annotation on the projected KubeadmControlPlane, as the run writes it.
func (s *Snapshot) setRemediation(value string) {
	kcp := s.CP.KCP.DeepCopy()
	if value == "" {
		delete(kcp.Annotations, controlplanev1.RemediationInProgressAnnotation)
	} else {
		if kcp.Annotations == nil {
			kcp.Annotations = map[string]string{}
		}
		kcp.Annotations[controlplanev1.RemediationInProgressAnnotation] = value
	}
	s.CP.KCP = kcp
}

// join adds an up-to-date machine that has become healthy.
func (s *Snapshot) join(name, failureDomain string) {
	// Newer than every machine, as a real replacement would be.
	created := s.Now
	if newest := s.CP.Machines.Newest(); newest != nil && !newest.CreationTimestamp.Before(&metav1.Time{Time: created}) {
		created = newest.CreationTimestamp.Add(time.Second)
	}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.CP.Cluster.Namespace,
		CreationTimestamp: metav1.NewTime(created)}}
	m.Spec.Version = s.CP.KCP.Spec.Version
	m.Spec.FailureDomain = failureDomain
	s.CP.Machines.Insert(m)
	s.CP.InfraResources[name] = &unstructured.Unstructured{}
	s.CP.KubeadmConfigs[name] = &bootstrapv1.KubeadmConfig{}
	s.heal(m)
}

// heal gives m a Ready node with Ready static pods and a healthy voting member.
func (s *Snapshot) heal(m *clusterv1.Machine) {
	node := nodeName(m)
	if node == "" {
		fresh := m.DeepCopy()
		fresh.Status.NodeRef = clusterv1.MachineNodeReference{Name: "node-of-" + m.Name}
		s.CP.Machines.Insert(fresh)
		m, node = fresh, fresh.Status.NodeRef.Name
	}
	pods := map[string]bool{}
	for _, c := range components(s) {
		pods[c] = true
	}
	s.Nodes[node] = workload.Node{Name: node, Found: true, Ready: true, Pods: pods}
	if !s.EtcdManaged {
		return
	}
	// Its member is the one named after its node or, while it has not
	// started, the unnamed one; either way it ends up named, voting, healthy.
	i := slices.IndexFunc(s.Members, func(member etcd.Member) bool { return member.Name == node })
	if i < 0 {
		i = slices.IndexFunc(s.Members, func(member etcd.Member) bool { return !member.Started() })
	}
	if i >= 0 {
		s.Members[i] = etcd.Member{ID: s.Members[i].ID, Name: node, Healthy: true, Leader: s.Members[i].Leader}
		return
	}
	var id uint64 = 1
	for _, member := range s.Members {
		id = max(id, member.ID+1)
	}
	s.Members = append(s.Members, etcd.Member{ID: id, Name: node, Healthy: true})
}

// remove takes m, its node and its member away, moving leadership first.
func (s *Snapshot) remove(m *clusterv1.Machine) {
	if Leads(s, m) {
		if next := LeaderCandidates(s, m); len(next) > 0 {
			for i := range s.Members {
				s.Members[i].Leader = s.Members[i].ID == next[0].ID
			}
		}
	}
	node := nodeName(m)
	for i, member := range s.Members {
		if node != "" && member.Name == node {
			s.Members = append(s.Members[:i], s.Members[i+1:]...)
			break
		}
	}
	delete(s.Nodes, node)
	kept := s.CP.Machines.Filter(func(o *clusterv1.Machine) bool { return o != nil && o.Name != m.Name })
	s.CP.Machines = kept
	s.CP.MachinesNotUpToDate = s.CP.MachinesNotUpToDate.Filter(func(o *clusterv1.Machine) bool { return o != nil && o.Name != m.Name })
}
