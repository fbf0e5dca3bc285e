package fleet

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// The tests of runs, records and stages share one API server: starting one
// costs seconds. It is stopped once every test has run.
var shared struct {
	once     sync.Once
	cfg      *rest.Config
	cleanups []func()
}

// untilTheEnd is the test that starts the shared API server, whose cleanups
// wait for TestMain.
type untilTheEnd struct{ testing.TB }

func (untilTheEnd) Cleanup(f func()) { shared.cleanups = append(shared.cleanups, f) }

func TestMain(m *testing.M) {
	// The API server's warnings about the tests' own objects go to
	// controller-runtime's log, which would otherwise complain, with a
	// stack, that it was never set.
	ctrllog.SetLogger(logr.Discard())
	code := m.Run()
	for i := len(shared.cleanups) - 1; i >= 0; i-- {
		shared.cleanups[i]()
	}
	os.Exit(code)
}

// apiServer is the shared API server, with Cluster API's CRDs.
func apiServer(t *testing.T) *rest.Config {
	t.Helper()
	shared.once.Do(func() { shared.cfg = apiservertest.StartCAPI(untilTheEnd{t}) })
	if shared.cfg == nil {
		t.Fatal("the shared API server did not start")
	}
	return shared.cfg
}

// recordsIn is a clientset of the shared API server and the runs recorded
// in a new namespace named from prefix (new for each test, -count too).
func recordsIn(t *testing.T, prefix string) (kubernetes.Interface, *Records) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(apiServer(t))
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if ns, err = cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cs, NewRecords(cs, ns.Name)
}

// newRun is a run's record with stages and clusters, every one pending.
func newRun(name string, stages int, members []Member) RunRecord {
	run := RunRecord{Name: name, Request: "upgrade to v1.36.3", Parallel: 2, StartedBy: "alice", Started: time.Now().UTC(), State: RunRunning}
	for i := range stages {
		run.Stages = append(run.Stages, StageRecord{Selector: fmt.Sprintf("ring=%d", i), State: StagePending})
	}
	for _, m := range members {
		run.Clusters = append(run.Clusters, ClusterRecord{Cluster: m.Cluster, Stage: m.Stage, State: Pending})
	}
	return run
}

func TestRecordsKeepRunsInConfigMaps(t *testing.T) {
	ctx := context.Background()
	cs, records := recordsIn(t, "records")

	t.Run("a run of 250 clusters is a head and 3 shards, and loads as created", func(t *testing.T) {
		var members []Member
		for i := range 250 {
			// Given out of order: the record keeps stage, then name order.
			members = append(members, Member{Cluster: Cluster{Namespace: fmt.Sprintf("team-%d", i%3), Name: fmt.Sprintf("c-%03d", 249-i)}, Stage: 1 + i%2})
		}
		run := newRun("big", 2, members)
		run.Command, run.Scope, run.MaxFail, run.StageSoak = "kubectl cp-rollout upgrade -A", "in any namespace", 3, "10m0s"
		if _, err := records.Create(ctx, run); err != nil {
			t.Fatal(err)
		}
		cms, err := cs.CoreV1().ConfigMaps(records.namespace).List(ctx, metav1.ListOptions{LabelSelector: "cp-rollout.io/fleet-run=big"})
		if err != nil {
			t.Fatal(err)
		}
		parts := map[string]string{}
		for _, cm := range cms.Items {
			parts[cm.Name] = cm.Labels["cp-rollout.io/fleet-part"]
			if cm.Labels["cp-rollout.io/fleet-part"] == "clusters" && (len(cm.OwnerReferences) != 1 || cm.OwnerReferences[0].Name != "cp-rollout-fleet-big") {
				t.Errorf("shard %s is owned by %+v, want the run's head", cm.Name, cm.OwnerReferences)
			}
		}
		want := map[string]string{"cp-rollout-fleet-big": "run", "cp-rollout-fleet-big-0": "clusters", "cp-rollout-fleet-big-1": "clusters", "cp-rollout-fleet-big-2": "clusters"}
		if fmt.Sprint(parts) != fmt.Sprint(want) {
			t.Errorf("ConfigMaps (name: part) %v, want %v", parts, want)
		}
		loaded, err := records.Load(ctx, "big")
		if err != nil {
			t.Fatal(err)
		}
		if loaded.Name != "big" || loaded.Namespace != records.namespace || loaded.Request != run.Request || loaded.Command != run.Command || loaded.Scope != run.Scope ||
			loaded.MaxFail != 3 || loaded.StageSoak != "10m0s" || len(loaded.Stages) != 2 || loaded.State != RunRunning || !loaded.Started.Equal(run.Started) {
			t.Errorf("loaded %+v\nwant what was created: %+v", withoutClusters(*loaded), withoutClusters(run))
		}
		if len(loaded.Clusters) != 250 {
			t.Fatalf("loaded %d clusters, want 250", len(loaded.Clusters))
		}
		for i, c := range loaded.Clusters {
			if i > 0 && byStageAndName(loaded.Clusters[i-1], c) >= 0 {
				t.Fatalf("clusters %d and %d are out of stage and name order: %v, %v", i-1, i, loaded.Clusters[i-1], c)
			}
			if c.State != Pending || c.Attempts != 0 {
				t.Errorf("%s: %+v, want pending", c.Cluster, c)
			}
		}
		if n := loaded.Count(); n[Pending] != 250 {
			t.Errorf("Count() = %v, want 250 pending", n)
		}
	})

	t.Run("a second run of the same name is refused", func(t *testing.T) {
		run := newRun("twice", 1, []Member{{Cluster: Cluster{"default", "a"}, Stage: 1}})
		if _, err := records.Create(ctx, run); err != nil {
			t.Fatal(err)
		}
		run.Request = "upgrade to v1.37.0"
		_, err := records.Create(ctx, run)
		if code := exitcode.Of(err); code != exitcode.Usage || !strings.Contains(fmt.Sprint(err), "--resume twice") {
			t.Errorf("the second Create: exit %d, %v; want 2, pointing at --resume twice", code, err)
		}
		if loaded, err := records.Load(ctx, "twice"); err != nil || loaded.Request != "upgrade to v1.36.3" {
			t.Errorf("after the refused Create, the run is %+v (%v), want the first", loaded, err)
		}
		if _, err := records.Load(ctx, "never"); exitcode.Of(err) != exitcode.Usage {
			t.Errorf("Load of a run never recorded: %v (exit %d), want exit 2", err, exitcode.Of(err))
		}
	})

	t.Run("clusters written at once each keep their own state", func(t *testing.T) {
		var members []Member
		for i := range 120 { // two shards
			members = append(members, Member{Cluster: Cluster{Namespace: "default", Name: fmt.Sprintf("c-%03d", i)}, Stage: 1})
		}
		rec, err := records.Create(ctx, newRun("concurrent", 1, members))
		if err != nil {
			t.Fatal(err)
		}
		// 8 writers, each its share of the clusters of both shards, all at
		// once: each write merges into a shard the others write too.
		var wg sync.WaitGroup
		errs := make(chan error, len(members))
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < len(members); i += 8 {
					errs <- rec.UpdateCluster(ctx, members[i].Cluster, func(r *ClusterRecord) {
						r.State, r.Attempts, r.Machines, r.Message = Done, 1, fmt.Sprintf("%d replaced", i%5), fmt.Sprintf("by writer %d", w)
					})
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		loaded, err := records.Load(ctx, "concurrent")
		if err != nil {
			t.Fatal(err)
		}
		if len(loaded.Clusters) != len(members) {
			t.Fatalf("loaded %d clusters, want %d", len(loaded.Clusters), len(members))
		}
		for i, c := range loaded.Clusters {
			want := ClusterRecord{Cluster: members[i].Cluster, Stage: 1, State: Done, Attempts: 1, Machines: fmt.Sprintf("%d replaced", i%5), Message: fmt.Sprintf("by writer %d", i%8)}
			if fmt.Sprint(c) != fmt.Sprint(want) {
				t.Errorf("loaded %+v\nwant   %+v", c, want)
			}
		}
		if got := rec.Cluster(members[17].Cluster); got.State != Done || got.Message != "by writer 1" {
			t.Errorf("Recorder.Cluster(c-017) = %+v, want done by writer 1", got)
		}
		if err := rec.UpdateCluster(ctx, Cluster{"default", "stranger"}, func(*ClusterRecord) {}); err == nil {
			t.Errorf("UpdateCluster of a cluster not in the run: no error")
		}
	})

	t.Run("List gives the runs newest first", func(t *testing.T) {
		_, records := recordsIn(t, "records-list")
		base := time.Date(2026, 12, 7, 7, 0, 0, 0, time.UTC)
		for i, name := range []string{"middle", "oldest", "newest"} {
			run := newRun(name, 1, []Member{{Cluster: Cluster{"default", "a"}, Stage: 1}})
			run.Started = base.Add(time.Duration([]int{1, 0, 2}[i]) * time.Hour)
			if _, err := records.Create(ctx, run); err != nil {
				t.Fatal(err)
			}
		}
		runs, err := records.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range runs {
			names = append(names, r.Name)
			if len(r.Clusters) != 0 {
				t.Errorf("List gave %s's clusters", r.Name)
			}
		}
		if strings.Join(names, " ") != "newest middle oldest" {
			t.Errorf("List: %v, want newest middle oldest", names)
		}
	})

	t.Run("Abort marks the run, and its recorder reads it", func(t *testing.T) {
		rec, err := records.Create(ctx, newRun("to-abort", 1, []Member{{Cluster: Cluster{"default", "a"}, Stage: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		if who, err := rec.AbortRequested(ctx); err != nil || who != "" {
			t.Fatalf("AbortRequested before any abort: %q, %v; want none", who, err)
		}
		if err := records.Abort(ctx, "to-abort", "bob@ops"); err != nil {
			t.Fatal(err)
		}
		who, err := rec.AbortRequested(ctx)
		if err != nil || !strings.HasPrefix(who, "by bob@ops at ") {
			t.Errorf("AbortRequested after fleet abort: %q, %v; want by bob@ops at …", who, err)
		}
		if loaded, err := records.Load(ctx, "to-abort"); err != nil || loaded.AbortRequested != who {
			t.Errorf("Load after fleet abort: AbortRequested %q (%v), want %q", loaded.AbortRequested, err, who)
		}
		// The run's own writes keep the mark.
		if err := rec.UpdateRun(ctx, func(r *RunRecord) { r.Message = "still going" }); err != nil {
			t.Fatal(err)
		}
		if again, err := rec.AbortRequested(ctx); err != nil || again != who {
			t.Errorf("AbortRequested after the run wrote its head: %q, %v; want %q", again, err, who)
		}
		if err := records.Abort(ctx, "never", "bob@ops"); exitcode.Of(err) != exitcode.Usage {
			t.Errorf("Abort of a run never recorded: %v (exit %d), want exit 2", err, exitcode.Of(err))
		}
		// A run that ended has nothing to abort: a --resume would lift the mark.
		if err := rec.UpdateRun(ctx, func(r *RunRecord) { r.State = RunDone }); err != nil {
			t.Fatal(err)
		}
		if err := records.Abort(ctx, "to-abort", "bob@ops"); exitcode.Of(err) != exitcode.Usage || !strings.Contains(fmt.Sprint(err), "is not running (it is done)") {
			t.Errorf("Abort of a run that is done: %v (exit %d), want exit 2 saying it is not running", err, exitcode.Of(err))
		}
	})

	t.Run("a run not running is taken over at once", func(t *testing.T) {
		rec, err := records.Create(ctx, newRun("stopped", 1, []Member{{Cluster: Cluster{"default", "a"}, Stage: 1}, {Cluster: Cluster{"default", "b"}, Stage: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		if err := rec.UpdateCluster(ctx, Cluster{"default", "a"}, func(c *ClusterRecord) { c.State, c.Attempts = Done, 1 }); err != nil {
			t.Fatal(err)
		}
		if err := rec.UpdateRun(ctx, func(r *RunRecord) { r.State = RunStopped }); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		again, err := records.TakeOver(ctx, "stopped", func(msg string) { t.Errorf("TakeOver of a stopped run waited: %s", msg) })
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(began); waited > 5*time.Second {
			t.Errorf("TakeOver took %s", waited)
		}
		if got := again.Cluster(Cluster{"default", "a"}); got.State != Done || got.Attempts != 1 {
			t.Errorf("the taken-over run has a as %+v, want done", got)
		}
		// The new recorder writes where the first did.
		if err := again.UpdateCluster(ctx, Cluster{"default", "b"}, func(c *ClusterRecord) { c.State = Failed }); err != nil {
			t.Fatal(err)
		}
		loaded, err := records.Load(ctx, "stopped")
		if err != nil {
			t.Fatal(err)
		}
		if n := loaded.Count(); n[Done] != 1 || n[Failed] != 1 || len(loaded.Clusters) != 2 {
			t.Errorf("after the take-over, the record counts %v, want a done and b failed", n)
		}
		if _, err := records.TakeOver(ctx, "never", func(string) {}); exitcode.Of(err) != exitcode.Usage {
			t.Errorf("TakeOver of a run never recorded: %v (exit %d), want exit 2", err, exitcode.Of(err))
		}
	})
}

// A run recorded as running is taken over only once its record goes
// unrenewed for holdFor (15 s: both cases wait it at once, beside the other
// tests).
func TestRecordsTakeOverARunningRunOnlyOnceItStopsRenewing(t *testing.T) {
	if testing.Short() {
		t.Skipf("waits %s", holdFor)
	}
	t.Parallel()
	ctx := context.Background()
	_, records := recordsIn(t, "records-takeover")
	one := []Member{{Cluster: Cluster{"default", "a"}, Stage: 1}}

	t.Run("renewed: refused", func(t *testing.T) {
		t.Parallel()
		rec, err := records.Create(ctx, newRun("renewed", 1, one))
		if err != nil {
			t.Fatal(err)
		}
		keep, stop := context.WithCancel(ctx)
		kept := make(chan struct{})
		go func() { defer close(kept); rec.Keep(keep, "laptop/pid-1") }()
		defer func() { stop(); <-kept }()
		var said []string
		_, err = records.TakeOver(ctx, "renewed", func(msg string) { said = append(said, msg) })
		if code := exitcode.Of(err); code != exitcode.Locked || !strings.Contains(fmt.Sprint(err), "laptop/pid-1") {
			t.Errorf("TakeOver of a run renewed: exit %d, %v; want %d naming laptop/pid-1", code, err, exitcode.Locked)
		}
		if len(said) != 1 || !strings.Contains(said[0], "taking it over if its record is not renewed within 15s") {
			t.Errorf("TakeOver said %q, want that it waits", said)
		}
	})

	t.Run("not renewed: taken over after holdFor", func(t *testing.T) {
		t.Parallel()
		rec, err := records.Create(ctx, newRun("gone", 1, one))
		if err != nil {
			t.Fatal(err)
		}
		// Its process renewed it once, then went away.
		if err := rec.UpdateRun(ctx, func(r *RunRecord) { r.Holder, r.Renewed = "laptop/pid-2", time.Now().UTC() }); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		again, err := records.TakeOver(ctx, "gone", func(string) {})
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(began); waited < holdFor {
			t.Errorf("taken over after %s, want %s or more", waited, holdFor)
		}
		if again.Run().Holder != "laptop/pid-2" || len(again.Run().Clusters) != 1 {
			t.Errorf("the taken-over run: %+v", again.Run())
		}
	})
}

func withoutClusters(r RunRecord) RunRecord {
	r.Clusters = nil
	return r
}
