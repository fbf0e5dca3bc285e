package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
)

// The fleet a status -A benchmark reads: inert clusters of five machines.
const fleetClusters, fleetMachines = 1000, 5

// BenchmarkStatusFleet times `kubectl-cp_rollout status -A` over 1,000
// clusters of 5 control-plane machines each (inert: management-cluster
// objects only, on a bare API server with Cluster API's CRDs), and measures
// the process's peak resident memory. Each run is a fresh process, as a
// person or a script runs it: the figures include start-up, discovery and
// the lists. CP_ROLLOUT_BENCH_RUNS runs (default 10) follow a warm-up; the
// medians and maxima are reported, and written to fleet-status.json in
// CP_ROLLOUT_BENCH_OUT when set.
func BenchmarkStatusFleet(b *testing.B) {
	runs := 10
	if v, err := strconv.Atoi(os.Getenv("CP_ROLLOUT_BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}
	ctx := context.Background()
	cfg := apiservertest.StartCAPI(b)
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	if err := sim.CreateInertClusters(ctx, c, "fleet", fleetClusters, fleetMachines, "v1.35.2"); err != nil {
		b.Fatal(err)
	}
	b.Logf("created %d clusters of %d machines in %s", fleetClusters, fleetMachines, time.Since(began).Round(100*time.Millisecond))
	kubeconfig := writeKubeconfig(b, cfg)
	plugin := filepath.Join(simtest.PluginDir(b), "kubectl-cp_rollout")
	// The plugin runs under peakrss, a small launcher: started from this
	// process, which holds the fleet it created, its peak would count this
	// process's memory (see test/e2e/peakrss).
	peakrss, peakFile := filepath.Join(b.TempDir(), "peakrss"), filepath.Join(b.TempDir(), "peak-kb")
	if out, err := exec.Command("go", "build", "-o", peakrss, "github.com/cp-rollout/cp-rollout/test/e2e/peakrss").CombinedOutput(); err != nil {
		b.Fatalf("building peakrss: %v\n%s", err, out)
	}

	status := func() (time.Duration, float64) {
		cmd := exec.Command(peakrss, peakFile, plugin, "status", "-A", "--kubeconfig", kubeconfig)
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		raw, _ := io.ReadAll(out)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("status -A: %v", err)
		}
		took := time.Since(start)
		if rows := strings.Count(string(raw), "\n") - 1; rows != fleetClusters {
			b.Fatalf("status -A printed %d rows, want %d", rows, fleetClusters)
		}
		kb, err := os.ReadFile(peakFile)
		if err != nil {
			b.Fatal(err)
		}
		peak, err := strconv.ParseFloat(strings.TrimSpace(string(kb)), 64)
		if err != nil {
			b.Fatalf("peakrss wrote %q: %v", kb, err)
		}
		return took, peak / 1024
	}
	status() // warm-up: the API server's caches, the page cache
	var ms, mb []float64
	for range runs {
		took, rss := status()
		ms, mb = append(ms, float64(took.Microseconds())/1000), append(mb, rss)
	}
	slices.Sort(ms)
	slices.Sort(mb)
	result := map[string]any{
		"date": time.Now().UTC().Format(time.RFC3339), "clusters": fleetClusters, "machines": fleetClusters * fleetMachines, "runs": runs,
		"wallMs":    map[string]float64{"median": ms[len(ms)/2], "max": ms[len(ms)-1]},
		"peakRSSMB": map[string]float64{"median": mb[len(mb)/2], "max": mb[len(mb)-1]},
	}
	b.ReportMetric(ms[len(ms)/2], "ms-median")
	b.ReportMetric(ms[len(ms)-1], "ms-max")
	b.ReportMetric(mb[len(mb)-1], "MB-peak-max")
	line := fmt.Sprintf("status -A over %d clusters / %d machines: %.0f ms median (max %.0f), peak RSS %.1f MB median (max %.1f), %d runs",
		fleetClusters, fleetClusters*fleetMachines, ms[len(ms)/2], ms[len(ms)-1], mb[len(mb)/2], mb[len(mb)-1], runs)
	fmt.Println(line)
	writeBenchFigures(b, "fleet-status.json", result)
}

// writeBenchFigures writes a benchmark's figures as JSON to name in the
// directory CP_ROLLOUT_BENCH_OUT names, when it is set.
func writeBenchFigures(b *testing.B, name string, figures any) {
	dir := os.Getenv("CP_ROLLOUT_BENCH_OUT")
	if dir == "" {
		return
	}
	raw, err := json.MarshalIndent(figures, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), append(raw, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
}

// writeKubeconfig writes a kubeconfig for cfg, as a user of the tool has one.
func writeKubeconfig(b *testing.B, cfg *rest.Config) string {
	b.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["fleet"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["fleet"] = &clientcmdapi.Context{Cluster: "fleet", AuthInfo: "admin"}
	kc.CurrentContext = "fleet"
	path := filepath.Join(b.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		b.Fatal(err)
	}
	return path
}

// The fleet sizes BenchmarkFleetRun measures, and its stages: the clusters
// are labelled ring=0, 1 and 2 in turn.
var fleetRunSizes = []int{1000, 2000}

const fleetRunStages = "ring=0;ring=1;ring=2"

// fleetRunRollouts says, in the figures, what each cluster's rollout was.
const fleetRunRollouts = "stubbed (stubRollout), no machine changes"

// stubRollout is each cluster's rollout in BenchmarkFleetRun: none. It
// returns at once, as a rollout that replaced one machine would end, so
// that what is measured is the fleet run's own machinery (placement, the
// record, the stages, fleet status), which no simulator could drive for
// 2,000 clusters on two cores.
func stubRollout(context.Context, fleet.Member) (string, error) { return "1 replaced", nil }

// BenchmarkFleetRun measures a staged, recorded fleet run's own machinery at
// 1,000 and 2,000 clusters (one sub-benchmark each, each on a fresh API
// server with Cluster API's CRDs and that many inert clusters of one machine,
// labelled ring=0/1/2 in turn), with the rollouts stubbed (stubRollout):
//
//   - placement: fleet.Place into the three stages ring=0;ring=1;ring=2;
//   - the run: Records.Create and Staged.Run (3 stages, --parallel 10, no
//     soak): its time, its record writes and the API requests it made, the
//     heap its bookkeeping holds after it and what it allocated;
//   - the run's ConfigMaps as stored;
//   - `fleet status RUN -o json` by the plugin binary (median of 3 after a
//     warm-up, and its peak RSS) and by `kubectl cp-rollout` (median of 3),
//     and `fleet status` (the list of runs) once;
//   - a run stopped before its first cluster, which records each cluster as
//     not started, a write per shard.
//
// The figures go to fleet-run.json in CP_ROLLOUT_BENCH_OUT when set.
func BenchmarkFleetRun(b *testing.B) {
	began, loadBefore := time.Now(), fleetBenchLoad()
	plugin := filepath.Join(simtest.PluginDir(b), "kubectl-cp_rollout")
	// peakrss: see BenchmarkStatusFleet.
	peakrss := filepath.Join(b.TempDir(), "peakrss")
	if out, err := exec.Command("go", "build", "-o", peakrss, "github.com/cp-rollout/cp-rollout/test/e2e/peakrss").CombinedOutput(); err != nil {
		b.Fatalf("building peakrss: %v\n%s", err, out)
	}
	var sizes []map[string]any
	for _, n := range fleetRunSizes {
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			sizes = append(sizes, benchFleetRunSize(b, n, plugin, peakrss))
		})
	}
	if len(sizes) == 0 {
		return
	}
	figures := map[string]any{
		"benchmark": "BenchmarkFleetRun",
		"command":   fleetBenchCommand(),
		"make":      "make bench-fleet (runs BenchmarkStatusFleet and BenchmarkFleetRun)",
		"machine": map[string]any{"cpus": runtime.NumCPU(), "os": runtime.GOOS, "arch": runtime.GOARCH, "go": runtime.Version(),
			"cpu": fleetBenchCPUModel(),
			// Other work on the machine moves the figures: the 1-, 5- and
			// 15-minute load averages as the benchmark began and ended.
			"loadAverageBefore": loadBefore, "loadAverageAfter": fleetBenchLoad()},
		"date":     time.Now().UTC().Format(time.RFC3339),
		"rollouts": fleetRunRollouts,
		"stub":     "stubRollout",
		"setup": fmt.Sprintf("one API server (envtest: etcd and kube-apiserver with Cluster API's CRDs) per size; inert clusters of 1 machine "+
			"(sim.CreateInertClusters), labelled ring=0/1/2 in turn; stages %q; Staged.Run with Parallel 10, MaxFailures 0, no soak, "+
			"MachineTime 15m, Healthy a stub returning nil, Watch nil; the run's client at QPS 1000, burst 2000 (the plugin's own records "+
			"client is at client-go's default, see recordsClientAsPlugin)", fleetRunStages),
		"sizes":        sizes,
		"totalSeconds": math.Round(time.Since(began).Seconds()),
	}
	if len(sizes) == 2 {
		ratio := func(key string) float64 {
			a, _ := sizes[0][key].(float64)
			z, _ := sizes[1][key].(float64)
			if a == 0 {
				return 0
			}
			return math.Round(z/a*100) / 100
		}
		figures["perClusterRatio2kTo1k"] = map[string]float64{
			"placement": ratio("placeUsPerCluster"), "run": ratio("runMsPerCluster"),
			"heap": ratio("heapBytesPerCluster"), "allocated": ratio("allocBytesPerCluster"),
			"apiserverCpu": ratio("apiserverCpuMsPerCluster"),
		}
	}
	writeBenchFigures(b, "fleet-run.json", figures)
}

// benchFleetRunSize is BenchmarkFleetRun at n clusters: its figures.
func benchFleetRunSize(b *testing.B, n int, plugin, peakrss string) map[string]any {
	const (
		namespace = "fleet"
		runName   = "bench"
		// The run is recorded where the plugin looks by default: the
		// kubeconfig context's namespace, here none, so "default".
		runNamespace = "default"
	)
	ctx := context.Background()
	cfg := apiservertest.StartCAPI(b)
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	if err := sim.CreateInertClusters(ctx, c, namespace, n, 1, "v1.35.2"); err != nil {
		b.Fatal(err)
	}
	// CreateInertClusters labels env=inert only: the rings are patched on.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := 1; i <= n; i++ {
		g.Go(func() error {
			cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: sim.InertClusterName(i)}}
			patch := fmt.Sprintf(`{"metadata":{"labels":{"ring":"%d"}}}`, (i-1)%3)
			return c.Patch(gctx, cl, client.RawPatch(types.MergePatchType, []byte(patch)))
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatalf("labelling the rings: %v", err)
	}
	b.Logf("created and labelled %d clusters of 1 machine in %s", n, time.Since(began).Round(100*time.Millisecond))
	kubeconfig := writeKubeconfig(b, cfg)

	// Placement.
	lister, err := fleet.NewLister(cfg)
	if err != nil {
		b.Fatal(err)
	}
	stages, err := fleet.ParseStages(fleetRunStages)
	if err != nil {
		b.Fatal(err)
	}
	// Placement is one paged list and a sort: the median of 5, after 2
	// (the API server is still busy from the creation for a while), with
	// the CPU the 5 took in this process and in the API server.
	var members []fleet.Member
	var skipped []fleet.Skipped
	var placeMs []float64
	var placeCPU map[string]float64
	for i := range 7 {
		if i == 2 {
			placeCPU = fleetBenchCPU()
		}
		start := time.Now()
		members, skipped, err = fleet.Place(ctx, lister, fleet.Scope{Namespace: namespace}, stages)
		placeMs = append(placeMs, fleetBenchMs(time.Since(start)))
		if err != nil {
			b.Fatal(err)
		}
	}
	for proc, secs := range fleetBenchCPU() {
		placeCPU[proc] = math.Round((secs-placeCPU[proc])/5*1000*10) / 10 // ms each
	}
	placeTook := time.Duration(fleetBenchMedian(placeMs[2:]) * float64(time.Millisecond))
	perStage := make([]int, len(stages))
	for _, m := range members {
		perStage[m.Stage-1]++
	}
	if len(members) != n || len(skipped) != 0 || slices.Contains(perStage, 0) {
		b.Fatalf("placed %d clusters (%v by stage), skipped %d, want %d in 3 stages", len(members), perStage, len(skipped), n)
	}

	// The run, on a client that counts its requests.
	// Its slices are made before the run, so as not to count in its heap.
	counter := &fleetBenchRequests{byVerb: map[string]*fleetBenchVerb{}}
	for _, verb := range []string{http.MethodGet, http.MethodPatch, http.MethodPost} {
		counter.byVerb[verb] = &fleetBenchVerb{took: make([]time.Duration, 0, 4*n)}
	}
	runCfg := rest.CopyConfig(cfg)
	runCfg.Wrap(counter.wrap)
	cs, err := kubernetes.NewForConfig(runCfg)
	if err != nil {
		b.Fatal(err)
	}
	records := fleet.NewRecords(cs, runNamespace)
	record := fleet.RunRecord{Name: runName, Request: "upgrade to v1.36.3", Command: "kubectl cp-rollout upgrade -A --to v1.36.3 --stages '" + fleetRunStages + "' --parallel 10 --run " + runName,
		Scope: "in namespace " + namespace, Parallel: 10, StartedBy: "bench", Started: time.Now().UTC(), State: fleet.RunRunning}
	for _, sel := range stages {
		record.Stages = append(record.Stages, fleet.StageRecord{Selector: sel.String(), State: fleet.StagePending})
	}
	for _, m := range members {
		record.Clusters = append(record.Clusters, fleet.ClusterRecord{Cluster: m.Cluster, Stage: m.Stage, State: fleet.Pending})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC() // the second empties the sync.Pools, which outlive one
	runtime.ReadMemStats(&before)
	cpuBefore := fleetBenchCPU()
	start := time.Now()
	rec, err := records.Create(ctx, record)
	if err != nil {
		b.Fatal(err)
	}
	createTook := time.Since(start)
	staged := fleet.Staged{Record: rec, Stages: len(stages), Limits: fleet.Limits{Parallel: 10}, MachineTime: 15 * time.Minute, Now: time.Now,
		Do: stubRollout, Healthy: func(context.Context, fleet.Cluster) error { return nil }}
	runErr := staged.Run(ctx, members)
	runTook := time.Since(start)
	cpuAfter := fleetBenchCPU()
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	final := rec.Run() // rec is live to here: its bookkeeping is in the heap above
	if runErr != nil {
		b.Fatalf("the run: %v", runErr)
	}
	if done := final.Count()[fleet.Done]; done != n || final.State != fleet.RunDone {
		b.Fatalf("the run ended %s with %d of %d clusters done (%v)", final.State, done, n, final.Count())
	}
	writes, writeBytes := records.Writes.Load(), records.Bytes.Load()
	shards := (n + 99) / 100
	// Create: the head and the shards; each cluster: its start and its end;
	// each stage: running, then done; the run's end.
	wantWrites := int64(1 + shards + 2*n + 2*len(stages) + 1)
	if writes != wantWrites {
		b.Errorf("the run made %d record writes, want %d (1 head + %d shards + 2 × %d clusters + 2 × %d stages + 1 end)", writes, wantWrites, shards, n, len(stages))
	}
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	alloc := after.TotalAlloc - before.TotalAlloc
	requests, requestTotal := counter.figures()
	cpu := map[string]float64{}
	for proc, secs := range cpuAfter {
		cpu[proc] = math.Round((secs-cpuBefore[proc])*100) / 100
	}

	// The run's ConfigMaps as stored.
	plain, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cms, err := plain.CoreV1().ConfigMaps(runNamespace).List(ctx, metav1.ListOptions{LabelSelector: "cp-rollout.io/fleet-run=" + runName})
	if err != nil {
		b.Fatal(err)
	}
	var dataBytes, objectBytes, largest int
	for _, cm := range cms.Items {
		size := 0
		for k, v := range cm.Data {
			size += len(k) + len(v)
		}
		dataBytes, largest = dataBytes+size, max(largest, size)
		raw, _ := json.Marshal(cm)
		objectBytes += len(raw)
	}

	// fleet status RUN -o json, and the list of runs.
	peakFile := filepath.Join(b.TempDir(), "peak-kb")
	status := func(argv ...string) (time.Duration, []byte, float64) {
		cmd := exec.Command(peakrss, append([]string{peakFile}, argv...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		start := time.Now()
		out, err := cmd.Output()
		took := time.Since(start)
		if err != nil {
			b.Fatalf("%s: %v\n%s", strings.Join(argv[1:], " "), err, stderr.String())
		}
		kb, err := os.ReadFile(peakFile)
		if err != nil {
			b.Fatal(err)
		}
		peak, err := strconv.ParseFloat(strings.TrimSpace(string(kb)), 64)
		if err != nil {
			b.Fatalf("peakrss wrote %q: %v", kb, err)
		}
		return took, out, peak / 1024
	}
	showArgs := []string{"fleet", "status", runName, "-o", "json", "--kubeconfig", kubeconfig}
	_, out, _ := status(append([]string{plugin}, showArgs...)...) // warm-up
	var shown struct {
		Run      string `json:"run"`
		State    string `json:"state"`
		Clusters []struct {
			State string `json:"state"`
		} `json:"clusters"`
	}
	if err := json.Unmarshal(out, &shown); err != nil {
		b.Fatalf("fleet status %s -o json: %v\n%.500s", runName, err, out)
	}
	if shown.Run != runName || shown.State != fleet.RunDone || len(shown.Clusters) != n {
		b.Fatalf("fleet status %s -o json shows run %q, %s, %d clusters; want %s, done, %d", runName, shown.Run, shown.State, len(shown.Clusters), runName, n)
	}
	var showMs, showMB, kubectlMs []float64
	for range 3 {
		took, _, mb := status(append([]string{plugin}, showArgs...)...)
		showMs, showMB = append(showMs, fleetBenchMs(took)), append(showMB, mb)
	}
	// The same through kubectl, which finds the plugin on PATH.
	kubectlFigures := map[string]any{"skipped": "no kubectl on PATH"}
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		for i := range 4 { // the first a warm-up
			cmd := exec.Command(kubectl, append([]string{"cp-rollout"}, showArgs...)...)
			cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(plugin)+string(os.PathListSeparator)+os.Getenv("PATH"))
			start := time.Now()
			if _, err := cmd.Output(); err != nil {
				b.Fatalf("kubectl cp-rollout fleet status: %v", err)
			}
			if i > 0 {
				kubectlMs = append(kubectlMs, fleetBenchMs(time.Since(start)))
			}
		}
		kubectlFigures = map[string]any{"wallMsMedian": fleetBenchMedian(kubectlMs), "wallMs": kubectlMs}
	}
	listTook, listOut, listMB := status(plugin, "fleet", "status", "--kubeconfig", kubeconfig)
	if lines := strings.Count(string(listOut), "\n"); lines != 2 {
		b.Fatalf("fleet status listed %d lines, want a header and one run:\n%s", lines, listOut)
	}

	// A run stopped before its first cluster (Ctrl-C, the board's q, or
	// fleet abort before the first start) records every cluster as not
	// started, a write per shard, before it ends: a second run of the same
	// clusters, through the run's client, with ctx ended.
	stoppedRec, err := records.Create(ctx, func() fleet.RunRecord {
		r := record
		r.Name, r.Clusters, r.Stages = runName+"-stopped", nil, nil
		for _, sel := range stages {
			r.Stages = append(r.Stages, fleet.StageRecord{Selector: sel.String(), State: fleet.StagePending})
		}
		for _, m := range members {
			r.Clusters = append(r.Clusters, fleet.ClusterRecord{Cluster: m.Cluster, Stage: m.Stage, State: fleet.Pending})
		}
		return r
	}())
	if err != nil {
		b.Fatal(err)
	}
	stoppedCtx, stop := context.WithCancel(ctx)
	stop()
	stoppedRun := fleet.Staged{Record: stoppedRec, Stages: len(stages), Limits: fleet.Limits{Parallel: 10}, MachineTime: 15 * time.Minute, Now: time.Now,
		Do: stubRollout, Healthy: func(context.Context, fleet.Cluster) error { return nil }}
	start = time.Now()
	_ = stoppedRun.Run(stoppedCtx, members)
	stoppedTook := time.Since(start)
	if ended := stoppedRec.Run(); ended.State != fleet.RunStopped || ended.Count()[fleet.NotStarted] != n {
		b.Fatalf("the stopped run ended %s, %v; want stopped, %d not started", ended.State, ended.Count(), n)
	}

	result := map[string]any{
		"clusters": n, "machinesPerCluster": 1, "stages": perStage, "parallel": 10,
		"placeMs":           fleetBenchMs(placeTook),
		"placeMsRuns":       placeMs,
		"placeCpuMsEach":    placeCPU,
		"placeUsPerCluster": math.Round(float64(placeTook.Microseconds())/float64(n)*10) / 10,
		"run": map[string]any{
			"createMs": fleetBenchMs(createTook), "wallMs": fleetBenchMs(runTook),
			"recordWrites": writes, "recordWriteBytes": writeBytes,
			"requests": requests, "requestsTotal": requestTotal,
			"cpuSeconds": cpu,
		},
		"stoppedBeforeFirstCluster": map[string]any{
			"wallMs": fleetBenchMs(stoppedTook), "msPerCluster": math.Round(fleetBenchMs(stoppedTook)/float64(n)*100) / 100,
		},
		"apiserverCpuMsPerCluster": math.Round(cpu["kube-apiserver"]/float64(n)*1000*10) / 10,
		"runMsPerCluster":          math.Round(fleetBenchMs(runTook)/float64(n)*1000) / 1000,
		"writesPerCluster":         math.Round(float64(writes)/float64(n)*1000) / 1000,
		"writeBytesPerCluster":     math.Round(float64(writeBytes) / float64(n)),
		"requestsPerCluster":       math.Round(float64(requestTotal)/float64(n)*1000) / 1000,
		"heapBytesPerCluster":      math.Round(float64(heap) / float64(n)),
		"allocBytesPerCluster":     math.Round(float64(alloc) / float64(n)),
		"heapBytes":                heap,
		"allocBytes":               alloc,
		"storedConfigMaps":         len(cms.Items),
		"storedDataBytes":          dataBytes,
		"storedLargestDataBytes":   largest,
		"storedObjectBytes":        objectBytes,
		"fleetStatusRun": map[string]any{
			"wallMsMedian": fleetBenchMedian(showMs), "wallMs": showMs, "outputBytes": len(out),
			"peakRSSMBMedian": fleetBenchMedian(showMB), "viaKubectl": kubectlFigures,
		},
		"fleetStatusList": map[string]any{"wallMs": fleetBenchMs(listTook), "outputBytes": len(listOut), "peakRSSMB": math.Round(listMB*10) / 10},
	}
	b.ReportMetric(fleetBenchMs(runTook)/float64(n), "run-ms/cluster")
	b.ReportMetric(float64(writes)/float64(n), "writes/cluster")
	b.ReportMetric(float64(heap)/float64(n), "heap-B/cluster")
	b.ReportMetric(float64(alloc)/float64(n), "alloc-B/cluster")
	b.ReportMetric(fleetBenchMedian(showMs), "status-ms")
	fmt.Printf("fleet run over %d clusters (stubbed rollouts): place %.0f ms; run %.0f ms (%.2f ms/cluster), %d writes (%.2f/cluster), %d requests; "+
		"heap %.0f B/cluster, allocated %.0f B/cluster; stored %d ConfigMaps, %d data bytes; fleet status -o json %.0f ms median, %d bytes\n",
		n, fleetBenchMs(placeTook), fleetBenchMs(runTook), fleetBenchMs(runTook)/float64(n), writes, float64(writes)/float64(n), requestTotal,
		float64(heap)/float64(n), float64(alloc)/float64(n), len(cms.Items), dataBytes, fleetBenchMedian(showMs), len(out))
	return result
}

// fleetBenchRequests counts a client's requests by method: how many, how
// long each took to its response's headers, and the response bytes.
type fleetBenchRequests struct {
	mu     sync.Mutex
	byVerb map[string]*fleetBenchVerb
}

type fleetBenchVerb struct {
	took  []time.Duration
	bytes atomic.Int64
}

func (r *fleetBenchRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return fleetBenchRoundTrip(func(req *http.Request) (*http.Response, error) {
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		took := time.Since(start)
		r.mu.Lock()
		v := r.byVerb[req.Method]
		if v == nil {
			v = &fleetBenchVerb{}
			r.byVerb[req.Method] = v
		}
		v.took = append(v.took, took)
		r.mu.Unlock()
		if resp != nil && resp.Body != nil {
			resp.Body = &fleetBenchBody{ReadCloser: resp.Body, n: &v.bytes}
		}
		return resp, err
	})
}

// figures are the counts by method, and their total.
func (r *fleetBenchRequests) figures() (map[string]any, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, total := map[string]any{}, 0
	for verb, v := range r.byVerb {
		ms := make([]float64, len(v.took))
		for i, d := range v.took {
			ms[i] = float64(d.Microseconds()) / 1000
		}
		slices.Sort(ms)
		out[verb] = map[string]any{"count": len(ms), "msMedian": ms[len(ms)/2], "msP99": ms[len(ms)*99/100], "msMax": ms[len(ms)-1],
			"responseBytes": v.bytes.Load(), "responseBytesEach": v.bytes.Load() / int64(len(ms))}
		total += len(ms)
	}
	return out, total
}

type fleetBenchRoundTrip func(*http.Request) (*http.Response, error)

func (f fleetBenchRoundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type fleetBenchBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *fleetBenchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func fleetBenchMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func fleetBenchMedian(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// fleetBenchCommand is the go test command that is running, as typed.
func fleetBenchCommand() string {
	words := []string{"go", "test", "./test/e2e"}
	for _, a := range os.Args[1:] {
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a, "-test."), "=")
		switch name {
		case "paniconexit0", "testlogfile", "gocoverdir":
			continue
		}
		words = append(words, "-"+name)
		if hasValue {
			if strings.Trim(value, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=-") != "" || value == "" {
				value = "'" + strings.ReplaceAll(value, "'", `'\''`) + "'"
			}
			words = append(words, value)
		}
	}
	var env []string
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		env = append(env, "KUBEBUILDER_ASSETS=$(hack/envtest-binaries.sh)")
	}
	for _, name := range []string{"CP_ROLLOUT_PLUGIN_DIR", "CP_ROLLOUT_BENCH_OUT"} {
		if v := os.Getenv(name); v != "" {
			env = append(env, name+"="+v)
		}
	}
	return strings.Join(append(env, words...), " ")
}

// fleetBenchCPUModel is the machine's CPU, as Linux names it.
func fleetBenchCPUModel() string {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(raw)) {
		if name, value, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return ""
}

// fleetBenchCPU is the CPU time, in seconds, of this process and of the
// API server and etcd it started (its children), by name.
func fleetBenchCPU() map[string]float64 {
	out := map[string]float64{}
	entries, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid … utime stime: fields 14 and 15.
		s := string(raw)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < 0 {
			continue
		}
		comm, fields := s[open+1:closing], strings.Fields(s[closing+1:])
		if len(fields) < 13 || (e.Name() != self && fields[1] != self) {
			continue
		}
		if e.Name() == self {
			comm = "benchmark"
		}
		utime, _ := strconv.ParseFloat(fields[11], 64)
		stime, _ := strconv.ParseFloat(fields[12], 64)
		out[comm] += (utime + stime) / 100 // USER_HZ
	}
	return out
}

// fleetBenchLoad is /proc/loadavg's 1-, 5- and 15-minute load averages.
func fleetBenchLoad() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(string(raw))[:3], " ")
}
