package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// startAPIServer is apiServer with a Cluster demo
// whose KubeadmControlPlane demo-cp carries annotations.
func startAPIServer(t *testing.T, ctx context.Context, annotations map[string]string) (client.WithWatch, *clusterv1.Cluster, *controlplanev1.KubeadmControlPlane) {
	t.Helper()
	c := apiServer(t)
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp", Namespace: "default", Annotations: annotations}}
	kcp.Spec.Version, kcp.Spec.Replicas = "v1.35.2", ptr.To(int32(3))
	kcp.Spec.MachineTemplate.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "GenericInfrastructureMachineTemplate", Name: "demo"}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}}
	cluster.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: kcp.Name}
	for _, obj := range []client.Object{kcp, cluster} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	return c, cluster, kcp
}

// pausedByThisTool are the annotations of a KCP a run paused and left so.
var pausedByThisTool = map[string]string{clusterv1.PausedAnnotation: "true", record.Annotation: `{"operation":"upgrade","target":"v1.36.3"}`}

// reportPaused plays KCP: it sets kcp's Paused condition, as only KCP does.
func reportPaused(t *testing.T, ctx context.Context, c client.Client, kcp *controlplanev1.KubeadmControlPlane, status metav1.ConditionStatus) {
	t.Helper()
	live := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(kcp), live); err != nil {
		t.Error(err)
		return
	}
	reason := clusterv1.NotPausedReason
	if status == metav1.ConditionTrue {
		reason = clusterv1.PausedReason
	}
	conditions.Set(live, metav1.Condition{Type: clusterv1.PausedCondition, Status: status, Reason: reason})
	if err := c.Status().Update(ctx, live); err != nil {
		t.Error(err)
	}
}

// TestAwaitPausedWaitsForKCPsWord: a resumed run finds its pause annotation
// on the KCP but no Paused condition yet (the run that paused stopped before
// KCP answered); AwaitPaused returns only once KCP reports it, and names what
// it last saw when KCP never does.
func TestAwaitPausedWaitsForKCPsWord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, kcp := startAPIServer(t, ctx, pausedByThisTool)
	cp := New(c, "default", "demo")

	reportPaused(t, ctx, c, kcp, metav1.ConditionFalse)
	if _, err := cp.AwaitPaused(ctx, kcp, 300*time.Millisecond); exitcode.Of(err) != exitcode.Timeout ||
		!strings.Contains(err.Error(), "Paused=False (NotPaused)") {
		t.Fatalf("KCP never reports Paused: got %v, want exit 4 naming Paused=False", err)
	}

	// The KCP stand-in reports the pause a moment later.
	reported := make(chan struct{})
	go func() {
		time.Sleep(500 * time.Millisecond)
		reportPaused(t, ctx, c, kcp, metav1.ConditionTrue)
		close(reported)
	}()
	got, err := cp.AwaitPaused(ctx, kcp, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	<-reported // the stand-in's write must not outlive ctx
	if !conditions.IsTrue(got, clusterv1.PausedCondition) {
		t.Fatalf("AwaitPaused returned %v before KCP reported Paused", conditions.Get(got, clusterv1.PausedCondition))
	}
}

// TestTopologyCopyExpiryNamesTheFlag: when the topology controller does not
// copy the target into the KCP (a BeforeClusterUpgrade hook holds it), the
// run stops after the limit it was given and names the flag that sets it.
func TestTopologyCopyExpiryNamesTheFlag(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, cluster, kcp := startAPIServer(t, ctx, pausedByThisTool)
	cp := New(c, "default", "demo")
	err := cp.awaitTopologyCopy(ctx, cluster, kcp, "v1.36.3", nil, 500*time.Millisecond)
	if exitcode.Of(err) != exitcode.Timeout || !strings.Contains(err.Error(), "within --topology-timeout 500ms") {
		t.Fatalf("got %v, want exit 4 naming --topology-timeout 500ms", err)
	}
}
