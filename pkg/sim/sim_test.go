package sim_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/sim"
)

func TestMain(m *testing.M) {
	logger := logr.Discard()
	if os.Getenv("SIM_LOG") != "" {
		logger = funcr.New(func(prefix, args string) {
			fmt.Fprintf(os.Stderr, "%s %s %s\n", time.Now().Format("15:04:05.000"), prefix, args)
		}, funcr.Options{})
	}
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	os.Exit(m.Run())
}

func testLogger() logr.Logger {
	if os.Getenv("SIM_LOG") == "" {
		return logr.Discard()
	}
	return ctrl.Log
}

// Tests give their simulators loopback addresses of their own (AddressPrefix)
// because members use the fixed kubeadm ports and other packages' tests run
// etcd members on 127.0.0.x at the same time.

// startSim starts a simulator and stops it when the test ends. Missing
// binaries fail the test: a skipped simulator proves nothing.
func startSim(t *testing.T, opts sim.Options) *sim.Sim {
	t.Helper()
	opts.Log = testLogger()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	s, err := sim.Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting the simulator: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping the simulator: %v", err)
		}
	})
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("simulator with %d replicas ready in %.1fs", s.Options().Replicas, time.Since(began).Seconds())
	return s
}

func eventually(t *testing.T, timeout time.Duration, what string, check func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	last := ""
	for {
		ok, why, err := check(ctx)
		if err != nil {
			why = err.Error()
		}
		if ok {
			return
		}
		last = why
		select {
		case <-ctx.Done():
			t.Fatalf("%s: still not after %s: %s", what, timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// TestControlPlaneLifecycle walks one simulated control plane through what the
// tool relies on, with the real Machine and KCP controllers: start-up, a
// deletion held at the pre-terminate hook while KCP is paused, the same
// deletion carried through by KCP once unpaused, KCP's replacement, and a
// clean shutdown.
func TestControlPlaneLifecycle(t *testing.T) {
	s := startSim(t, sim.Options{Replicas: 3, ProvisionDelay: 500 * time.Millisecond, DeleteDelay: 200 * time.Millisecond, AddressPrefix: "127.77.0"})
	ctx := context.Background()
	c := s.ManagementClient()

	machines, err := s.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodes := s.Nodes()
	for _, m := range machines {
		n, ok := nodes[m.Name]
		if !ok {
			t.Fatalf("machine %s has no simulated node", m.Name)
		}
		if m.Status.NodeRef.Name != n.Name || n.Name == m.Name {
			t.Errorf("machine %s: nodeRef %q, simulated node %q; want equal and different from the machine name", m.Name, m.Status.NodeRef.Name, n.Name)
		}
		if _, ok := m.Annotations[controlplanev1.PreTerminateHookCleanupAnnotation]; !ok {
			t.Errorf("machine %s lacks KCP's pre-terminate hook", m.Name)
		}
	}

	t.Run("etcd members equal machines, named and voting", func(t *testing.T) {
		members, err := s.EtcdMembers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(members) != len(machines) {
			t.Fatalf("%d members for %d machines", len(members), len(machines))
		}
		for _, m := range members {
			if m.Name == "" || m.IsLearner || !m.Healthy {
				t.Errorf("member %+v: want named, voting, healthy", m)
			}
		}
	})

	t.Run("KCP reports the control plane healthy", func(t *testing.T) {
		eventually(t, 90*time.Second, "KCP EtcdClusterHealthy and ControlPlaneComponentsHealthy", func(ctx context.Context) (bool, string, error) {
			kcp := &controlplanev1.KubeadmControlPlane{}
			if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
				return false, "", err
			}
			for _, ct := range []string{controlplanev1.KubeadmControlPlaneEtcdClusterHealthyCondition, controlplanev1.KubeadmControlPlaneControlPlaneComponentsHealthyCondition} {
				if !conditions.IsTrue(kcp, ct) {
					cond := conditions.Get(kcp, ct)
					return false, fmt.Sprintf("%s: %+v", ct, cond), nil
				}
			}
			return true, "", nil
		})
	})

	victim := machines[0]
	victimNode := nodes[victim.Name]

	t.Run("with KCP paused a deletion waits at the pre-terminate hook", func(t *testing.T) {
		setKCPPaused(t, c, s.KCPKey(), true)
		eventually(t, 60*time.Second, "KCP Paused condition", func(ctx context.Context) (bool, string, error) {
			kcp := &controlplanev1.KubeadmControlPlane{}
			if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
				return false, "", err
			}
			return conditions.IsTrue(kcp, clusterv1.PausedCondition), fmt.Sprintf("%+v", conditions.Get(kcp, clusterv1.PausedCondition)), nil
		})
		if err := c.Delete(ctx, &victim); err != nil {
			t.Fatal(err)
		}
		eventually(t, 60*time.Second, "Deleting reason WaitingForPreTerminateHook", func(ctx context.Context) (bool, string, error) {
			m := &clusterv1.Machine{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(&victim), m); err != nil {
				return false, "", err
			}
			cond := conditions.Get(m, clusterv1.MachineDeletingCondition)
			return cond != nil && cond.Reason == clusterv1.MachineDeletingWaitingForPreTerminateHookReason, fmt.Sprintf("%+v", cond), nil
		})
		// Held means held: still held a moment later, node and member still there.
		time.Sleep(2 * time.Second)
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(&victim), m); err != nil {
			t.Fatalf("machine went while KCP was paused: %v", err)
		}
		if err := s.WorkloadClient().Get(ctx, client.ObjectKey{Name: victimNode.Name}, &corev1.Node{}); err != nil {
			t.Fatalf("node went while the hook was held: %v", err)
		}
		if !hasMember(t, s, victimNode.Name) {
			t.Fatal("etcd member went while the hook was held")
		}
	})

	t.Run("unpaused KCP serves the hook and the deletion goes all the way", func(t *testing.T) {
		setKCPPaused(t, c, s.KCPKey(), false)
		eventually(t, 90*time.Second, "machine, node and member gone", func(ctx context.Context) (bool, string, error) {
			err := c.Get(ctx, client.ObjectKeyFromObject(&victim), &clusterv1.Machine{})
			if !apierrors.IsNotFound(err) {
				return false, "machine still exists", client.IgnoreNotFound(err)
			}
			err = s.WorkloadClient().Get(ctx, client.ObjectKey{Name: victimNode.Name}, &corev1.Node{})
			if !apierrors.IsNotFound(err) {
				return false, "node still exists", client.IgnoreNotFound(err)
			}
			if hasMember(t, s, victimNode.Name) {
				return false, "member still listed", nil
			}
			return true, "", nil
		})
	})

	t.Run("KCP replaces the machine", func(t *testing.T) {
		waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := s.WaitReady(waitCtx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("shutdown leaves nothing running", func(t *testing.T) {
		var addrs []string
		for _, n := range s.Nodes() {
			addrs = append(addrs, strings.TrimPrefix(n.EtcdClientURL, "https://"))
		}
		mgmt := s.ManagementConfig().Host
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		for _, a := range append(addrs, strings.TrimPrefix(mgmt, "https://")) {
			if conn, err := net.DialTimeout("tcp", a, time.Second); err == nil {
				conn.Close()
				t.Errorf("%s still accepts connections after Stop", a)
			}
		}
	})
}

func hasMember(t *testing.T, s *sim.Sim, name string) bool {
	t.Helper()
	members, err := s.EtcdMembers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if m.Name == name {
			return true
		}
	}
	return false
}

func setKCPPaused(t *testing.T, c client.Client, key client.ObjectKey, paused bool) {
	t.Helper()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(context.Background(), key, kcp); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(kcp.DeepCopy())
	if paused {
		if kcp.Annotations == nil {
			kcp.Annotations = map[string]string{}
		}
		kcp.Annotations[clusterv1.PausedAnnotation] = ""
	} else {
		delete(kcp.Annotations, clusterv1.PausedAnnotation)
	}
	if err := c.Patch(context.Background(), kcp, patch); err != nil {
		t.Fatal(err)
	}
}

// TestCapacityHoldsBackSurgeMachine: with every slot taken, an extra machine
// stays unprovisioned until a slot frees.
func TestCapacityHoldsBackSurgeMachine(t *testing.T) {
	s := startSim(t, sim.Options{Replicas: 1, Capacity: 1, WithoutKCP: true, AddressPrefix: "127.77.1"})
	ctx := context.Background()
	c := s.ManagementClient()
	cluster := &clusterv1.Cluster{}
	if err := c.Get(ctx, s.ClusterKey(), cluster); err != nil {
		t.Fatal(err)
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
		t.Fatal(err)
	}
	surge, err := sim.CreateMachineAsKCP(ctx, c, cluster, kcp, true)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	m := &clusterv1.Machine{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(surge), m); err != nil {
		t.Fatal(err)
	}
	if m.Status.NodeRef.IsDefined() {
		t.Fatalf("surge machine got node %s beyond capacity", m.Status.NodeRef.Name)
	}
	if _, ok := s.Nodes()[surge.Name]; ok {
		t.Fatal("surge machine took a slot beyond capacity")
	}
	_ = metav1.Now
}
