package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// A fleet run is recorded in the management cluster, in ConfigMaps of one
// namespace, so that it outlives the terminal that started it: `fleet
// status` reads it from anywhere, `--resume` continues it, `fleet abort`
// marks it. The run itself (its request, stages, state) is one ConfigMap;
// its clusters' states are spread over shards of up to shardSize clusters, so that
// each cluster's write rewrites a few kilobytes, not the whole fleet's state
// (at 2,000 clusters that would be half a megabyte per write, against a
// ConfigMap's limit of one). A ConfigMap rather than a custom resource: the
// tool installs nothing in the management cluster.
const (
	runLabel  = "cp-rollout.io/fleet-run"  // the run's name, on every part
	partLabel = "cp-rollout.io/fleet-part" // "run" on the head, "clusters" on the shards
	// abortAnnotation on the head asks the run to start no new cluster.
	abortAnnotation = "cp-rollout.io/abort"
	shardSize       = 100
	runKey          = "run"
)

// The states of a run.
const (
	RunRunning = "running"
	RunDone    = "done"
	RunFailed  = "failed"
	RunStopped = "stopped"
	RunAborted = "aborted"
)

// The states of a cluster in a run, as its record and the closing table
// give them.
const (
	Pending       = "pending"
	Running       = "running"
	Done          = "done"
	Failed        = "failed"
	Stopped       = "stopped"
	NotStarted    = "not started"
	OutsideWindow = "outside window"
)

// RunRecord is a recorded fleet run. Its JSON form is what `fleet status -o
// json` prints: fields are only ever added.
type RunRecord struct {
	Name      string `json:"run"`
	Namespace string `json:"namespace"`
	// Request is what each cluster gets ("upgrade to v1.36.3"): --resume
	// refuses another.
	Request string `json:"request"`
	// Command is the command line that started the run, for people.
	Command   string        `json:"command"`
	Scope     string        `json:"scope"`
	Parallel  int           `json:"parallel"`
	MaxFail   int           `json:"maxFailures"`
	StageSoak string        `json:"stageSoak,omitempty"`
	Stages    []StageRecord `json:"stages"`
	StartedBy string        `json:"startedBy"`
	Started   time.Time     `json:"started"`
	State     string        `json:"state"`
	Message   string        `json:"message,omitempty"`
	// Holder is the process running it now (host and pid), renewed in
	// Renewed while it runs.
	Holder  string    `json:"holder,omitempty"`
	Renewed time.Time `json:"renewed,omitzero"`
	// AbortRequested says who asked, by `fleet abort`, that the run start no
	// new cluster, and when.
	AbortRequested string          `json:"abortRequested,omitempty"`
	Clusters       []ClusterRecord `json:"clusters,omitempty"`
}

// StageRecord is one stage's selector and where it stands.
type StageRecord struct {
	Selector string `json:"selector"`
	State    string `json:"state"` // pending, running, soaking, done, failed
	Message  string `json:"message,omitempty"`
}

// ClusterRecord is one cluster's state in a run.
type ClusterRecord struct {
	Cluster
	Stage    int        `json:"stage"`
	State    string     `json:"state"`
	ExitCode *int       `json:"exitCode,omitempty"`
	Machines string     `json:"machines,omitempty"`
	Attempts int        `json:"attempts"`
	Started  *time.Time `json:"started,omitempty"`
	Ended    *time.Time `json:"ended,omitempty"`
	Message  string     `json:"message,omitempty"`
	// shard is the ConfigMap that holds it: Create deals the clusters out,
	// Load says where it found each.
	shard int
}

// Count tallies the clusters by state, for summaries.
func (r RunRecord) Count() map[string]int {
	n := map[string]int{}
	for _, c := range r.Clusters {
		n[c.State]++
	}
	return n
}

// ValidRunName checks a run's name: it becomes part of ConfigMap names.
func ValidRunName(name string) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("run name %q: %s", name, strings.Join(errs, "; "))
	}
	if len(name) > 40 {
		return fmt.Errorf("run name %q: at most 40 characters", name)
	}
	return nil
}

func headName(run string) string { return "cp-rollout-fleet-" + run }

func shardName(run string, i int) string { return headName(run) + "-" + strconv.Itoa(i) }

// clusterKey is a cluster's key in its shard: a namespace has no dot, so
// the first one ends it.
func clusterKey(c Cluster) string { return c.Namespace + "." + c.Name }

// Records reads and writes the fleet runs recorded in one namespace.
type Records struct {
	c         kubernetes.Interface
	namespace string
	// Writes and Bytes count what this process wrote, for the benchmark.
	Writes, Bytes atomic.Int64
}

// NewRecords is the fleet runs recorded in namespace.
func NewRecords(c kubernetes.Interface, namespace string) *Records {
	return &Records{c: c, namespace: namespace}
}

// Recorder writes one run's record as it goes. Its methods are safe for
// the concurrent clusters of the run.
type Recorder struct {
	r *Records
	// runWrites orders the writes of the run's own state: each is the whole
	// state, so one computed earlier must not land after a later one.
	runWrites sync.Mutex
	mu        sync.Mutex
	run       RunRecord // without Clusters
	states    map[Cluster]*ClusterRecord
}

// Create records a new run, refusing a name already taken.
func (r *Records) Create(ctx context.Context, run RunRecord) (*Recorder, error) {
	rec := &Recorder{r: r, states: map[Cluster]*ClusterRecord{}}
	run.Namespace = r.namespace
	run.Clusters = slices.Clone(run.Clusters) // the Recorder keeps pointers into it
	run.Stages = slices.Clone(run.Stages)
	slices.SortFunc(run.Clusters, byStageAndName)
	head := rec.setRun(run)
	head.Labels = map[string]string{runLabel: run.Name, partLabel: "run"}
	created, err := r.c.CoreV1().ConfigMaps(r.namespace).Create(ctx, head, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil, exitcode.Usagef("fleet run %s already exists in namespace %s: continue it with --resume %s, or name a new one", run.Name, r.namespace, run.Name)
	case err != nil:
		return nil, r.refused(fmt.Errorf("recording fleet run %s in namespace %s: %w", run.Name, r.namespace, err))
	}
	r.count(head)
	// Shards belong to the head: deleting the run deletes them.
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: created.Name, UID: created.UID}
	// Dealt out in turn: the clusters a run has in flight at once, next to
	// one another in this order, write to different ConfigMaps rather than
	// contend for one (measured in docs/fleet.md).
	n := (len(run.Clusters) + shardSize - 1) / shardSize
	shards := make([]map[string]string, n)
	for i := range run.Clusters {
		c := &run.Clusters[i]
		c.shard = i % n
		rec.states[c.Cluster] = c
		if shards[c.shard] == nil {
			shards[c.shard] = map[string]string{}
		}
		shards[c.shard][clusterKey(c.Cluster)] = mustJSON(c)
	}
	for i := range n {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: shardName(run.Name, i), Namespace: r.namespace,
			Labels: map[string]string{runLabel: run.Name, partLabel: "clusters"}, OwnerReferences: []metav1.OwnerReference{owner}},
			Data: shards[i]}
		if _, err := r.c.CoreV1().ConfigMaps(r.namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("recording fleet run %s: %w", run.Name, err)
		}
		r.count(cm)
	}
	return rec, nil
}

// Load reads a run with every cluster's state, in stage and name order.
func (r *Records) Load(ctx context.Context, name string) (*RunRecord, error) {
	list, err := r.c.CoreV1().ConfigMaps(r.namespace).List(ctx, metav1.ListOptions{LabelSelector: runLabel + "=" + name})
	if err != nil {
		return nil, r.refused(fmt.Errorf("reading fleet run %s in namespace %s: %w", name, r.namespace, err))
	}
	var run *RunRecord
	var clusters []ClusterRecord
	for _, cm := range list.Items {
		if cm.Labels[partLabel] == "run" {
			if run, err = decodeHead(&cm); err != nil {
				return nil, err
			}
			continue
		}
		shard, err := strconv.Atoi(strings.TrimPrefix(cm.Name, headName(name)+"-"))
		if err != nil {
			return nil, fmt.Errorf("fleet run %s: ConfigMap %s is labelled as its but is not one of its shards", name, cm.Name)
		}
		for key, value := range cm.Data {
			var c ClusterRecord
			if err := json.Unmarshal([]byte(value), &c); err != nil {
				return nil, fmt.Errorf("fleet run %s, ConfigMap %s, %s: %w", name, cm.Name, key, err)
			}
			c.shard = shard
			clusters = append(clusters, c)
		}
	}
	if run == nil {
		return nil, exitcode.Usagef("no fleet run %s in namespace %s (list them with kubectl cp-rollout fleet status --run-namespace %s)", name, r.namespace, r.namespace)
	}
	slices.SortFunc(clusters, byStageAndName)
	run.Clusters = clusters
	return run, nil
}

// List reads every run's head, newest first, without their clusters.
func (r *Records) List(ctx context.Context) ([]RunRecord, error) {
	list, err := r.c.CoreV1().ConfigMaps(r.namespace).List(ctx, metav1.ListOptions{LabelSelector: partLabel + "=run"})
	if err != nil {
		return nil, r.refused(fmt.Errorf("listing fleet runs in namespace %s: %w", r.namespace, err))
	}
	var runs []RunRecord
	for _, cm := range list.Items {
		run, err := decodeHead(&cm)
		if err != nil {
			return nil, err
		}
		runs = append(runs, *run)
	}
	slices.SortFunc(runs, func(a, b RunRecord) int { return b.Started.Compare(a.Started) })
	return runs, nil
}

// Abort asks run to start no new cluster. Those in flight finish; the run
// sees it before it starts each cluster.
func (r *Records) Abort(ctx context.Context, name, who string) error {
	// The run's own ConfigMap says whether it runs: its clusters' shards
	// are not read.
	head, err := r.c.CoreV1().ConfigMaps(r.namespace).Get(ctx, headName(name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return exitcode.Usagef("no fleet run %s in namespace %s (list them with kubectl cp-rollout fleet status --run-namespace %s)", name, r.namespace, r.namespace)
	}
	if err != nil {
		return r.refused(fmt.Errorf("reading fleet run %s in namespace %s: %w", name, r.namespace, err))
	}
	run, err := decodeHead(head)
	if err != nil {
		return err
	}
	if run.State != RunRunning {
		// A --resume would lift the mark: it would stop nothing.
		return exitcode.Usagef("fleet run %s is not running (it is %s): there is nothing to abort", name, run.State)
	}
	patch := mustJSON(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		abortAnnotation: fmt.Sprintf("by %s at %s", who, time.Now().UTC().Format(time.RFC3339))}}})
	_, err = r.c.CoreV1().ConfigMaps(r.namespace).Patch(ctx, headName(name), types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	r.Writes.Add(1)
	if err != nil {
		return r.refused(fmt.Errorf("marking fleet run %s: %w", name, err))
	}
	return nil
}

// refused marks a request the API server forbade as exit 6, saying what
// grants it: nothing was recorded, so nothing was changed.
func (r *Records) refused(err error) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	return exitcode.New(exitcode.Forbidden, fmt.Errorf("%w: fleet runs are recorded in namespace %s, which needs the Role %s there "+
		"(deploy/rbac/cp-rollout-fleet.yaml) bound to this identity; or record them elsewhere with --run-namespace", err, r.namespace, rbac.FleetRoleName))
}

func decodeHead(cm *corev1.ConfigMap) (*RunRecord, error) {
	var run RunRecord
	if err := json.Unmarshal([]byte(cm.Data[runKey]), &run); err != nil {
		return nil, fmt.Errorf("fleet run ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	run.AbortRequested = cm.Annotations[abortAnnotation]
	return &run, nil
}

// renewEvery is how often a running run renews its record, and holdFor how
// long a record must go unrenewed, as this process watches it, before
// another may take the run over. runlock's rule for the clusters' Leases:
// never judged from the clock of the machine that wrote Renewed.
const (
	renewEvery = 5 * time.Second
	holdFor    = 3 * renewEvery
)

// TakeOver loads run to continue it. A run whose record says it is running
// is taken over only once its record has not changed for holdFor: its
// process is gone (killed, a closed laptop); one that goes on renewing is
// refused, naming its holder.
func (r *Records) TakeOver(ctx context.Context, name string, waiting func(string)) (*Recorder, error) {
	run, err := r.Load(ctx, name)
	if err != nil {
		return nil, err
	}
	if run.State != RunRunning {
		return r.resume(run), r.clearAbort(ctx, run)
	}
	waiting(fmt.Sprintf("fleet run %s is recorded as running (by %s); taking it over if its record is not renewed within %s", name, run.Holder, holdFor))
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(holdFor):
	}
	again, err := r.Load(ctx, name)
	if err != nil {
		return nil, err
	}
	if !again.Renewed.Equal(run.Renewed) {
		return nil, exitcode.Lockedf("fleet run %s is running in %s (its record was renewed at %s): watch it with kubectl cp-rollout fleet status %s, or stop it with fleet abort %s",
			name, again.Holder, again.Renewed.Format(time.RFC3339), name, name)
	}
	return r.resume(again), r.clearAbort(ctx, again)
}

// clearAbort lifts a `fleet abort` of run: continuing it is asking it to
// start clusters again.
func (r *Records) clearAbort(ctx context.Context, run *RunRecord) error {
	if run.AbortRequested == "" {
		return nil
	}
	patch := mustJSON(map[string]any{"metadata": map[string]any{"annotations": map[string]any{abortAnnotation: nil}}})
	r.Writes.Add(1)
	if _, err := r.c.CoreV1().ConfigMaps(r.namespace).Patch(ctx, headName(run.Name), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return r.refused(fmt.Errorf("continuing fleet run %s, aborted %s: %w", run.Name, run.AbortRequested, err))
	}
	return nil
}

// resume is a Recorder of a loaded run: its clusters are those of the
// record, each in the shard Create wrote it to.
func (r *Records) resume(run *RunRecord) *Recorder {
	if run == nil {
		return nil
	}
	rec := &Recorder{r: r, states: map[Cluster]*ClusterRecord{}}
	for i := range run.Clusters {
		rec.states[run.Clusters[i].Cluster] = &run.Clusters[i]
	}
	rec.setRun(*run)
	return rec
}

// Keep renews the record every renewEvery until ctx ends, so that no other
// process takes the run over while this one runs it.
func (rec *Recorder) Keep(ctx context.Context, holder string) {
	tick := time.NewTicker(renewEvery)
	defer tick.Stop()
	for {
		// A failed renewal is retried at the next tick; the clusters' own
		// Leases keep each rollout to one process meanwhile.
		_ = rec.UpdateRun(ctx, func(r *RunRecord) { r.Holder, r.Renewed = holder, time.Now().UTC() })
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Run is the run's record as this process last wrote it, with its clusters.
func (rec *Recorder) Run() RunRecord {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	run := rec.run
	run.Stages = slices.Clone(run.Stages)
	run.Clusters = nil
	for _, c := range rec.states {
		run.Clusters = append(run.Clusters, *c)
	}
	slices.SortFunc(run.Clusters, byStageAndName)
	return run
}

func byStageAndName(a, b ClusterRecord) int {
	return cmp.Or(cmp.Compare(a.Stage, b.Stage), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

// Cluster is one cluster's state as last recorded.
func (rec *Recorder) Cluster(c Cluster) ClusterRecord {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return *rec.states[c]
}

// setRun keeps run (without its clusters) and returns the head ConfigMap
// that holds it. The caller holds mu, or has the Recorder to itself.
func (rec *Recorder) setRun(run RunRecord) *corev1.ConfigMap {
	head := run
	head.Clusters, head.AbortRequested = nil, ""
	rec.run = head
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: headName(run.Name), Namespace: rec.r.namespace},
		Data: map[string]string{runKey: mustJSON(head)}}
}

// UpdateRun changes the run's own state (not its clusters') and writes it.
func (rec *Recorder) UpdateRun(ctx context.Context, change func(*RunRecord)) error {
	rec.runWrites.Lock()
	defer rec.runWrites.Unlock()
	rec.mu.Lock()
	run := rec.run
	run.Stages = slices.Clone(run.Stages) // change writes into it
	change(&run)
	head := rec.setRun(run)
	rec.mu.Unlock()
	return rec.r.patch(ctx, head.Name, head.Data)
}

// UpdateCluster changes one cluster's state and writes it to its shard.
func (rec *Recorder) UpdateCluster(ctx context.Context, c Cluster, change func(*ClusterRecord)) error {
	return rec.UpdateClusters(ctx, []Cluster{c}, change)
}

// UpdateClusters changes the states of several clusters alike, with one
// write per shard they are in: a stopped run marks the clusters it did not
// start in a few writes, not one each.
func (rec *Recorder) UpdateClusters(ctx context.Context, clusters []Cluster, change func(*ClusterRecord)) error {
	rec.mu.Lock()
	writes := map[int]map[string]string{}
	for _, c := range clusters {
		state, ok := rec.states[c]
		if !ok {
			rec.mu.Unlock()
			return fmt.Errorf("fleet run %s has no cluster %s", rec.run.Name, c)
		}
		change(state)
		if writes[state.shard] == nil {
			writes[state.shard] = map[string]string{}
		}
		writes[state.shard][clusterKey(c)] = mustJSON(state)
	}
	rec.mu.Unlock()
	for shard, data := range writes {
		if err := rec.r.patch(ctx, shardName(rec.run.Name, shard), data); err != nil {
			return err
		}
	}
	return nil
}

// AbortRequested reads, live, whether `fleet abort` asked the run to start
// no new cluster: who and when, or "".
func (rec *Recorder) AbortRequested(ctx context.Context) (string, error) {
	cm, err := rec.r.c.CoreV1().ConfigMaps(rec.r.namespace).Get(ctx, headName(rec.run.Name), metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading fleet run %s: %w", rec.run.Name, err)
	}
	return cm.Annotations[abortAnnotation], nil
}

// patch merges data into a ConfigMap's data: the other keys, written by
// the run's other clusters, stay.
func (r *Records) patch(ctx context.Context, name string, data map[string]string) error {
	body := mustJSON(map[string]any{"data": data})
	r.Writes.Add(1)
	r.Bytes.Add(int64(len(body)))
	// The REST client, not the typed one: the answer is the whole shard,
	// which nothing here reads, and decoding it cost most of a run's
	// allocations (docs/fleet.md).
	err := r.c.CoreV1().RESTClient().Patch(types.MergePatchType).Namespace(r.namespace).Resource("configmaps").Name(name).
		Body([]byte(body)).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("recording fleet run state in ConfigMap %s/%s: %w", r.namespace, name, err)
	}
	return nil
}

func (r *Records) count(cm *corev1.ConfigMap) {
	r.Writes.Add(1)
	for _, v := range cm.Data {
		r.Bytes.Add(int64(len(v)))
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only the package's own types, which always marshal
	}
	return string(b)
}
