package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// These tests run the real binary the way users do: through the real kubectl,
// which finds kubectl-cp_rollout (and its completion helper) on PATH.

var binDir string

func TestMain(m *testing.M) {
	// `make test` has built both into bin/ already (simtest.PluginDirEnv).
	if dir := os.Getenv("CP_ROLLOUT_PLUGIN_DIR"); dir != "" {
		binDir = dir
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "cp-rollout-bin-")
	if err != nil {
		panic(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "kubectl-cp_rollout"), ".")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		panic("building the plugin: " + err.Error())
	}
	helper, err := os.ReadFile("../kubectl_complete-cp_rollout/kubectl_complete-cp_rollout")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "kubectl_complete-cp_rollout"), helper, 0o755)
	}
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type outcome struct {
	code        int
	stdout, log string
}

// kubectl runs the real kubectl with the plugin first on PATH and an empty
// configuration directory.
func kubectl(t *testing.T, env []string, args ...string) outcome {
	t.Helper()
	cmd, stdout, stderr := kubectlCommand(t, env, args...)
	return finish(t, cmd, cmd.Run(), stdout, stderr)
}

// kubectlCommand is kubectl's command, not yet started, and where its
// output goes. KUBECONFIG names a file that does not exist unless env sets it.
func kubectlCommand(t *testing.T, env []string, args ...string) (cmd *exec.Cmd, stdout, stderr *bytes.Buffer) {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Fatal("these tests need kubectl on PATH: ", err)
	}
	cmd = exec.Command("kubectl", args...)
	cmd.Env = append(os.Environ(),
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"XDG_CONFIG_HOME="+t.TempDir(),
		"KUBECONFIG="+filepath.Join(t.TempDir(), "none"))
	cmd.Env = append(cmd.Env, env...)
	stdout, stderr = &bytes.Buffer{}, &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd, stdout, stderr
}

// finish is the outcome of cmd, which ended with err.
func finish(t *testing.T, cmd *exec.Cmd, err error, stdout, stderr *bytes.Buffer) outcome {
	t.Helper()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return outcome{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), log: stderr.String()}
}

func TestKubectlFindsThePlugin(t *testing.T) {
	r := kubectl(t, nil, "plugin", "list")
	if want := filepath.Join(binDir, "kubectl-cp_rollout"); !strings.Contains(r.stdout, want) {
		t.Fatalf("kubectl plugin list does not list %s:\n%s%s", want, r.stdout, r.log)
	}
}

// kubectl's flags are listed, as kubectl lists its own, by the options verb
// that --help points at.
func TestHelpShowsKubectlFlags(t *testing.T) {
	r := kubectl(t, nil, "cp-rollout", "--help")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.log)
	}
	for _, want := range []string{"kubectl cp-rollout [command]", "version", `Use "kubectl cp-rollout options" for a list of global command-line options`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	r = kubectl(t, nil, "cp-rollout", "options")
	if r.code != 0 {
		t.Fatalf("options: exit %d: %s", r.code, r.log)
	}
	for _, want := range []string{"--kubeconfig", "--context", "--namespace", "--as ", "--request-timeout"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("options lacks %q", want)
		}
	}
}

func TestBadUsageExitsTwoWithOneLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		hint string // the help of the command that refused
	}{
		{[]string{"cp-rollout", "upgarde"}, "Run 'kubectl cp-rollout --help' for usage."},
		{[]string{"cp-rollout", "version", "--no-such-flag"}, "Run 'kubectl cp-rollout version --help' for usage."},
		{[]string{"cp-rollout", "version", "-o", "xml"}, "Run 'kubectl cp-rollout version --help' for usage."},
	} {
		args := tc.args
		r := kubectl(t, nil, args...)
		if r.code != 2 {
			t.Errorf("%v: exit %d, want 2", args, r.code)
		}
		lines := strings.Split(strings.TrimSpace(r.log), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "error: ") || lines[1] != tc.hint {
			t.Errorf("%v: want one error line and %q, got:\n%s", args, tc.hint, r.log)
		}
		if r.stdout != "" {
			t.Errorf("%v: printed to stdout: %q", args, r.stdout)
		}
	}
}

func TestMalformedConfigNamesFileAndLine(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("namespace: x\n\tcontext: y\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := kubectl(t, []string{"CP_ROLLOUT_CONFIG=" + file}, "cp-rollout", "version")
	if r.code != 2 || !strings.Contains(r.log, file+": line 2:") {
		t.Fatalf("exit %d, stderr %q: want exit 2 naming %s and line 2", r.code, r.log, file)
	}
}

func TestKubectlCompletesThePlugin(t *testing.T) {
	r := kubectl(t, nil, "__complete", "cp-rollout", "ver")
	if !strings.Contains(r.stdout, "version") {
		t.Fatalf("kubectl did not complete through kubectl_complete-cp_rollout:\n%s%s", r.stdout, r.log)
	}
}

// TestKubectlCompletesClusterNames: `kubectl cp-rollout upgrade <TAB>` offers
// the Clusters of the kubeconfig context's namespace, which the plugin reads
// from the management cluster when kubectl runs its completion helper.
func TestKubectlCompletesClusterNames(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/cluster.x-k8s.io/v1beta2/namespaces/capi/clusters" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, `{"kind":"ClusterList","apiVersion":"cluster.x-k8s.io/v1beta2","metadata":{},"items":[`+
			`{"metadata":{"name":"prod-eu1","namespace":"capi"},"spec":{"controlPlaneRef":{"apiGroup":"controlplane.cluster.x-k8s.io","kind":"KubeadmControlPlane","name":"prod-eu1"}}},`+
			`{"metadata":{"name":"prod-us1","namespace":"capi"},"spec":{"controlPlaneRef":{"apiGroup":"controlplane.cluster.x-k8s.io","kind":"KubeadmControlPlane","name":"prod-us1"}}}]}`)
	}))
	defer api.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	body := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: mgmt\n  cluster: {server: %q}\nusers:\n- name: me\n  user: {}\n"+
		"contexts:\n- name: mgmt\n  context: {cluster: mgmt, user: me, namespace: capi}\ncurrent-context: mgmt\n", api.URL)
	if err := os.WriteFile(kubeconfig, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r := kubectl(t, []string{"KUBECONFIG=" + kubeconfig}, "__complete", "cp-rollout", "upgrade", "")
	if r.stdout != "prod-eu1\nprod-us1\n:4\n" {
		t.Fatalf("kubectl __complete cp-rollout upgrade '': stdout %q, want the two clusters and :4\n%s", r.stdout, r.log)
	}
}

// A version left in the environment does not start an upgrade: the command
// stops, naming the variable, before it reaches for any cluster.
func TestVersionFromEnvironmentRefusedBeforeAnyCluster(t *testing.T) {
	// A management cluster that refuses every connection: a command that
	// reaches for it fails, but not with exit 2.
	env := []string{kubeconfigFor(t, "https://127.0.0.1:1")}
	if r := kubectl(t, env, "cp-rollout", "upgrade", "demo", "--version", "v1.36.3"); r.code == 0 || r.code == 2 || !strings.Contains(r.log, "127.0.0.1:1") {
		t.Fatalf("with --version: exit %d, stderr %q; want a failure to connect", r.code, r.log)
	}
	r := kubectl(t, append(env, "CP_ROLLOUT_VERSION=v1.36.3"), "cp-rollout", "upgrade", "demo")
	if r.code != 2 || !strings.Contains(r.log, "environment variable CP_ROLLOUT_VERSION=v1.36.3 is not allowed") || strings.Contains(r.log, "127.0.0.1") {
		t.Fatalf("exit %d, stderr %q: want exit 2 naming CP_ROLLOUT_VERSION, without contacting the cluster", r.code, r.log)
	}
}
