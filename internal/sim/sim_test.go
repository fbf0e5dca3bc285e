package sim_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/test/builder"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
)

func TestMain(m *testing.M) { simtest.Main(m) }

// TestControlPlaneLifecycle walks one simulated control plane through what the
// tool relies on, with the real Machine and KCP controllers: start-up, a
// deletion held at the pre-terminate hook while KCP is paused, the same
// deletion carried through by KCP once unpaused, KCP's replacement, and a
// clean shutdown.
func TestControlPlaneLifecycle(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, sim.Options{Replicas: 3, ProvisionDelay: 500 * time.Millisecond, DeleteDelay: 200 * time.Millisecond}).Sim
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
		// The Machine webhook's default.
		if got := m.Spec.Deletion.NodeDeletionTimeoutSeconds; got == nil || *got != 10 {
			t.Errorf("machine %s: nodeDeletionTimeoutSeconds %v, want the Machine webhook's default 10", m.Name, got)
		}
	}

	t.Run("the Cluster controller reports the cluster initialized and owns the KCP", func(t *testing.T) {
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, s.ClusterKey(), cluster); err != nil {
			t.Fatal(err)
		}
		if i := cluster.Status.Initialization; i.InfrastructureProvisioned == nil || !*i.InfrastructureProvisioned ||
			i.ControlPlaneInitialized == nil || !*i.ControlPlaneInitialized || !conditions.IsTrue(cluster, clusterv1.ClusterControlPlaneInitializedCondition) {
			t.Errorf("Cluster initialization %+v, ControlPlaneInitialized %v; want both done", i, conditions.Get(cluster, clusterv1.ClusterControlPlaneInitializedCondition))
		}
		if _, ok := cluster.Annotations[clusterv1.PausedAnnotation]; ok || len(cluster.Finalizers) == 0 {
			t.Errorf("Cluster annotations %v, finalizers %v; want the Cluster controller's finalizer and no pause", cluster.Annotations, cluster.Finalizers)
		}
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
			t.Fatal(err)
		}
		owned := false
		for _, o := range kcp.OwnerReferences {
			owned = owned || (o.Kind == "Cluster" && o.UID == cluster.UID)
		}
		if !owned || kcp.Labels[clusterv1.ClusterNameLabel] != cluster.Name {
			t.Errorf("KCP owners %v, labels %v; want the Cluster's ownership and name label", kcp.OwnerReferences, kcp.Labels)
		}
		if _, paused := kcp.Annotations[clusterv1.PausedAnnotation]; paused {
			t.Error("KCP still paused after start-up")
		}
	})

	t.Run("each machine booted from the bootstrap data the kubeadm bootstrap controller wrote", func(t *testing.T) {
		for _, m := range machines {
			config := &bootstrapv1.KubeadmConfig{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.Bootstrap.ConfigRef.Name}, config); err != nil {
				t.Fatal(err)
			}
			data := &corev1.Secret{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: config.Status.DataSecretName}, data); err != nil {
				t.Fatalf("machine %s: bootstrap data %q: %v", m.Name, config.Status.DataSecretName, err)
			}
			if !strings.Contains(string(data.Data["value"]), "kubeadm ") || m.Spec.Bootstrap.DataSecretName == nil || *m.Spec.Bootstrap.DataSecretName != data.Name {
				t.Errorf("machine %s: bootstrap data %s is not kubeadm's cloud-config, or not the machine's", m.Name, data.Name)
			}
			node := &corev1.Node{}
			if err := s.WorkloadClient().Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node); err != nil {
				t.Fatal(err)
			}
			if node.CreationTimestamp.Before(&data.CreationTimestamp) {
				t.Errorf("machine %s: node %s registered at %s, before its bootstrap data existed (%s)", m.Name, node.Name, node.CreationTimestamp, data.CreationTimestamp)
			}
		}
	})

	t.Run("the MachineHealthCheck finds every control-plane machine healthy", func(t *testing.T) {
		simtest.Eventually(t, time.Minute, "the MachineHealthCheck's verdict on 3 machines", func(ctx context.Context) (bool, string, error) {
			list := &clusterv1.MachineHealthCheckList{}
			if err := c.List(ctx, list, client.InNamespace(s.ClusterKey().Namespace)); err != nil {
				return false, "", err
			}
			if len(list.Items) != 1 {
				return false, fmt.Sprintf("%d MachineHealthChecks", len(list.Items)), nil
			}
			st := list.Items[0].Status
			if st.ExpectedMachines == nil || *st.ExpectedMachines != 3 || st.CurrentHealthy == nil || *st.CurrentHealthy != 3 {
				return false, fmt.Sprintf("expected %v, healthy %v", st.ExpectedMachines, st.CurrentHealthy), nil
			}
			machines, err := s.Machines(ctx)
			if err != nil {
				return false, "", err
			}
			for _, m := range machines {
				if !conditions.IsTrue(&m, clusterv1.MachineHealthCheckSucceededCondition) {
					return false, fmt.Sprintf("machine %s: %v", m.Name, conditions.Get(&m, clusterv1.MachineHealthCheckSucceededCondition)), nil
				}
			}
			return true, "", nil
		})
	})

	t.Run("Cluster API's admission webhooks reject what a real cluster rejects", func(t *testing.T) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
			t.Fatal(err)
		}
		skip := kcp.DeepCopy()
		skip.Spec.Version = "v1.37.0" // from v1.35.2: one minor too far
		err := c.Patch(ctx, skip, client.MergeFrom(kcp), client.DryRunAll)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "version") {
			t.Errorf("KCP minor skip: %v, want the KCP webhook's refusal", err)
		}
		bad := machines[0].DeepCopy()
		bad.ObjectMeta = metav1.ObjectMeta{Namespace: bad.Namespace, GenerateName: "bad-", Labels: bad.Labels}
		bad.Spec.ProviderID = ""
		bad.Spec.Version = "one.two"
		err = c.Create(ctx, bad, client.DryRunAll)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "version") {
			t.Errorf("Machine with version %q: %v, want the Machine webhook's refusal", bad.Spec.Version, err)
		}
	})

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
		simtest.Eventually(t, 90*time.Second, "KCP EtcdClusterHealthy and ControlPlaneComponentsHealthy", func(ctx context.Context) (bool, string, error) {
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
		simtest.Eventually(t, 60*time.Second, "KCP Paused condition", func(ctx context.Context) (bool, string, error) {
			kcp := &controlplanev1.KubeadmControlPlane{}
			if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
				return false, "", err
			}
			return conditions.IsTrue(kcp, clusterv1.PausedCondition), fmt.Sprintf("%+v", conditions.Get(kcp, clusterv1.PausedCondition)), nil
		})
		if err := c.Delete(ctx, &victim); err != nil {
			t.Fatal(err)
		}
		simtest.Eventually(t, 60*time.Second, "Deleting reason WaitingForPreTerminateHook", func(ctx context.Context) (bool, string, error) {
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
		simtest.Eventually(t, 90*time.Second, "machine, node and member gone", func(ctx context.Context) (bool, string, error) {
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
	t.Parallel()
	s := simtest.Start(t, sim.Options{Replicas: 1, Capacity: 1, WithoutKCP: true}).Sim
	ctx := context.Background()
	c := s.ManagementClient()
	surge := createMachineAndWait(t, s)
	if surge.Status.NodeRef.IsDefined() {
		t.Fatalf("surge machine got node %s beyond capacity", surge.Status.NodeRef.Name)
	}
	if _, ok := s.Nodes()[surge.Name]; ok {
		t.Fatal("surge machine took a slot beyond capacity")
	}

	// As KCP does, the creating field manager keeps no claim on labels and
	// annotations of the KubeadmConfig and the InfraMachine.
	config := &bootstrapv1.KubeadmConfig{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: surge.Namespace, Name: surge.Spec.Bootstrap.ConfigRef.Name}, config); err != nil {
		t.Fatal(err)
	}
	infra := &unstructured.Unstructured{}
	infra.SetAPIVersion(builder.InfrastructureGroupVersion.String())
	infra.SetKind(surge.Spec.InfrastructureRef.Kind)
	if err := c.Get(ctx, client.ObjectKey{Namespace: surge.Namespace, Name: surge.Spec.InfrastructureRef.Name}, infra); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []client.Object{config, infra} {
		applied := false
		for _, f := range obj.GetManagedFields() {
			if f.Manager != "capi-kubeadmcontrolplane" || f.FieldsV1 == nil {
				continue
			}
			applied = true
			if raw := string(f.FieldsV1.Raw); strings.Contains(raw, `"f:labels"`) || strings.Contains(raw, `"f:annotations"`) {
				t.Errorf("%s: capi-kubeadmcontrolplane still owns labels or annotations: %s", obj.GetName(), raw)
			}
		}
		if !applied {
			t.Errorf("%s was not applied by capi-kubeadmcontrolplane", obj.GetName())
		}
	}
}

// TestKCPOnItsOwn: on a cluster with 3 failure domains and 2 workers, the
// workers join as workers; KCP left alone on a healthy simulated cluster
// changes nothing; every member is reachable by port-forward through the
// workload API server; the management API server can restart under the
// controllers; and a new spec.version makes the real KCP roll every machine,
// keeping one per failure domain, and then move kube-proxy and CoreDNS as it
// does after a rollout.
func TestKCPOnItsOwn(t *testing.T) {
	t.Parallel()
	s := simtest.StartOwn(t, sim.Options{Replicas: 3, Workers: 2, FailureDomains: 3, ProvisionDelay: 200 * time.Millisecond, DeleteDelay: 200 * time.Millisecond}).Sim
	ctx := context.Background()
	c := s.ManagementClient()

	t.Run("the initial machines spread one per failure domain", func(t *testing.T) { simtest.AssertOnePerDomain(t, s) })

	t.Run("the MachineDeployment's two workers join without etcd or the control-plane role", func(t *testing.T) {
		workers, err := s.Workers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(workers) != 2 {
			t.Fatalf("%d worker machines, want 2", len(workers))
		}
		nodes := s.Nodes()
		for _, m := range workers {
			if m.Labels[clusterv1.MachineDeploymentNameLabel] != "demo-md-0" {
				t.Errorf("worker %s labels %v, want the MachineDeployment's", m.Name, m.Labels)
			}
			node := &corev1.Node{}
			if err := s.WorkloadClient().Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node); err != nil {
				t.Fatal(err)
			}
			tainted := false
			for _, taint := range node.Spec.Taints {
				tainted = tainted || taint.Key == "node-role.kubernetes.io/control-plane"
			}
			if _, cp := node.Labels["node-role.kubernetes.io/control-plane"]; cp || tainted {
				t.Errorf("worker node %s labels %v, taints %v; want neither the control-plane role nor its taint", node.Name, node.Labels, node.Spec.Taints)
			}
			if n := nodes[m.Name]; n.EtcdClientURL != "" {
				t.Errorf("worker %s runs an etcd member at %s", m.Name, n.EtcdClientURL)
			}
		}
		if members, err := s.EtcdMembers(ctx); err != nil || len(members) != 3 {
			t.Errorf("etcd members %v (%v), want the 3 control-plane machines' alone", members, err)
		}
	})

	t.Run("port-forward through the workload API server reaches every member", func(t *testing.T) {
		members, err := s.EtcdMembers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]uint64{}
		for _, m := range members {
			ids[m.Name] = m.ID
		}
		for _, n := range s.Nodes() {
			if n.EtcdClientURL == "" {
				continue // a worker
			}
			local, stop := portForward(t, s.WorkloadConfig(), "etcd-"+n.Name, 2379)
			ec, err := s.EtcdClient(ctx, "https://"+local)
			if err != nil {
				stop()
				t.Fatal(err)
			}
			callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			st, err := ec.Status(callCtx, "https://"+local)
			cancel()
			ec.Close()
			stop()
			if err != nil {
				t.Fatalf("etcd status through port-forward to etcd-%s: %v", n.Name, err)
			}
			if st.Header.MemberId != ids[n.Name] {
				t.Errorf("port-forward to etcd-%s reached member %x, want %x", n.Name, st.Header.MemberId, ids[n.Name])
			}
		}
	})

	before := machineUIDs(t, s)
	t.Run("KCP left alone creates and deletes nothing for a minute", func(t *testing.T) {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			now := machineUIDs(t, s)
			if !sameKeys(before, now) {
				t.Fatalf("machines changed from %v to %v", before, now)
			}
			time.Sleep(2 * time.Second)
		}
	})

	t.Run("management API server restart", func(t *testing.T) {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := s.RestartManagementAPIServer(rctx); err != nil {
			t.Fatal(err)
		}
		if err := s.WaitReady(rctx); err != nil {
			t.Fatal(err)
		}
		if now := machineUIDs(t, s); !sameKeys(before, now) {
			t.Fatalf("machines changed across the restart: %v to %v", before, now)
		}
	})

	t.Run("a new spec.version makes KCP roll every machine", func(t *testing.T) {
		const target = "v1.36.3"
		corefile := addonsBefore(t, s.WorkloadClient(), s.Options().Version)
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
			t.Fatal(err)
		}
		dns, err := sim.CoreDNSVersion(target)
		if err != nil {
			t.Fatal(err)
		}
		updated := kcp.DeepCopy()
		updated.Spec.Version = target
		updated.Spec.KubeadmConfigSpec.ClusterConfiguration.DNS.ImageTag = dns // as kubeadm pairs them
		if err := c.Patch(ctx, updated, client.MergeFrom(kcp)); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		simtest.Eventually(t, 5*time.Minute, "every machine replaced at "+target, func(ctx context.Context) (bool, string, error) {
			machines, err := s.Machines(ctx)
			if err != nil {
				return false, "", err
			}
			for _, m := range machines {
				if _, old := before[string(m.UID)]; old || m.Spec.Version != target {
					return false, fmt.Sprintf("machine %s at %s still there", m.Name, m.Spec.Version), nil
				}
			}
			ok, why, err := s.Ready(ctx)
			return ok, why, err
		})
		t.Logf("KCP rolled 3 machines to %s in %.1fs", target, time.Since(began).Seconds())
		// The baseline the tool is held to: KCP keeps one machine per domain.
		simtest.AssertOnePerDomain(t, s)
		// What KCP does once the machines are done: kube-proxy, CoreDNS.
		addonsFollow(t, s.WorkloadClient(), target, corefile)
	})
}

func machineUIDs(t *testing.T, s *sim.Sim) map[string]string {
	t.Helper()
	machines, err := s.Machines(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range machines {
		out[string(m.UID)] = m.Name
	}
	return out
}

func sameKeys(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// portForward forwards a free local port to a kube-system pod's port
// through the API server, as kubectl port-forward does.
func portForward(t *testing.T, cfg *rest.Config, pod string, port int) (string, func()) {
	t.Helper()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/api/v1/namespaces/kube-system/pods/" + pod + "/portforward"
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	stopCh, readyCh := make(chan struct{}), make(chan struct{})
	fw, err := portforward.New(dialer, []string{fmt.Sprintf("0:%d", port)}, stopCh, readyCh, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errCh := make(chan error, 1)
	go func() { errCh <- fw.ForwardPorts() }()
	select {
	case <-readyCh:
	case err := <-errCh:
		t.Fatalf("port-forward to %s: %v", pod, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("port-forward to %s: not ready after 30s", pod)
	}
	ports, err := fw.GetPorts()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local), func() { close(stopCh) }
}

// TestFaults: the fault hooks act on the simulated hosts and the simulator's
// own readiness check sees them.
func TestFaults(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, sim.Options{Replicas: 3, WithoutKCP: true}).Sim
	ctx := context.Background()
	var node sim.Node
	for _, n := range s.Nodes() {
		node = n
		break
	}

	t.Run("static pod unready", func(t *testing.T) {
		if err := s.SetStaticPodReady(ctx, node.Name, "kube-apiserver", false); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{}
		if err := s.WorkloadClient().Get(ctx, client.ObjectKey{Namespace: "kube-system", Name: "kube-apiserver-" + node.Name}, pod); err != nil {
			t.Fatal(err)
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status != corev1.ConditionFalse {
				t.Fatalf("pod Ready = %s, want False", cond.Status)
			}
		}
		if err := s.SetStaticPodReady(ctx, node.Name, "kube-apiserver", true); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a stopped member is listed unhealthy, and healthy once restarted", func(t *testing.T) {
		if err := s.StopMember(node.Name); err != nil {
			t.Fatal(err)
		}
		simtest.Eventually(t, 30*time.Second, "member unhealthy", func(ctx context.Context) (bool, string, error) {
			members, err := s.EtcdMembers(ctx)
			if err != nil {
				return false, "", err
			}
			for _, m := range members {
				if m.Name == node.Name {
					return !m.Healthy, fmt.Sprintf("%+v", m), nil
				}
			}
			return false, "member not listed", nil
		})
		if ok, _, _ := s.Ready(ctx); ok {
			t.Fatal("Ready with a stopped member")
		}
		if err := s.RestartMember(ctx, node.Name); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := s.WaitReady(wctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a machine that never provisions", func(t *testing.T) {
		s.NeverProvisionNext()
		m := createMachineAndWait(t, s)
		if m.Status.NodeRef.IsDefined() || m.Spec.ProviderID != "" {
			t.Fatalf("machine provisioned anyway: node %q, providerID %q", m.Status.NodeRef.Name, m.Spec.ProviderID)
		}
	})
}

// createMachineAndWait creates a control-plane machine as the tool creates a
// replacement and returns it as it is 3 seconds later, far beyond the
// provisioning delay of the tests that hold it back.
func createMachineAndWait(t *testing.T, s *sim.Sim) *clusterv1.Machine {
	t.Helper()
	created := createMachine(t, s)
	time.Sleep(3 * time.Second)
	m := &clusterv1.Machine{}
	if err := s.ManagementClient().Get(context.Background(), client.ObjectKeyFromObject(created), m); err != nil {
		t.Fatal(err)
	}
	return m
}

// createMachine creates a control-plane machine from the KCP as it is now,
// as the tool creates a replacement (and KCP would).
func createMachine(t *testing.T, s *sim.Sim) *clusterv1.Machine {
	t.Helper()
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
	created, err := controlplane.New(c, cluster.Namespace, cluster.Name).CreateMachine(ctx, kcp, cluster, "", true)
	if err != nil {
		t.Fatal(err)
	}
	return created
}
