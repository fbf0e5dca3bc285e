package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// isolate points the config file lookup at an empty directory, clears every
// CP_ROLLOUT_ variable and points KUBECONFIG at a management cluster where
// nothing listens, so the developer's own setup cannot leak into a test and a
// test that dials fails at once instead of reaching a real cluster.
func isolate(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", dir)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(unreachableKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, envPrefix+"_") {
			t.Setenv(name, "")
			os.Unsetenv(name)
		}
	}
	return filepath.Join(dir, "cp-rollout", "config.yaml")
}

const unreachableKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: nobody
  user: {token: none}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: nobody}
current-context: nowhere
`

// isolateWith isolates the test and then gives it this config file body (none
// when empty) and these environment variables.
func isolateWith(t *testing.T, config string, env map[string]string) {
	t.Helper()
	path := isolate(t)
	if config != "" {
		writeConfig(t, path, config)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

func writeConfig(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

type result struct {
	code     int
	err      error
	out, log string
	opts     *RootOptions
}

func run(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd, opts := newRootCmd(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return result{code: exitcode.Of(err), err: err, out: out.String(), log: errOut.String(), opts: opts}
}

func TestBadInputIsUsageError(t *testing.T) {
	isolate(t)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown verb", []string{"upgarde"}, `unknown command "upgarde"`},
		{"unknown verb close to one", []string{"versoin"}, `did you mean "version"?`},
		{"unknown flag", []string{"version", "--bogus"}, "unknown flag: --bogus"},
		{"unknown shorthand", []string{"-Z"}, "unknown shorthand flag: 'Z'"},
		{"bad output", []string{"version", "-o", "wide"}, `--output must be one of text, json, yaml, jsonpath=, go-template=, not "wide"`},
		{"extra argument", []string{"version", "extra"}, "version takes no arguments; got 1"},
		{"bad shell", []string{"completion", "tcsh"}, `completion needs one argument, the shell: bash, zsh, fish, powershell; got "tcsh"`},
		{"no shell", []string{"completion"}, "completion needs one argument, the shell: bash, zsh, fish, powershell; got 0"},
		{"flag without value", []string{"version", "--output"}, "flag needs an argument"},
		{"upgrade without cluster", []string{"upgrade", "--version", "v1.36.3"}, "needs a CLUSTER name, or -l SELECTOR / -A"},
		{"upgrade with two clusters", []string{"upgrade", "a", "b", "--version", "v1.36.3"}, "upgrade takes at most one argument, the Cluster's name (or -l/-A instead); got 2"},
		{"cluster and selector", []string{"upgrade", "demo", "-l", "env=sim", "--version", "v1.36.3"}, "a CLUSTER name or -l/-A, not both"},
		{"cluster and all namespaces", []string{"status", "demo", "-A"}, "a CLUSTER name or -l/-A, not both"},
		{"bad selector", []string{"status", "-l", "env in (a"}, "-l env in (a:"},
		{"parallel with a cluster", []string{"upgrade", "demo", "--version", "v1.36.3", "--parallel", "2"}, "--parallel and --max-failures need -l or -A"},
		{"parallel zero", []string{"upgrade", "-A", "--version", "v1.36.3", "--parallel", "0"}, "--parallel must be at least 1"},
		{"max failures negative", []string{"scale", "-l", "env=sim", "--replicas", "3", "--max-failures", "-1"}, "--max-failures must not be negative"},
		{"handback without cluster", []string{"handback"}, "handback needs a CLUSTER name"},
		{"plan without cluster", []string{"plan", "--version", "v1.36.3"}, "plan needs a CLUSTER name"},
		{"upgrade without version", []string{"upgrade", "demo"}, "--version is required"},
		{"version without v", []string{"upgrade", "demo", "--version", "1.36.3"}, "--version 1.36.3 is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example v1.36.3"},
		{"version not semver", []string{"upgrade", "demo", "--version", "v1.36"}, "--version v1.36 is not a Kubernetes version"},
		{"version garbage", []string{"upgrade", "demo", "--version", "vlatest"}, "--version vlatest is not a Kubernetes version"},
		{"via garbage", []string{"plan", "demo", "--version", "v1.36.3", "--via", "1.35"}, "--via 1.35 is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example v1.35.0"},
		{"kcp version garbage", []string{"restart", "demo", "--kcp-version", "main"}, "--kcp-version main is not a Cluster API version"},
		{"fleet flags on replace", []string{"replace", "demo", "m", "-A"}, "unknown shorthand flag: 'A'"},
		{"wait flags on plan", []string{"plan", "demo", "--rollout", "--no-wait"}, "unknown flag: --no-wait"},
		{"surge 2", []string{"upgrade", "demo", "--version", "v1.36.3", "--max-surge", "2"}, "--max-surge must be 0 or 1"},
		{"surge negative", []string{"upgrade", "demo", "--version", "v1.36.3", "--max-surge", "-2"}, "--max-surge must be 0 or 1"},
		{"negative timeout", []string{"upgrade", "demo", "--version", "v1.36.3", "--health-timeout", "-1s"}, "--health-timeout must not be negative"},
		{"no grace", []string{"upgrade", "demo", "--version", "v1.36.3", "--unhealthy-grace", "0s"}, "--unhealthy-grace must be positive"},
		{"no topology wait", []string{"upgrade", "demo", "--version", "v1.36.3", "--topology-timeout", "0s"}, "--topology-timeout must be positive"},
		{"bad duration", []string{"upgrade", "demo", "--version", "v1.36.3", "--settle", "soon"}, "--settle soon: not a duration: want a number with a unit, such as 90s, 20m or 1h30m"},
		// A value a flag cannot take is said in the tool's words, not the
		// Go parser's (strconv.ParseInt).
		{"replicas not a number", []string{"scale", "demo", "--replicas", "abc"}, "--replicas abc: not a whole number"},
		{"replicas out of range", []string{"scale", "demo", "--replicas", "99999999999"}, "--replicas 99999999999: out of range"},
		{"duration without a unit", []string{"upgrade", "demo", "--version", "v1.36.3", "--provision-timeout", "20"}, "--provision-timeout 20: not a duration"},
		// kubectl's --dry-run=server: the tool's dry run is client-side.
		{"server dry run", []string{"upgrade", "demo", "--version", "v1.36.3", "--dry-run=server"}, "--dry-run server: this tool has no server-side dry run of a rollout"},
		{"unknown dry run", []string{"restart", "demo", "--dry-run=all"}, "--dry-run all: want client (or --dry-run alone) to print the plan, or none"},
		// Flags that would be ignored are refused.
		{"via with replicas", []string{"plan", "demo", "--replicas", "3", "--via", "v1.35.2"}, "--via needs --version"},
		{"via with rollout", []string{"plan", "demo", "--rollout", "--via", "v1.35.2"}, "--via needs --version"},
		// A fleet run's flags, checked before any cluster is read.
		{"stages on one cluster", []string{"upgrade", "demo", "--version", "v1.36.3", "--stages", "ring=0;ring=1"}, "--stages: only with -l or -A"},
		{"resume on one cluster", []string{"upgrade", "demo", "--version", "v1.36.3", "--resume", "r1"}, "--resume: only with -l or -A"},
		{"run and resume", []string{"upgrade", "-A", "--yes", "--version", "v1.36.3", "--run", "a", "--resume", "b"}, "--run names a new fleet run and --resume continues one"},
		{"empty stage", []string{"upgrade", "-A", "--yes", "--version", "v1.36.3", "--stages", "ring=0;;ring=2"}, "--stages: stage 2 is empty"},
		{"bad stage", []string{"plan", "-A", "--version", "v1.36.3", "--stages", "ring=0;ring in (1"}, "--stages: stage 2 \"ring in (1\""},
		{"soak without stages", []string{"upgrade", "-A", "--yes", "--version", "v1.36.3", "--stage-soak", "5m"}, "--stage-soak goes with --stages"},
		{"run name", []string{"upgrade", "-A", "--yes", "--version", "v1.36.3", "--run", "Nightly_1"}, "run name \"Nightly_1\""},
		{"workers timeout without waiting", []string{"upgrade", "demo", "--version", "v1.36.3", "--workers-timeout", "1h"}, "--workers-timeout goes with --wait-workers"},
		{"replace-unhealthy with a restart plan", []string{"plan", "demo", "--restart", "--replace-unhealthy"}, "--replace-unhealthy goes with --version or --replicas"},
		{"replace-unhealthy with a replace plan", []string{"plan", "demo", "--replace", "m", "--replace-unhealthy"}, "--replace-unhealthy goes with --version or --replicas"},
		// The chain of versions needs no cluster to be checked.
		{"via on the target's minor", []string{"upgrade", "demo", "--version", "v1.36.3", "--via", "v1.36.1"}, "--via v1.36.1 and --version v1.36.3 are both v1.36.x"},
		{"two vias on one minor", []string{"plan", "demo", "--version", "v1.36.3", "--via", "v1.35.1,v1.35.2"}, "--via v1.35.1 and --via v1.35.2 are both v1.35.x"},
		{"target skips past the via", []string{"upgrade", "demo", "--version", "v1.37.0", "--via", "v1.35.2"}, "v1.37.0 skips a minor version: from v1.35.2, pass through a v1.36.x first"},
		{"certificates not whole days", []string{"rollout", "demo", "--certificates-expiring-within", "180h"}, "--certificates-expiring-within 180h is not whole days: use 7d or 8d (KCP's certificatesExpiryDays is whole days)"},
		{"certificates under a week", []string{"rollout", "demo", "--certificates-expiring-within", "36h"}, "at least 7 days, as KCP's spec.rollout.before.certificatesExpiryDays: use 7d or more"},
		{"kubeconfig cluster for the cluster argument", []string{"status", "demo", "--cluster", "demo"}, "--cluster demo: the kubeconfig has no cluster entry"},
		{"template without version", []string{"plan", "demo", "--infrastructure-template", "demo-v2"}, "--infrastructure-template needs --version"},
		{"template with via", []string{"upgrade", "demo", "--version", "v1.36.3", "--via", "v1.35.2", "--infrastructure-template", "demo-v2"}, "cannot go with --via"},
		{"template not a name", []string{"upgrade", "demo", "--version", "v1.36.3", "--infrastructure-template", "Demo_V2"}, "is not an object name"},
		{"plan with two targets", []string{"plan", "demo", "--version", "v1.36.3", "--replicas", "3"}, "not several"},
		{"plan without target", []string{"plan", "demo"}, "needs one of"},
		{"scale without replicas", []string{"scale", "demo"}, "--replicas is required"},
		{"scale to zero", []string{"scale", "demo", "--replicas", "0"}, "at least 1"},
		{"scale negative", []string{"scale", "demo", "--replicas", "-1"}, "at least 1"},
		{"replace without machine", []string{"replace", "demo"}, "two arguments"},
		{"status bad output", []string{"status", "demo", "-o", "xml"}, "--output must be one of"},
		{"check without version", []string{"check", "demo"}, "--version is required"},
		{"check bad version", []string{"check", "demo", "--version", "1.36"}, "--version 1.36 is not a Kubernetes version"},
		{"check unknown skip", []string{"check", "demo", "--version", "v1.36.3", "--skip-check", "etcdd"}, `--skip-check "etcdd" is not a check; the checks are removed-apis, version-skew`},
		{"upgrade unknown skip", []string{"upgrade", "demo", "--version", "v1.36.3", "--skip-check", "all"}, `--skip-check "all" is not a check`},
		{"skip without upgrade", []string{"plan", "demo", "--replicas", "3", "--skip-check", "etcd"}, "--skip-check needs --version"},
		{"check bad output", []string{"check", "demo", "--version", "v1.36.3", "-o", "xml"}, "--output must be one of"},
		{"upgrade output yaml", []string{"upgrade", "demo", "--version", "v1.36.3", "-o", "yaml"}, "--output must be one of text, json"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tc.args...)
			if r.code != exitcode.Usage {
				t.Fatalf("exit code %d, want %d (err: %v)", r.code, exitcode.Usage, r.err)
			}
			if msg := r.err.Error(); !strings.Contains(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q: want one line containing %q", msg, tc.want)
			}
			if r.out != "" {
				t.Fatalf("bad input printed to stdout: %q", r.out)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	isolate(t)
	r := run(t, "version", "-o", "json")
	if r.err != nil {
		t.Fatal(r.err)
	}
	var info map[string]string
	if err := json.Unmarshal([]byte(r.out), &info); err != nil {
		t.Fatalf("version -o json is not JSON: %v\n%s", err, r.out)
	}
	for _, k := range []string{"version", "commit", "buildDate", "goVersion", "platform", "provenKCP"} {
		if info[k] == "" {
			t.Errorf("version -o json lacks %q: %s", k, r.out)
		}
	}
	if r := run(t, "version"); !strings.HasPrefix(r.out, "kubectl-cp_rollout ") {
		t.Fatalf("version text: %q", r.out)
	}
}

// TestVersionNamesTheProvenKCPRange: version says which KCP controllers the
// build is proven with, from the first to the last of ProvenKCPMinors, in
// text on a line of its own (the first stays what scripts match) and in
// JSON.
func TestVersionNamesTheProvenKCPRange(t *testing.T) {
	isolate(t)
	first, last := rollout.ProvenKCPMinors[0], rollout.ProvenKCPMinors[len(rollout.ProvenKCPMinors)-1]
	want := fmt.Sprintf("v%d.%d.x–v%d.%d.x", first.Major, first.Minor, last.Major, last.Minor)

	r := run(t, "version")
	lines := strings.Split(strings.TrimSuffix(r.out, "\n"), "\n")
	if r.err != nil || len(lines) != 2 || !strings.HasPrefix(lines[0], "kubectl-cp_rollout ") ||
		lines[1] != "proven with Cluster API (KubeadmControlPlane controller) "+want {
		t.Errorf("version text (%v):\n%s\nwant a second line naming %s", r.err, r.out, want)
	}

	r = run(t, "version", "-o", "json")
	var info struct{ ProvenKCP string }
	if err := json.Unmarshal([]byte(r.out), &info); err != nil || info.ProvenKCP != want {
		t.Errorf("version -o json (%v): provenKCP %q, want %q\n%s", err, info.ProvenKCP, want, r.out)
	}
}

func TestCompletionScripts(t *testing.T) {
	isolate(t)
	for shell, marker := range map[string]string{"bash": "__kubectl-cp_rollout_", "zsh": "#compdef", "fish": "complete -c kubectl-cp_rollout", "powershell": "Register-ArgumentCompleter -CommandName 'kubectl-cp_rollout'"} {
		r := run(t, "completion", shell)
		if r.err != nil || !strings.Contains(r.out, marker) {
			t.Errorf("completion %s: err %v, output lacks %q", shell, r.err, marker)
		}
	}
}

// Precedence is flag > environment > config file, for the shared kubectl flags
// and for each verb's own flags alike.
func TestConfigPrecedence(t *testing.T) {
	cases := []struct {
		name        string
		file, env   string
		args        []string
		wantContext string
		wantJSON    bool
	}{
		{name: "defaults", wantContext: ""},
		{name: "file", file: "context: from-file\noutput: json\n", wantContext: "from-file", wantJSON: true},
		{name: "env beats file", file: "context: from-file\n", env: "from-env", wantContext: "from-env"},
		{name: "flag beats env and file", file: "context: from-file\n", env: "from-env",
			args: []string{"--context", "from-flag"}, wantContext: "from-flag"},
		{name: "flag beats file for a verb flag", file: "output: json\n", args: []string{"-o", "text"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := isolate(t)
			if tc.file != "" {
				writeConfig(t, path, tc.file)
			}
			if tc.env != "" {
				t.Setenv("CP_ROLLOUT_CONTEXT", tc.env)
			}
			r := run(t, append([]string{"version"}, tc.args...)...)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if got := r.opts.ConfigFlags.overrides.CurrentContext; got != tc.wantContext {
				t.Errorf("context %q, want %q", got, tc.wantContext)
			}
			if got := json.Valid([]byte(r.out)); got != tc.wantJSON {
				t.Errorf("JSON output %v, want %v: %q", got, tc.wantJSON, r.out)
			}
		})
	}
}

func TestConfigFileChoice(t *testing.T) {
	isolate(t)
	other := filepath.Join(t.TempDir(), "other.yaml")
	writeConfig(t, other, "output: json\n")

	if r := run(t, "--config", other, "version"); r.err != nil || !json.Valid([]byte(r.out)) {
		t.Errorf("--config FILE not used: %v %q", r.err, r.out)
	}
	t.Setenv("CP_ROLLOUT_CONFIG", other)
	if r := run(t, "version"); r.err != nil || !json.Valid([]byte(r.out)) {
		t.Errorf("CP_ROLLOUT_CONFIG not used: %v %q", r.err, r.out)
	}
}

func TestBadConfigIsUsageError(t *testing.T) {
	cases := []struct {
		name, body string
		env        map[string]string
		want       []string
	}{
		{name: "malformed yaml", body: "context: a\n\toutput: json\n", want: []string{"config.yaml", "line 2", "tab character"}},
		{name: "bad indentation", body: "context: a\n  output: json\n", want: []string{"config.yaml", "line 2"}},
		{name: "unknown key", body: "context: a\ncontxt: b\n", want: []string{"config.yaml", "line 2", `unknown key "contxt"`}},
		{name: "not a mapping", body: "- context\n", want: []string{"config.yaml", "line 1", "mapping"}},
		{name: "bad value in file", body: "disable-compression: perhaps\n", want: []string{"config file", "disable-compression"}},
		{name: "bad value in env", env: map[string]string{"CP_ROLLOUT_DISABLE_COMPRESSION": "perhaps"},
			want: []string{"environment variable CP_ROLLOUT_DISABLE_COMPRESSION"}},
		{name: "missing explicit file", env: map[string]string{"CP_ROLLOUT_CONFIG": "/nonexistent/cp.yaml"},
			want: []string{"/nonexistent/cp.yaml", "no such file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			isolateWith(t, tc.body, tc.env)
			refused(t, run(t, "version"), exitcode.Usage, tc.want...)
		})
	}
}

// refused checks that r exited with code and an error of one line that
// says each of says.
func refused(t *testing.T, r result, code int, says ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d (err: %v)", r.code, code, r.err)
	}
	msg := r.err.Error()
	for _, s := range says {
		if !strings.Contains(msg, s) {
			t.Errorf("error %q lacks %q", msg, s)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error is not one line: %q", msg)
	}
}

// Without a kubeconfig the tool cannot reach the management cluster: exit 7,
// naming how to give one. A kubeconfig that is there but wrong is bad input.
func TestKubeconfigProblems(t *testing.T) {
	isolate(t)
	missing := filepath.Join(t.TempDir(), "missing")
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  string // KUBECONFIG
		args []string
		code int
		says []string
	}{
		{"none in KUBECONFIG", missing, []string{"status", "demo"}, exitcode.Unreachable,
			[]string{"no kubeconfig: KUBECONFIG names " + missing + ", which does not exist; point --kubeconfig or KUBECONFIG at a management cluster's kubeconfig (for example: export KUBECONFIG=~/.kube/config)"}},
		{"none in several", missing + string(os.PathListSeparator) + missing + "2", []string{"status", "demo"}, exitcode.Unreachable,
			[]string{"KUBECONFIG names " + missing + ", " + missing + "2, none of which holds a cluster"}},
		{"an empty one", empty, []string{"status", "demo"}, exitcode.Unreachable, []string{"KUBECONFIG names " + empty + ", which holds no cluster"}},
		{"none, over a fleet", missing, []string{"status", "-l", "env=prod"}, exitcode.Unreachable, []string{"--kubeconfig", "KUBECONFIG"}},
		{"none, for a change", missing, []string{"upgrade", "demo", "--version", "v1.36.3"}, exitcode.Unreachable, []string{"--kubeconfig", "KUBECONFIG"}},
		{"--kubeconfig missing", "", []string{"status", "demo", "--kubeconfig", missing}, exitcode.Unreachable, []string{"no kubeconfig: --kubeconfig " + missing + " does not exist; point --kubeconfig"}},
		{"no such context", "", []string{"status", "demo", "--context", "nope"}, exitcode.Usage, []string{`context "nope"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("KUBECONFIG", tc.env)
			}
			r := run(t, tc.args...)
			refused(t, r, tc.code, tc.says...)
			if msg := r.err.Error(); strings.Contains(msg, "KUBERNETES_MASTER") {
				t.Errorf("error %q sends users to client-go's KUBERNETES_MASTER", msg)
			}
		})
	}
}

// Run tells main how the command showed its output and which cluster it
// acted on, so a failure can end -o json output with one object.
func TestRunResult(t *testing.T) {
	isolate(t)
	streams := genericiooptions.IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	for _, tc := range []struct {
		args []string
		want Result
	}{
		{[]string{"upgrade", "demo", "--version", "v1.36.3", "-o", "json"}, Result{JSON: true, Cluster: "demo", Namespace: "default"}},
		{[]string{"plan", "demo", "--version", "v1.36.3", "-n", "ops"}, Result{Cluster: "demo", Namespace: "ops"}},
		{[]string{"upgrade", "demo", "-o", "json"}, Result{JSON: true, Cluster: "demo"}}, // refused before the namespace was resolved
		{[]string{"status", "-A", "-o", "json"}, Result{JSON: true}},
		{[]string{"status", "-A", "-o", "yaml"}, Result{}},
		{[]string{"status", "-A", "-o", "jsonpath={.cluster}"}, Result{}},
		{[]string{"handback", "demo", "-o", "json"}, Result{JSON: true, Cluster: "demo", Namespace: "default"}},
	} {
		res, err := Run(context.Background(), streams, tc.args)
		if err == nil {
			t.Fatalf("%v: no error", tc.args)
		}
		// The verb's own --help is what a usage hint names.
		tc.want.Command = displayName + " " + tc.args[0]
		if res != tc.want {
			t.Errorf("%v: %+v, want %+v (err: %v)", tc.args, res, tc.want, err)
		}
	}
}
