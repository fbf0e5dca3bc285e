package audit

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

type discard struct{ n int }

func (d *discard) Report(progress.Event)                       { d.n++ }
func (d *discard) Summary(progress.Event, []progress.StepTime) {}
func (d *discard) Stop()                                       {}

// TestTrailRecordsEachStepOnTheKCP, on a real API server (whose validation of
// events.k8s.io Events would drop a malformed one silently in a run): the end
// of each step becomes an Event on the KubeadmControlPlane, a failed one a
// Warning, with the machine related; a wait only when it fails, a re-read
// never; every event still reaches the run's own reporter.
func TestTrailRecordsEachStepOnTheKCP(t *testing.T) {
	cfg := apiservertest.Start(t)
	c, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo-control-plane", UID: "kcp-uid"}}
	trail := New(c, kcp, "ops@bastion/pid-42")
	next := &discard{}
	r := trail.Reporter(next)
	now := time.Now()
	for _, e := range []progress.Event{
		{Action: "pause", Phase: progress.Done, Message: "KCP reports Paused"},
		{Action: "create", Phase: progress.Started, Message: "create a control-plane machine"},
		{Action: "create", Machine: "demo-control-plane-abcde", Phase: progress.Done, Message: "created at v1.36.3"},
		{Action: "await-join", Machine: "demo-control-plane-abcde", Phase: progress.Waiting, Message: "no node yet"},
		{Action: "await-join", Machine: "demo-control-plane-abcde", Phase: progress.Done, Message: "healthy"},
		{Action: "soak", Phase: progress.Done, Message: "soaked 5s"},
		{Action: "gate", Machine: "demo-control-plane-abcde", Phase: progress.Done, Message: "passed 1 of 1 in a row"},
		{Action: "await-deletion", Machine: "demo-control-plane-old", Phase: progress.Failed, Message: "not gone within 10m0s"},
		{Action: "read", Phase: progress.Done, Message: "read again"},
		{Action: "move-leader", Machine: "demo-control-plane-old", Phase: progress.Failed, Message: "to x: timed out; trying the next candidate",
			Hop: progress.Hop{Index: 1, Of: 2, Version: "v1.35.2"}},
		{Action: "refuse", Machine: "demo-control-plane-old", Phase: progress.Failed, Message: "etcd member x is not healthy"},
	} {
		now = now.Add(time.Millisecond)
		e.Time = now
		r.Report(e)
	}
	trail.Close()
	if next.n != 11 {
		t.Fatalf("the run's reporter got %d of 11 events", next.n)
	}

	var list eventsv1.EventList
	if err := c.List(context.Background(), &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range list.Items {
		related := ""
		if ev.Related != nil {
			related = ev.Related.Kind + "/" + ev.Related.Name
		}
		if ev.Regarding.Kind != "KubeadmControlPlane" || ev.Regarding.Name != kcp.Name || ev.Regarding.UID != kcp.UID ||
			ev.ReportingController != "cp-rollout" || ev.ReportingInstance != "ops@bastion/pid-42" {
			t.Errorf("event %s: regarding %v, reported by %s/%s", ev.Name, ev.Regarding, ev.ReportingController, ev.ReportingInstance)
		}
		got = append(got, strings.Join([]string{ev.Type, ev.Reason, ev.Action, related, ev.Note}, " | "))
	}
	slices.Sort(got)
	want := []string{
		corev1.EventTypeNormal + " | Create | create | Machine/demo-control-plane-abcde | created at v1.36.3",
		corev1.EventTypeNormal + " | Pause | pause |  | KCP reports Paused",
		corev1.EventTypeWarning + " | MoveLeaderFailed | move-leader | Machine/demo-control-plane-old | hop 1/2 v1.35.2: to x: timed out; trying the next candidate",
		corev1.EventTypeWarning + " | Refused | refuse | Machine/demo-control-plane-old | etcd member x is not healthy",
		corev1.EventTypeWarning + " | AwaitDeletionFailed | await-deletion | Machine/demo-control-plane-old | not gone within 10m0s",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("events:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
}

// TestWarnOnTheClusterAndTheKCP, on a real API server: a warning about a
// pause is one Warning Event on each object named, regarding it by its own
// kind and UID, so `kubectl describe cluster` shows it as well as `kubectl
// describe kcp`; a note longer than an Event allows is cut, not dropped.
func TestWarnOnTheClusterAndTheKCP(t *testing.T) {
	cfg := apiservertest.Start(t)
	c, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo", UID: "cluster-uid"}}
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo-control-plane", UID: "kcp-uid"}}
	trail := New(c, kcp, "ops@bastion/pid-42")
	trail.Warn("stay-paused", "PausedAfterFailure", "upgrade failed (exit 3): "+strings.Repeat("x", 2000), cluster, kcp)
	trail.Close()

	var list eventsv1.EventList
	if err := c.List(context.Background(), &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range list.Items {
		if ev.Type != corev1.EventTypeWarning || ev.Reason != "PausedAfterFailure" || ev.Action != "stay-paused" ||
			ev.ReportingController != "cp-rollout" || ev.ReportingInstance != "ops@bastion/pid-42" ||
			!strings.HasPrefix(ev.Note, "upgrade failed (exit 3): x") || len(ev.Note) > 1024 {
			t.Errorf("event %s: %s %s %s by %s/%s, note of %d bytes", ev.Name, ev.Type, ev.Reason, ev.Action, ev.ReportingController, ev.ReportingInstance, len(ev.Note))
		}
		got = append(got, ev.Regarding.APIVersion+" "+ev.Regarding.Kind+" "+ev.Regarding.Name+" "+string(ev.Regarding.UID))
	}
	slices.Sort(got)
	want := []string{
		clusterv1.GroupVersion.String() + " Cluster demo cluster-uid",
		controlplanev1.GroupVersion.String() + " KubeadmControlPlane demo-control-plane kcp-uid",
	}
	if !slices.Equal(got, want) {
		t.Errorf("events regarding\n %s\nwant\n %s", strings.Join(got, "\n "), strings.Join(want, "\n "))
	}
}

// TestEventNamesDoNotCollide, on a real API server, which refuses a second
// Event of the same name (and the trail drops it): a Cluster and its
// KubeadmControlPlane may share a name, and both get the warning; two steps
// reported with the same time both get their Event; an object whose name is
// too long to carry the time still gets one, named as client-go names it
// then.
func TestEventNamesDoNotCollide(t *testing.T) {
	cfg := apiservertest.Start(t)
	c, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 250)
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo", UID: "cluster-uid"}}
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "demo", UID: "kcp-uid"}}
	longKCP := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: long, UID: "long-uid"}}

	trail := New(c, kcp, "ops@bastion/pid-42")
	trail.Warn("stay-paused", "PausedAfterFailure", "upgrade failed (exit 3)", cluster, kcp, longKCP)
	r := trail.Reporter(&discard{})
	at := time.Now()
	r.Report(progress.Event{Time: at, Action: "create", Machine: "demo-abcde", Phase: progress.Done, Message: "created"})
	r.Report(progress.Event{Time: at, Action: "refuse", Machine: "demo-abcde", Phase: progress.Failed, Message: "etcd member x is not healthy"})
	trail.Close()

	var list eventsv1.EventList
	if err := c.List(context.Background(), &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range list.Items {
		got = append(got, ev.Regarding.Kind+"/"+ev.Regarding.Name+" "+ev.Reason)
		if ev.Regarding.Name == "demo" && !strings.HasPrefix(ev.Name, "demo.") {
			t.Errorf("event %s about %s: want client-go's name, <object>.<time>", ev.Name, ev.Regarding.Name)
		}
	}
	slices.Sort(got)
	want := []string{
		"Cluster/demo PausedAfterFailure",
		"KubeadmControlPlane/" + long + " PausedAfterFailure",
		"KubeadmControlPlane/demo Create",
		"KubeadmControlPlane/demo PausedAfterFailure",
		"KubeadmControlPlane/demo Refused",
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("events:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(want, "\n     "))
	}
}

// TestEventNameIsLaterEachTime: names taken at one instant, from one trail or
// several, all differ, and keep client-go's form.
func TestEventNameIsLaterEachTime(t *testing.T) {
	at := time.Now()
	seen := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 250 {
				name := eventName("demo", at)
				mu.Lock()
				seen[name] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != 1000 {
		t.Errorf("%d distinct names for 1000 Events", len(seen))
	}
	for name := range seen {
		if !strings.HasPrefix(name, "demo.") {
			t.Fatalf("name %s is not <object>.<time>", name)
		}
	}
}
