// Package e2e drives the real plugin binary, through the real kubectl, against
// the simulator: real API servers, real Machine and KCP controllers, real etcd
// members; only the machines are simulated.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/sim"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cp-rollout-e2e-")
	if err != nil {
		panic(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-cp_rollout"), "../../cmd/kubectl-cp_rollout")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		panic("building the plugin: " + err.Error())
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// prefixes hands each simulator its own loopback /24: members use the kubeadm
// ports, so two simulators must not share addresses — nor two test processes
// running at once, hence the second octet from the process id.
var prefixes atomic.Int32

func addressPrefix() string {
	return fmt.Sprintf("127.%d.%d", 100+os.Getpid()%100, prefixes.Add(1))
}

type env struct {
	sim        *sim.Sim
	kubeconfig string
}

func startSim(t testing.TB, opts sim.Options) *env {
	t.Helper()
	if opts.AddressPrefix == "" {
		opts.AddressPrefix = addressPrefix()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := sim.Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting the simulator: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stopping the simulator: %v", err)
		}
	})
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	raw, err := s.ManagementKubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return &env{sim: s, kubeconfig: path}
}

// command is `kubectl cp-rollout args...` aimed at the simulator, with the
// plugin first on PATH and no configuration file of the developer's.
func (e *env) command(t testing.TB, ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"cp-rollout"}, args...)...)
	cmd.Env = append(os.Environ(),
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"KUBECONFIG="+e.kubeconfig,
		"XDG_CONFIG_HOME="+t.TempDir())
	return cmd
}

type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// plugin runs `kubectl cp-rollout args...` against the simulator.
func (e *env) plugin(t testing.TB, ctx context.Context, args ...string) result {
	t.Helper()
	return runPlugin(t, e.command(t, ctx, args...), args)
}

// runPlugin runs cmd, a command for `kubectl cp-rollout args...`, to its end.
func runPlugin(t testing.TB, cmd *exec.Cmd, args []string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	r := result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String(), took: time.Since(began)}
	t.Logf("kubectl cp-rollout %s: exit %d in %s\n%s", strings.Join(args, " "), r.code, r.took.Round(time.Millisecond), tail(r.stderr, 40))
	return r
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// kill ends the run with SIGKILL, as a crash or a closed laptop would.
func (r *running) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
}

// breakLock deletes the Lease of a run the test killed: its holder is known
// to be dead, so the next run need not wait for the Lease to expire.
func breakLock(t *testing.T, e *env) {
	t.Helper()
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: e.sim.ClusterKey().Namespace, Name: controlplane.LeaseName("demo")}}
	if err := e.sim.ManagementClient().Delete(context.Background(), lease); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
}

// mustMachines names the simulator's control-plane machines.
func mustMachines(t *testing.T, e *env) []string {
	t.Helper()
	machines, err := e.sim.Machines(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range machines {
		out = append(out, m.Name)
	}
	return out
}

// etcdCAKey is the simulated cluster's etcd CA Secret, <cluster>-etcd.
func etcdCAKey(e *env) client.ObjectKey {
	return client.ObjectKey{Namespace: e.sim.ClusterKey().Namespace, Name: secret.Name(e.sim.ClusterKey().Name, secret.EtcdCA)}
}
