package controlplane

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/record"
)

// TestRecordFailure: a failure goes into the record of a KubeadmControlPlane
// still paused by this tool, as one line, and survives a conflict (it is read
// and checked again); the operation finishing clears it; a KubeadmControlPlane
// handed back in between gets no record back without its pause.
func TestRecordFailure(t *testing.T) {
	ctx := context.Background()
	started := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	raw, _ := json.Marshal(record.Record{Operation: "upgrade", Target: "v1.36.3", Who: "ops", Started: started})
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp", Namespace: "default",
		Annotations: map[string]string{clusterv1.PausedAnnotation: "true", record.Annotation: string(raw)}}}
	mgmt := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(kcp).Build()
	c := New(mgmt, "default", "demo")
	read := func() *controlplanev1.KubeadmControlPlane {
		live := &controlplanev1.KubeadmControlPlane{}
		if err := mgmt.Get(ctx, client.ObjectKeyFromObject(kcp), live); err != nil {
			t.Fatal(err)
		}
		return live
	}
	stale := read()
	// Someone else writes in between: the stale read conflicts.
	touched := read()
	touched.Labels = map[string]string{"touched": "yes"}
	if err := mgmt.Update(ctx, touched); err != nil {
		t.Fatal(err)
	}
	failedAt := time.Date(2026, 1, 1, 10, 5, 0, 0, time.FixedZone("CET", 3600))
	if err := c.RecordFailure(ctx, stale, record.Failure{Reason: "machine m1:\n etcd member n1 is unhealthy", Time: failedAt, ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	rec, err := record.Of(read())
	if err != nil || rec == nil || rec.LastFailure == nil {
		t.Fatalf("record %+v (%v): want the failure in it", rec, err)
	}
	if f := rec.LastFailure; f.Reason != "machine m1: etcd member n1 is unhealthy" || !f.Time.Equal(failedAt) || f.Time.Location() != time.UTC || f.ExitCode != 3 ||
		rec.Operation != "upgrade" || rec.Target != "v1.36.3" || !rec.Started.Equal(started) {
		t.Errorf("record %+v, failure %+v", rec, f)
	}

	// The operation finishes: the failure no longer explains anything.
	if err := c.Complete(ctx, read()); err != nil {
		t.Fatal(err)
	}
	if last := record.LastOf(read()); last == nil || last.LastFailure != nil || last.Finished == nil {
		t.Errorf("last operation %+v: want finished, without the failure", last)
	}

	// Handed back: nothing is written.
	if err := c.RecordFailure(ctx, read(), record.Failure{Reason: "late", Time: failedAt, ExitCode: 4}); err != nil {
		t.Fatal(err)
	}
	if live := read(); live.Annotations[record.Annotation] != "" {
		t.Errorf("a record came back without its pause: %s", live.Annotations[record.Annotation])
	}
}

// TestRecordFailureBoundsTheReason: the reason is an annotation read on
// every reconcile: a long one is cut.
func TestRecordFailureBoundsTheReason(t *testing.T) {
	ctx := context.Background()
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp", Namespace: "default",
		Annotations: map[string]string{clusterv1.PausedAnnotation: "true", record.Annotation: `{"operation":"scale","target":"replicas=5"}`}}}
	mgmt := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(kcp).Build()
	if err := New(mgmt, "default", "demo").RecordFailure(ctx, kcp, record.Failure{Reason: strings.Repeat("x", 5000), ExitCode: 4}); err != nil {
		t.Fatal(err)
	}
	live := &controlplanev1.KubeadmControlPlane{}
	if err := mgmt.Get(ctx, client.ObjectKeyFromObject(kcp), live); err != nil {
		t.Fatal(err)
	}
	rec, _ := record.Of(live)
	if rec == nil || rec.LastFailure == nil || len(rec.LastFailure.Reason) != maxFailureReason || !strings.HasSuffix(rec.LastFailure.Reason, "...") {
		t.Errorf("record %+v", rec)
	}
}
