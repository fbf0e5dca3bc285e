package simtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pluginPackage is built once per test binary, the first time a test runs
// the plugin; the Go build cache makes later binaries' builds a link.
const pluginPackage = "github.com/cp-rollout/cp-rollout/cmd/kubectl-cp_rollout"

var plugin struct {
	once sync.Once
	dir  string
	err  error
}

// PluginDirEnv names a directory holding kubectl-cp_rollout already built from
// this checkout (`make test` sets it to bin/ after `make build`): every test
// binary then runs that one instead of linking its own, which costs each
// about ten seconds of CPU.
const PluginDirEnv = "CP_ROLLOUT_PLUGIN_DIR"

// PluginDir is a directory holding the plugin binary kubectl-cp_rollout: the
// one PluginDirEnv names, or else one built from this checkout on first use and
// removed when the test binary ends.
func PluginDir(t testing.TB) string {
	t.Helper()
	plugin.once.Do(func() {
		if dir := os.Getenv(PluginDirEnv); dir != "" {
			if _, err := os.Stat(filepath.Join(dir, "kubectl-cp_rollout")); err != nil {
				plugin.err = fmt.Errorf("%s=%s: %w", PluginDirEnv, dir, err)
				return
			}
			plugin.dir = dir
			return
		}
		dir, err := os.MkdirTemp("", "cp-rollout-plugin-")
		if err != nil {
			plugin.err = err
			return
		}
		atTeardown(func() { _ = os.RemoveAll(dir) })
		build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-cp_rollout"), pluginPackage)
		out, err := build.CombinedOutput()
		if err != nil {
			plugin.err = errors.New("building the plugin: " + err.Error() + "\n" + string(out))
			return
		}
		plugin.dir = dir
	})
	if plugin.err != nil {
		t.Fatal(plugin.err)
	}
	return plugin.dir
}

// Command is `kubectl cp-rollout args...` aimed at the simulator, with the
// plugin first on PATH and no configuration file of the developer's.
func (e *Env) Command(t testing.TB, ctx context.Context, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"cp-rollout"}, args...)...)
	cmd.Env = append(os.Environ(),
		"PATH="+PluginDir(t)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"KUBECONFIG="+e.Kubeconfig,
		"XDG_CONFIG_HOME="+t.TempDir())
	if !e.AwaitKCP {
		cmd.Env = append(cmd.Env, "CP_ROLLOUT_NO_WAIT=true")
	}
	return cmd
}

// Result is how a finished run of the plugin ended.
type Result struct {
	Code           int
	Stdout, Stderr string
	Took           time.Duration
}

// Plugin runs `kubectl cp-rollout args...` against the simulator to its end.
func (e *Env) Plugin(t testing.TB, ctx context.Context, args ...string) Result {
	t.Helper()
	return Run(t, e.Command(t, ctx, args...), args)
}

// Run runs cmd, a command for `kubectl cp-rollout args...`, to its end and
// logs how it ended with the tail of its standard error.
func Run(t testing.TB, cmd *exec.Cmd, args []string) Result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	began := time.Now()
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	r := Result{Code: cmd.ProcessState.ExitCode(), Stdout: stdout.String(), Stderr: stderr.String(), Took: time.Since(began)}
	t.Logf("kubectl cp-rollout %s: exit %d in %s\n%s", strings.Join(args, " "), r.Code, r.Took.Round(time.Millisecond), Tail(r.Stderr, 40))
	return r
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Events decodes the JSON Lines of `-o json`; a line that is not a JSON
// object fails the test.
func Events(t testing.TB, out string) []map[string]any {
	t.Helper()
	var evs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("not a JSON event: %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// Running is a run of the plugin started with StartPlugin: its JSON events
// arrive on Events as it prints them.
type Running struct {
	Cmd    *exec.Cmd
	Events chan map[string]any
	// Code is the exit code once the run has ended (-1 when killed).
	Code int

	done    chan struct{}
	errPath string
}

// StartPlugin starts `kubectl cp-rollout args...` (args should ask for
// `-o json`) and streams its events.
func (e *Env) StartPlugin(t testing.TB, args ...string) *Running {
	t.Helper()
	return StartCommand(t, e.Command(t, context.Background(), args...), args)
}

// StartCommand starts cmd, a command for `kubectl cp-rollout args...` (args should
// ask for `-o json`), and streams its events.
func StartCommand(t testing.TB, cmd *exec.Cmd, args []string) *Running {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "stderr")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &Running{Cmd: cmd, Events: make(chan map[string]any, 1000), done: make(chan struct{}), errPath: logFile}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				r.Events <- ev
			}
		}
		_ = cmd.Wait()
		f.Close()
		r.Code = cmd.ProcessState.ExitCode()
		t.Logf("kubectl cp-rollout %s: exit %d\n%s", strings.Join(args, " "), r.Code, Tail(r.Stderr(), 20))
		close(r.Events)
		close(r.done)
	}()
	return r
}

// Stderr is what the run has written to its standard error so far.
func (r *Running) Stderr() string {
	raw, _ := os.ReadFile(r.errPath)
	return string(raw)
}

// Until reads events until one matches and returns it; the run ending first,
// or five minutes passing, fails the test.
func (r *Running) Until(t testing.TB, match func(map[string]any) bool) map[string]any {
	t.Helper()
	timeout := time.After(5 * time.Minute)
	for {
		select {
		case ev, ok := <-r.Events:
			if !ok {
				t.Fatal("the run ended before the awaited event")
			}
			if match(ev) {
				return ev
			}
		case <-timeout:
			t.Fatal("awaited event did not come")
		}
	}
}

// Interrupt sends SIGINT, as Ctrl-C would, and returns the exit code.
func (r *Running) Interrupt() int {
	// kubectl execs the plugin in its own place, so this is the plugin's pid.
	_ = r.Cmd.Process.Signal(syscall.SIGINT)
	<-r.done
	return r.Code
}

// Kill ends the run with SIGKILL, as a crash or a closed laptop would.
func (r *Running) Kill() {
	_ = r.Cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
}

// Wait drains the events and returns the exit code once the run has ended.
func (r *Running) Wait() int {
	for range r.Events {
	}
	<-r.done
	return r.Code
}
