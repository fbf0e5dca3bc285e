package e2e

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// The etcd package against the simulator: through the workload API server's
// pods/portforward (as in production) and directly at each node's address.
func TestEtcdThroughTheSimulator(t *testing.T) {
	t.Parallel()
	e := readOnly.Use(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := e.Sim.ManagementClient()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	creds, err := etcd.LoadCredentials(ctx, c, e.Sim.ClusterKey(), kcp)
	if err != nil {
		t.Fatal(err)
	}
	wl, err := workload.New(ctx, c, e.Sim.ClusterKey().Namespace, e.Sim.ClusterKey().Name)
	if err != nil {
		t.Fatal(err)
	}
	machines := &clusterv1.MachineList{}
	if err := c.List(ctx, machines, client.InNamespace(e.Sim.ClusterKey().Namespace)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range machines.Items {
		names = append(names, m.Status.NodeRef.Name)
	}
	health, err := wl.Nodes(ctx, names, workload.Components)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []etcd.Node
	for _, n := range health {
		nodes = append(nodes, etcd.Node{Name: n.Name, IP: n.InternalIP})
	}

	forward, err := etcd.NewPortForwardDialer(wl.Config)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := etcd.NewDirectDialer("https://{{.NodeIP}}:2379")
	if err != nil {
		t.Fatal(err)
	}
	for name, dialer := range map[string]etcd.Dialer{"port-forward": forward, "direct": direct} {
		t.Run(name, func(t *testing.T) {
			ec, err := etcd.New(etcd.Config{Dialer: dialer, Credentials: creds})
			if err != nil {
				t.Fatal(err)
			}
			defer ec.Close()
			members, err := ec.Members(ctx, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if len(members) != 3 {
				t.Fatalf("%d members, want 3: %v", len(members), members)
			}
			for _, m := range members {
				if !m.Healthy || !m.Voting() || m.Node == "" {
					t.Errorf("member %s: healthy=%v voting=%v node=%q (every member is reached on its own node)", m, m.Healthy, m.Voting(), m.Node)
				}
			}
			leader, ok := etcd.Leader(members)
			if !ok {
				t.Fatal("no leader")
			}
			var to etcd.Member
			for _, m := range members {
				if m.ID != leader.ID {
					to = m
					break
				}
			}
			if err := ec.MoveLeader(ctx, nodes, to.ID); err != nil {
				t.Fatalf("moving leadership from %s to %s: %v", leader, to, err)
			}
			after, err := ec.Members(ctx, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if now, _ := etcd.Leader(after); now.ID != to.ID {
				t.Fatalf("leader is %s, want %s", now, to)
			}
		})
	}
}
