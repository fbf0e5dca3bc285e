package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/apiservertest"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
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
