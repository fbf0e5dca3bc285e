package sim

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
)

// Nodes returns the simulated hosts that hold a capacity slot or are
// waiting forever (NeverProvisionNext), by Machine name.
func (s *Sim) Nodes() map[string]Node { return s.provider.snapshot() }

// Machines lists the Cluster's control-plane Machines.
func (s *Sim) Machines(ctx context.Context) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := s.mgmt.List(ctx, list, client.InNamespace(s.opts.Namespace), client.MatchingLabels{
		clusterv1.ClusterNameLabel: s.opts.ClusterName,
	}, client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// EtcdMember is one member as etcd lists it.
type EtcdMember struct {
	ID        uint64
	Name      string
	IsLearner bool
	ClientURL string
	// Healthy is true when the member answered a status call without errors.
	Healthy bool
}

// EtcdMembers lists the etcd cluster's members through any running member
// and asks each for its status.
func (s *Sim) EtcdMembers(ctx context.Context) ([]EtcdMember, error) {
	c, err := s.runningMembersClient(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.MemberList(callCtx)
	if err != nil {
		return nil, fmt.Errorf("listing etcd members: %w", err)
	}
	out := make([]EtcdMember, 0, len(resp.Members))
	for _, m := range resp.Members {
		em := EtcdMember{ID: m.ID, Name: m.Name, IsLearner: m.IsLearner}
		if len(m.ClientURLs) > 0 {
			em.ClientURL = m.ClientURLs[0]
			st, err := c.Status(callCtx, em.ClientURL)
			em.Healthy = err == nil && len(st.Errors) == 0
		}
		out = append(out, em)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// etcdEndpoints are the client URLs of the running etcd members, sorted.
func (s *Sim) etcdEndpoints() ([]string, error) {
	var endpoints []string
	for _, n := range s.provider.snapshot() {
		if n.EtcdClientURL != "" {
			endpoints = append(endpoints, n.EtcdClientURL)
		}
	}
	if len(endpoints) == 0 {
		return nil, errors.New("no etcd member runs")
	}
	sort.Strings(endpoints)
	return endpoints, nil
}

// runningMembersClient is an etcd client for every member the simulator
// runs. The caller closes it.
func (s *Sim) runningMembersClient(ctx context.Context) (*clientv3.Client, error) {
	endpoints, err := s.etcdEndpoints()
	if err != nil {
		return nil, err
	}
	return s.EtcdClient(ctx, endpoints...)
}

// EtcdClient is an etcd client for the given endpoints with a client
// certificate minted from the cluster's etcd CA, as KCP and the tool do.
// The caller closes it.
func (s *Sim) EtcdClient(ctx context.Context, endpoints ...string) (*clientv3.Client, error) {
	ca, err := s.provider.etcdCASecret(ctx)
	if err != nil {
		return nil, err
	}
	cert, caCert, err := issueFromSecret(ca, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "cp-rollout-sim", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, time.Hour)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		TLS: &tls.Config{
			RootCAs:      pool,
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS12,
		},
	})
}

// Ready reports whether the control plane is settled: as many Machines as the
// KCP wants, none deleting, each with a nodeRef, and etcd members matching
// the Machines one to one, named after their nodes, voting and healthy; the
// MachineHealthCheck, if any, has found each healthy; and the workers, if
// any, all have their nodes. The string says what is missing
// when it is not.
func (s *Sim) Ready(ctx context.Context) (bool, string, error) {
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := s.mgmt.Get(ctx, s.KCPKey(), kcp); err != nil {
		return false, "", err
	}
	machines, err := s.Machines(ctx)
	if err != nil {
		return false, "", err
	}
	want := int(*kcp.Spec.Replicas)
	if len(machines) != want {
		return false, fmt.Sprintf("%d machines, want %d", len(machines), want), nil
	}
	nodeNames := map[string]bool{}
	for _, m := range machines {
		if !m.DeletionTimestamp.IsZero() {
			return false, fmt.Sprintf("machine %s is deleting", m.Name), nil
		}
		if !m.Status.NodeRef.IsDefined() {
			return false, fmt.Sprintf("machine %s has no nodeRef", m.Name), nil
		}
		nodeNames[m.Status.NodeRef.Name] = true
	}
	members, err := s.EtcdMembers(ctx)
	if err != nil {
		return false, err.Error(), nil
	}
	if len(members) != len(machines) {
		return false, fmt.Sprintf("%d etcd members for %d machines", len(members), len(machines)), nil
	}
	for _, m := range members {
		switch {
		case m.Name == "" || !nodeNames[m.Name]:
			return false, fmt.Sprintf("etcd member %x (%q) matches no machine's node", m.ID, m.Name), nil
		case m.IsLearner:
			return false, fmt.Sprintf("etcd member %s is a learner", m.Name), nil
		case !m.Healthy:
			return false, fmt.Sprintf("etcd member %s is unhealthy", m.Name), nil
		}
	}
	if !s.opts.WithoutMachineHealthCheck {
		// Its first verdict is a write to each Machine: until then the
		// cluster is not at rest.
		for _, m := range machines {
			if !conditions.IsTrue(&m, clusterv1.MachineHealthCheckSucceededCondition) {
				return false, fmt.Sprintf("the MachineHealthCheck has not found machine %s healthy", m.Name), nil
			}
		}
	}
	return s.workersReady(ctx)
}

// Workers lists the Cluster's worker Machines.
func (s *Sim) Workers(ctx context.Context) ([]clusterv1.Machine, error) {
	list := &clusterv1.MachineList{}
	if err := s.mgmt.List(ctx, list, client.InNamespace(s.opts.Namespace), client.MatchingLabels{
		clusterv1.ClusterNameLabel: s.opts.ClusterName,
	}); err != nil {
		return nil, err
	}
	var out []clusterv1.Machine
	for _, m := range list.Items {
		if _, cp := m.Labels[clusterv1.MachineControlPlaneLabel]; !cp {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// workersReady: as many worker Machines as Options.Workers, each with a node.
func (s *Sim) workersReady(ctx context.Context) (bool, string, error) {
	workers, err := s.Workers(ctx)
	if err != nil {
		return false, "", err
	}
	if len(workers) != int(s.opts.Workers) {
		return false, fmt.Sprintf("%d worker machines, want %d", len(workers), s.opts.Workers), nil
	}
	for _, m := range workers {
		if !m.Status.NodeRef.IsDefined() {
			return false, fmt.Sprintf("worker machine %s has no nodeRef", m.Name), nil
		}
	}
	return true, "", nil
}

// WaitReady waits until Ready, or fails with what was still missing when ctx
// ends or a simulator component failed.
func (s *Sim) WaitReady(ctx context.Context) error {
	last := "not checked yet"
	for {
		if err := s.Err(); err != nil {
			return err
		}
		ok, why, err := s.Ready(ctx)
		if err == nil && ok {
			return nil
		}
		if err != nil {
			why = err.Error()
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("simulator not ready: %s: %w", last, context.Cause(ctx))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Err reports a simulator component (a controller manager) that stopped on
// its own; nil while everything runs.
func (s *Sim) Err() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return errors.Join(s.errs...)
}
