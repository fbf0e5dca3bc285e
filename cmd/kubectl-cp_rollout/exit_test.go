package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// kubeconfigFor writes a kubeconfig whose management cluster is server and
// returns the KUBECONFIG variable naming it.
func kubeconfigFor(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: mgmt
  cluster: {server: %q, insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: none}
contexts:
- name: mgmt
  context: {cluster: mgmt, user: admin, namespace: clusters}
current-context: mgmt
`, server)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return "KUBECONFIG=" + path
}

// oneErrorLine checks that stderr is the one `error:` line naming each of says.
func oneErrorLine(t *testing.T, what, stderr string, says ...string) {
	t.Helper()
	if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "error: ") {
		t.Errorf("%s: want one error line on stderr, got:\n%s", what, stderr)
	}
	for _, s := range says {
		if !strings.Contains(stderr, s) {
			t.Errorf("%s: stderr %q does not name %q", what, stderr, s)
		}
	}
}

// errorObject checks that stdout is exactly one JSON object, the one that
// ends a failed run, and returns it.
func errorObject(t *testing.T, what, stdout string) map[string]any {
	t.Helper()
	if strings.Count(stdout, "\n") != 1 || !strings.HasSuffix(stdout, "\n") {
		t.Fatalf("%s: want one line on stdout, got %q", what, stdout)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(stdout), &obj); err != nil {
		t.Fatalf("%s: stdout is not a JSON object (%v): %q", what, err, stdout)
	}
	if obj["action"] != "error" || obj["phase"] != "failed" {
		t.Errorf("%s: %v is not an error event", what, obj)
	}
	if _, err := time.Parse(time.RFC3339, fmt.Sprint(obj["time"])); err != nil {
		t.Errorf("%s: time %v: %v", what, obj["time"], err)
	}
	return obj
}

// A management API server where nothing listens is exit 7, before anything
// is read, for one cluster and for a fleet alike.
func TestUnreachableManagementClusterExitsSeven(t *testing.T) {
	env := []string{kubeconfigFor(t, "https://127.0.0.1:1")}
	for _, args := range [][]string{
		{"cp-rollout", "upgrade", "demo", "--version", "v1.36.3"},
		{"cp-rollout", "status", "-A"},
	} {
		r := kubectl(t, env, args...)
		if r.code != 7 {
			t.Errorf("%v: exit %d, want 7\n%s", args, r.code, r.log)
		}
		oneErrorLine(t, fmt.Sprint(args), r.log, "cannot reach the management cluster at https://127.0.0.1:1", "connection refused")
		if r.stdout != "" {
			t.Errorf("%v: printed to stdout without -o json: %q", args, r.stdout)
		}
	}

	r := kubectl(t, env, "cp-rollout", "upgrade", "demo", "--version", "v1.36.3", "-o", "json")
	obj := errorObject(t, "upgrade -o json", r.stdout)
	want := map[string]any{"exitCode": float64(7), "class": "unreachable", "cluster": "demo", "namespace": "clusters"}
	for k, v := range want {
		if obj[k] != v {
			t.Errorf("upgrade -o json: %s %v, want %v (%v)", k, obj[k], v, obj)
		}
	}
	if msg := fmt.Sprint(obj["message"]); !strings.Contains(r.log, "error: "+msg) {
		t.Errorf("the JSON message %q is not the error line:\n%s", msg, r.log)
	}
	if r.code != 7 {
		t.Errorf("upgrade -o json: exit %d, want 7", r.code)
	}

	// A fleet command ends with the same object, naming no one cluster.
	r = kubectl(t, env, "cp-rollout", "upgrade", "-A", "--yes", "--version", "v1.36.3", "-o", "json")
	obj = errorObject(t, "upgrade -A -o json", r.stdout)
	if r.code != 7 || obj["exitCode"] != float64(7) || obj["cluster"] != nil {
		t.Errorf("upgrade -A -o json: exit %d, %v: want 7 and no cluster", r.code, obj)
	}
}

func TestNoKubeconfigExitsSevenNamingHowToGiveOne(t *testing.T) {
	const howTo = "; point --kubeconfig or KUBECONFIG at a management cluster's kubeconfig (for example: export KUBECONFIG=~/.kube/config)"
	home := t.TempDir()
	for _, tc := range []struct {
		what string
		env  []string
		says string
	}{
		// kubectl's KUBECONFIG names a file that does not exist.
		{"KUBECONFIG names a missing file", []string{"KUBECONFIG=/nonexistent"},
			"error: no kubeconfig: KUBECONFIG names /nonexistent, which does not exist" + howTo},
		// Unset, client-go looks in ~/.kube/config alone.
		{"no KUBECONFIG and no ~/.kube/config", []string{"KUBECONFIG=", "HOME=" + home},
			"error: no kubeconfig: KUBECONFIG is not set and " + filepath.Join(home, ".kube", "config") + " does not exist" + howTo},
	} {
		r := kubectl(t, tc.env, "cp-rollout", "status", "demo")
		if r.code != 7 {
			t.Errorf("%s: exit %d, want 7\n%s", tc.what, r.code, r.log)
		}
		oneErrorLine(t, tc.what, r.log, tc.says)
		if strings.Contains(r.log, "KUBERNETES_MASTER") {
			t.Errorf("%s: the reason sends users to KUBERNETES_MASTER: %q", tc.what, r.log)
		}
	}

	r := kubectl(t, nil, "cp-rollout", "status", "demo", "-o", "json")
	if obj := errorObject(t, "status -o json", r.stdout); obj["class"] != "unreachable" || r.code != 7 {
		t.Errorf("status -o json: exit %d, %v: want 7, class unreachable", r.code, obj)
	}
}

// -v typed after the plugin's name reaches the plugin, as kubectl hands it
// on, and client-go logs each request on stderr as it does for kubectl: at 6
// its method, URL, status and duration. Without -v, the error line alone.
func TestVerbosityLogsRequests(t *testing.T) {
	env := []string{kubeconfigFor(t, "https://127.0.0.1:1")}
	r := kubectl(t, env, "cp-rollout", "status", "demo", "-v", "6")
	if r.code != 7 {
		t.Errorf("exit %d, want 7\n%s", r.code, r.log)
	}
	for _, want := range []string{`"Response" verb="GET" url="https://127.0.0.1:1/`, `status=""`, "milliseconds=", "error: cannot reach the management cluster"} {
		if !strings.Contains(r.log, want) {
			t.Errorf("-v 6: stderr lacks %q:\n%s", want, r.log)
		}
	}
	r = kubectl(t, env, "cp-rollout", "status", "demo")
	oneErrorLine(t, "without -v", r.log, "cannot reach the management cluster")
}

// A failure other than an unreachable cluster ends -o json output the same
// way, with its own class; text output prints nothing on stdout.
func TestBadUsageWithJSONEndsWithAnErrorObject(t *testing.T) {
	r := kubectl(t, nil, "cp-rollout", "upgrade", "demo", "-o", "json")
	obj := errorObject(t, "upgrade without --version", r.stdout)
	if r.code != 2 || obj["exitCode"] != float64(2) || obj["class"] != "usage" || !strings.Contains(fmt.Sprint(obj["message"]), "--version is required") {
		t.Errorf("exit %d, %v: want 2, class usage, naming --version", r.code, obj)
	}
}

// A signal stops a run that waits on the management cluster: SIGTERM exits
// 143 and SIGINT 130, as shells report them, so a runbook tells a
// supervisor's stop from a person's Ctrl-C.
func TestSignalsExitWithTheirOwnCodes(t *testing.T) {
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{
		{syscall.SIGTERM, 143},
		{syscall.SIGINT, 130},
	} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			// An API server that accepts connections and never answers: the
			// run blocks in its first request until the signal. status -A's
			// first requests (its lists) end with the run's context; a
			// single cluster's first read goes through discovery, which does
			// not, and would end only at the TLS handshake timeout.
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := l.Accept(); err == nil {
					accepted <- c
				}
			}()
			cmd, stdout, stderr := kubectlCommand(t, []string{kubeconfigFor(t, "https://"+l.Addr().String())},
				"cp-rollout", "status", "-A", "-o", "json")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			select {
			case c := <-accepted:
				defer c.Close()
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("the plugin never connected:\n%s", stderr)
			}
			// kubectl execs the plugin in its own place: this is the plugin.
			if err := cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			r := finish(t, cmd, cmd.Wait(), stdout, stderr)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", r.code, tc.code, r.log)
			}
			if obj := errorObject(t, "stopped run", r.stdout); obj["exitCode"] != float64(tc.code) || obj["class"] != "interrupted" {
				t.Errorf("the error object %v: want exitCode %d, class interrupted", obj, tc.code)
			}
		})
	}
}
