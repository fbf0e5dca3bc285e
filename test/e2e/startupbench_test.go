package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// startRuns is how many timed runs BenchmarkStartup makes after its warm-up:
// the start-up target is the median of ten.
const startRuns = 10

// BenchmarkStartup times `kubectl-cp_rollout version` as released: built as
// .goreleaser.yaml builds it (trimmed paths, grpcnotrace, stripped), each run
// a fresh process after one warm-up run. It times kubectl's own start-up
// alongside and compares the two binaries' sizes. The figures go to
// startup.json in CP_ROLLOUT_BENCH_OUT when set. Nearly all of the tool's
// time is package initialisation before main (GODEBUG=inittrace=1 lists it),
// most of it in the Kubernetes, Cluster API and etcd packages the tool links
// for KCP's own decisions.
func BenchmarkStartup(b *testing.B) {
	bin := filepath.Join(b.TempDir(), "kubectl-cp_rollout")
	build := exec.Command("go", "build", "-trimpath", "-tags", "grpcnotrace", "-ldflags", "-s -w", "-o", bin, "github.com/cp-rollout/cp-rollout/cmd/kubectl-cp_rollout")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building the release binary: %v\n%s", err, out)
	}
	// kubectl's own `version --client`, timed alternately with the tool's,
	// is the yardstick: both start the same way on the same machine, so the
	// ratio holds when a shared machine's noise moves both.
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		b.Fatal("this benchmark needs kubectl on PATH: ", err)
	}
	if kubectl, err = filepath.EvalSymlinks(kubectl); err != nil {
		b.Fatal(err)
	}
	run := func(name string, args ...string) float64 {
		start := time.Now()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			b.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return float64(time.Since(start).Microseconds()) / 1000
	}
	// One warm-up run each: the page cache holds both binaries from here on.
	run(bin, "version")
	run(kubectl, "version", "--client")
	var tool, kube []float64
	for range startRuns {
		tool = append(tool, run(bin, "version"))
		kube = append(kube, run(kubectl, "version", "--client"))
	}
	binary, kubectlSize := fileMB(b, bin), fileMB(b, kubectl)
	toolMs, kubeMs := spreadOf(tool), spreadOf(kube)
	result := map[string]any{
		"date": time.Now().UTC().Format(time.RFC3339), "runs": startRuns,
		"versionMs": toolMs, "kubectlVersionClientMs": kubeMs,
		"binaryMB": binary, "kubectlMB": kubectlSize,
	}
	line := fmt.Sprintf("version: %.1f ms median (%.1f–%.1f), kubectl version --client %.1f ms (%.1f–%.1f), %d runs each; stripped binary %.1f MB, kubectl %.1f MB",
		toolMs.Median, toolMs.Min, toolMs.Max, kubeMs.Median, kubeMs.Min, kubeMs.Max, startRuns, binary, kubectlSize)
	b.ReportMetric(toolMs.Median, "ms-median")
	b.ReportMetric(binary, "MB-binary")
	fmt.Println(line)
	writeBenchFigures(b, "startup.json", result)
}

// fileMB is the size of the file at path in megabytes.
func fileMB(b *testing.B, path string) float64 {
	info, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	return float64(info.Size()) / 1e6
}
