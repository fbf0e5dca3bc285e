package controlplane

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// TestPauseWaitsOutAStalePausedCondition plays the KCP controller right after
// a previous hand-back: the pause annotation is gone but its Paused=True is
// still reported until KCP reconciles. Pause must not take that True for an
// answer to its own pause.
func TestPauseWaitsOutAStalePausedCondition(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, kcp := startAPIServer(t, ctx, nil)

	reportPaused(t, ctx, c, kcp, metav1.ConditionTrue) // left from the previous run's pause

	// The KCP stand-in reconciles a moment later: it first reports the
	// unpaused state, then reports Paused once it sees the annotation.
	var unpausedSeen atomic.Bool
	standIn := make(chan struct{})
	go func() {
		defer close(standIn)
		time.Sleep(500 * time.Millisecond)
		reportPaused(t, ctx, c, kcp, metav1.ConditionFalse)
		unpausedSeen.Store(true)
		for ctx.Err() == nil {
			live := &controlplanev1.KubeadmControlPlane{}
			if c.Get(ctx, client.ObjectKeyFromObject(kcp), live) == nil {
				if _, ok := live.Annotations[clusterv1.PausedAnnotation]; ok {
					reportPaused(t, ctx, c, kcp, metav1.ConditionTrue)
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-standIn }()

	cp := New(c, "default", "demo")
	any := func(*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane) error { return nil }
	readCluster, readKCP, err := cp.ReadKCP(ctx) // as the run reads them before it pauses
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Pause(ctx, readCluster, readKCP, record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "test"}, 30*time.Second, any); err != nil {
		t.Fatal(err)
	}
	// Pause may see Paused=True before the stand-in's write has returned to it;
	// ctx must outlive that write.
	<-standIn
	if !unpausedSeen.Load() {
		t.Fatal("Pause returned on the Paused=True left from before, without KCP having reconciled since")
	}
}
