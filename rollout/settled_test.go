package rollout

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// TestUnsettledUntilKCPAgrees walks a KCP through what it does after the
// hand-back: still Paused, then reconciled with its status not yet current,
// then with a machine it does not count as up to date, then settled.
func TestUnsettledUntilKCPAgrees(t *testing.T) {
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp", Generation: 3}}
	kcp.Spec.Version, kcp.Spec.Replicas = "v1.36.3", ptr.To(int32(3))
	machines := collections.New()
	for _, name := range []string{"m1", "m2", "m3"} {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name}}
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineUpToDateReason})
		machines.Insert(m)
	}
	cp := &kcpstate.ControlPlane{KCP: kcp, Machines: machines}
	says := func(want ...string) {
		t.Helper()
		got := strings.Join(Unsettled(cp), "; ")
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("unsettled: %q; want it to say %q", got, w)
			}
		}
		if len(want) == 0 && got != "" {
			t.Errorf("unsettled: %q; want settled", got)
		}
	}

	conditions.Set(kcp, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionTrue, Reason: clusterv1.PausedReason})
	says("still reports Paused")

	conditions.Set(kcp, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionFalse, Reason: clusterv1.NotPausedReason})
	kcp.Status.ObservedGeneration = 2
	kcp.Status.Versions = []clusterv1.StatusVersion{{Version: "v1.35.2", Replicas: 1}, {Version: "v1.36.3", Replicas: 2}}
	says("generation 3", "[1 at v1.35.2, 2 at v1.36.3], want all at v1.36.3")

	kcp.Status.ObservedGeneration = 3
	kcp.Status.Versions = []clusterv1.StatusVersion{{Version: "v1.36.3", Replicas: 3}}
	conditions.Set(machines["m2"], metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionFalse, Reason: clusterv1.MachineNotUpToDateReason})
	says("machine m2 as up to date: UpToDate=False")

	conditions.Set(machines["m2"], metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineUpToDateReason})
	delete(machines, "m3")
	says("2 control-plane machines, KCP wants 3")

	kcp.Spec.Replicas = ptr.To(int32(2))
	says()

	// KCP v1.13 writes no status.versions, only its oldest machine's
	// version in status.version.
	kcp.Status.Versions, kcp.Status.Version = nil, "v1.35.2"
	says("oldest machine at v1.35.2, want all at v1.36.3")
	kcp.Status.Version = "v1.36.3"
	says()
}

// TestAwaitSettledRidesOutUnreadableReads: after the hand-back, reads that
// fail for a moment delay the answer; they do not fail a finished rollout.
func TestAwaitSettledRidesOutUnreadableReads(t *testing.T) {
	f := settledWorld()
	f.readErrs = 2
	e, ev := engineFor(f, Timeouts{Handback: 10 * time.Second})
	if err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback); err != nil {
		t.Fatalf("awaitSettled: %v", err)
	}
	if !ev.find("await-kcp", progress.Waiting, "cannot read the control plane") || !ev.find("await-kcp", progress.Done, "up to date") {
		t.Errorf("events do not show the failed reads waited out, then KCP's agreement")
	}
}

// TestAwaitSettledWaitsForKubeProxy: KCP retags kube-proxy in the reconcile
// that finds the machines done; until the workload cluster shows it, the
// rollout is not done, however settled KCP's status looks.
func TestAwaitSettledWaitsForKubeProxy(t *testing.T) {
	f := settledWorld()
	f.kubeProxyBehind, f.kubeProxyReads = "kube-proxy runs registry.k8s.io/kube-proxy:v1.35.2", 2
	e, ev := engineFor(f, Timeouts{Handback: 10 * time.Second})
	if err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback); err != nil {
		t.Fatalf("awaitSettled: %v", err)
	}
	if f.kubeProxyReads != 0 {
		t.Errorf("settled with kube-proxy still behind (%d reads left)", f.kubeProxyReads)
	}
	if !ev.find("await-kcp", progress.Waiting, "kube-proxy runs") || !ev.find("await-kcp", progress.Done, "kube-proxy and CoreDNS follow") {
		t.Errorf("events do not show the wait for kube-proxy, then the agreement")
	}
}

// TestAwaitSettledWaitsForCoreDNS: KCP moves CoreDNS to the image its spec
// names in the reconcile that finds the machines done; the rollout is done
// once the new CoreDNS pods have replaced the old.
func TestAwaitSettledWaitsForCoreDNS(t *testing.T) {
	f := settledWorld()
	f.coreDNSBehind, f.coreDNSReads = "CoreDNS rolling out: 1 old pods not yet gone", 2
	e, ev := engineFor(f, Timeouts{Handback: 10 * time.Second})
	if err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback); err != nil {
		t.Fatalf("awaitSettled: %v", err)
	}
	if f.coreDNSReads != 0 {
		t.Errorf("settled with CoreDNS still rolling out (%d reads left)", f.coreDNSReads)
	}
	if !ev.find("await-kcp", progress.Waiting, "CoreDNS rolling out") || !ev.find("await-kcp", progress.Done, "CoreDNS follow") {
		t.Errorf("events do not show the wait for CoreDNS, then the agreement")
	}
}

// TestAwaitSettledWarnsOfAddOnsThatDoNotFollow: KCP agrees the rollout is
// done, but CoreDNS never rolls out (a workload cluster whose Deployment
// controller never observes the Deployment, as on Cluster API's in-memory
// backend), and then kube-proxy is not retagged either: KCP waits for
// neither, so the run does not fail over them. After the add-ons' own bound
// (not --handback-timeout) it ends done, warning of each add-on behind, what
// it still waits for and what to check, with KCP's agreement said first.
func TestAwaitSettledWarnsOfAddOnsThatDoNotFollow(t *testing.T) {
	const addons = time.Second
	for _, tc := range []struct {
		name      string
		kubeProxy bool
		want      []string
	}{
		{name: "CoreDNS", want: []string{
			"KCP reports every machine at v1.36.3 and up to date; the rollout is done, but CoreDNS has not followed within 1s",
			"CoreDNS Deployment: generation 2 not yet observed by its controller",
			"check `kubectl -n kube-system rollout status deployment/coredns` on the workload cluster"}},
		{name: "kube-proxy and CoreDNS", kubeProxy: true, want: []string{
			"kube-proxy and CoreDNS have not followed within 1s",
			"kube-proxy runs registry.k8s.io/kube-proxy:v1.35.2",
			"`kubectl -n kube-system get daemonset kube-proxy -o wide` on the workload cluster",
			"rollout status deployment/coredns"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := settledWorld()
			f.coreDNSBehind, f.coreDNSReads = "CoreDNS Deployment: generation 2 not yet observed by its controller", -1
			if tc.kubeProxy {
				f.kubeProxyBehind, f.kubeProxyReads = "kube-proxy runs registry.k8s.io/kube-proxy:v1.35.2", -1
			}
			e, ev := engineFor(f, Timeouts{Handback: 20 * time.Second, Addons: addons})
			began := time.Now()
			if err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback); err != nil {
				t.Fatalf("awaitSettled: %v (exit %d); want the run done with a warning", err, exitcode.Of(err))
			}
			if took := time.Since(began); took > addons+time.Second {
				t.Errorf("waited %s for add-ons bounded at %s", took.Round(100*time.Millisecond), addons)
			}
			if !ev.find("await-kcp", progress.Waiting, "KCP reports every machine at v1.36.3 and up to date; waiting up to 1s for kube-proxy and CoreDNS to follow") {
				t.Errorf("no event says KCP agreed and the add-ons are awaited")
			}
			done := ev.of("await-kcp", progress.Done)
			if len(done) != 1 {
				t.Fatalf("await-kcp done events: %v; want one", done)
			}
			t.Log(done[0].Message)
			for _, w := range tc.want {
				if !strings.Contains(done[0].Message, w) {
					t.Errorf("done: %q\nwant it to say %q", done[0].Message, w)
				}
			}
			if !tc.kubeProxy && strings.Contains(done[0].Message, "kube-proxy has") {
				t.Errorf("done: %q names kube-proxy, which followed", done[0].Message)
			}
			ev.paired(t)
		})
	}
}

// TestAwaitSettledReadsLiveWhenTheWatchesStop: the watches' cache of the
// management cluster stopped before the hand-back (a watch gone silent), so
// it shows KCP Paused for good; KCP has settled meanwhile. The wait reads
// live every pollLiveEvery and ends done, not exit 4 at --handback-timeout.
func TestAwaitSettledReadsLiveWhenTheWatchesStop(t *testing.T) {
	f := settledWorld()
	stopped := f.world.clone().CP
	stopped.KCP = stopped.KCP.DeepCopy()
	conditions.Set(stopped.KCP, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionTrue, Reason: clusterv1.PausedReason})
	e, ev := engineFor(f, Timeouts{Handback: 10 * time.Second})
	e.Cache = &Cache{ControlPlane: readFunc(func(context.Context) (*kcpstate.ControlPlane, error) { return stopped, nil }), Workload: f}
	began := time.Now()
	if err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback); err != nil {
		t.Fatalf("awaitSettled: %v", err)
	}
	if took := time.Since(began); took > pollLiveEvery+2*time.Second {
		t.Errorf("waited %s for a KCP settled all along; want at most %s", took.Round(100*time.Millisecond), pollLiveEvery+2*time.Second)
	}
	if !ev.find("await-kcp", progress.Waiting, "still reports Paused") || !ev.find("await-kcp", progress.Done, "up to date") {
		t.Errorf("events do not show the stopped cache waited on, then KCP's agreement read live")
	}
}

// TestAwaitSettledExpiresOnALiveRead: with a limit shorter than the live
// period, the stale cache is all the wait reads until the limit passes; the
// read that would fail the wait is made live, and finds KCP settled.
func TestAwaitSettledExpiresOnALiveRead(t *testing.T) {
	f := settledWorld()
	stopped := f.world.clone().CP
	stopped.KCP = stopped.KCP.DeepCopy()
	conditions.Set(stopped.KCP, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionTrue, Reason: clusterv1.PausedReason})
	e, _ := engineFor(f, Timeouts{Handback: time.Second})
	e.Cache = &Cache{ControlPlane: readFunc(func(context.Context) (*kcpstate.ControlPlane, error) { return stopped, nil }), Workload: f}
	if err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback); err != nil {
		t.Fatalf("awaitSettled failed on the stale cache: %v", err)
	}
}

// TestAwaitSettledWarnsOfACoreDNSMoveKCPRefuses: KCP's reconcile fails on a
// CoreDNS move it refuses before it writes its status, so it never observes
// its generation; the rollout is done all the same, and the wait ends at
// once, saying why KCP will not settle, instead of failing after
// --handback-timeout.
func TestAwaitSettledWarnsOfACoreDNSMoveKCPRefuses(t *testing.T) {
	f := settledWorld()
	f.world.CP.KCP.Generation, f.world.CP.KCP.Status.ObservedGeneration = 4, 3
	f.coreDNSRefused = &workload.CoreDNSRefusedError{From: "coredns:v1.14.2", To: "coredns:v1.13.1", Why: "a downgrade"}
	e, ev := engineFor(f, Timeouts{Handback: time.Minute})
	began := time.Now()
	if err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback); err != nil {
		t.Fatalf("awaitSettled: %v", err)
	}
	if time.Since(began) > 10*time.Second {
		t.Errorf("waited %s for a KCP that cannot settle", time.Since(began))
	}
	if !ev.find("await-kcp", progress.Done, "KCP refuses to move CoreDNS from coredns:v1.14.2 to coredns:v1.13.1 (a downgrade)") {
		t.Errorf("the refusal is not said")
	}
	// Until KCP has reconciled since the hand-back, it has not agreed the
	// rollout is done: the refusal does not end the wait.
	f = settledWorld()
	f.world.CP.KCP.Generation, f.world.CP.KCP.Status.ObservedGeneration = 4, 3
	conditions.Set(f.world.CP.KCP, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionTrue, Reason: "Paused"})
	f.coreDNSRefused = &workload.CoreDNSRefusedError{From: "coredns:v1.14.2", To: "coredns:v1.13.1", Why: "a downgrade"}
	e, _ = engineFor(f, Timeouts{Handback: time.Second})
	if err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback); exitcode.Of(err) != exitcode.Timeout {
		t.Errorf("awaitSettled on a KCP still Paused: %v, want a timeout", err)
	}
}

// TestUnsettledKCPIsToldInItsOwnWords: a KCP whose reconcile fails after
// the hand-back never observes its generation; when the wait expires, the
// error gives what KCP reports about itself, not only the generation.
func TestUnsettledKCPIsToldInItsOwnWords(t *testing.T) {
	f := settledWorld()
	kcp := f.world.CP.KCP
	kcp.Generation, kcp.Status.ObservedGeneration = 4, 3
	conditions.Set(kcp, metav1.Condition{Type: controlplanev1.KubeadmControlPlaneAvailableCondition, Status: metav1.ConditionTrue, Reason: "Available"})
	conditions.Set(kcp, metav1.Condition{Type: controlplanev1.KubeadmControlPlaneEtcdClusterHealthyCondition, Status: metav1.ConditionFalse,
		Reason: "NotHealthy", Message: "* Machine demo-cp-x2k9:\n  * EtcdMemberHealthy: etcd member reports alarm NOSPACE"})
	e, _ := engineFor(f, Timeouts{Handback: time.Second})
	err := e.awaitSettled(t.Context(), f.world.CP.Machines.Names(), e.Timeouts.Handback)
	for _, want := range []string{"generation 4", "KCP says: EtcdClusterHealthy=False (NotHealthy): * Machine demo-cp-x2k9: * EtcdMemberHealthy: etcd member reports alarm NOSPACE"} {
		if exitcode.Of(err) != exitcode.Timeout || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want exit 4 saying %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "Available") {
		t.Errorf("%v: tells a healthy condition", err)
	}
}

// settledWorld is three machines that KCP, reconciled since the hand-back,
// reports all at the target and up to date.
func settledWorld() *scripted {
	f := newScripted(world(machineSpec{}, machineSpec{}, machineSpec{}))
	kcp := f.world.CP.KCP
	kcp.Status.Versions = []clusterv1.StatusVersion{{Version: kcp.Spec.Version, Replicas: 3}}
	for _, m := range f.world.CP.Machines {
		conditions.Set(m, metav1.Condition{Type: clusterv1.MachineUpToDateCondition, Status: metav1.ConditionTrue, Reason: clusterv1.MachineUpToDateReason})
	}
	return f
}
