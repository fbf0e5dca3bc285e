package cli

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/internal/sim/manifests"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// These tests stop each verb at its runF seam: they show what a command line,
// the environment and the config file resolve to, and never reach a cluster.

// parse runs args through the whole command tree with the verb that newCmd
// builds swapped in, its Run replaced by a capture. The options are nil when
// the command failed before it would have run.
func parse[O any](t *testing.T, newCmd func(*RootOptions, func(O) error) *cobra.Command, args ...string) (O, result) {
	t.Helper()
	var out, errOut bytes.Buffer
	root, opts := newRootCmd(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	var got O
	verb := newCmd(opts, func(o O) error { got = o; return nil })
	for _, c := range root.Commands() {
		if c.Name() == verb.Name() {
			root.RemoveCommand(c)
		}
	}
	root.AddCommand(verb)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return got, result{code: exitcode.Of(err), err: err, out: out.String(), log: errOut.String(), opts: opts}
}

// resolved is what a request verb's options say, in a form that compares and
// prints by value.
type resolved struct {
	Cluster, Namespace, EtcdEndpoint, KCPVersion string
	Operation, Version, Replace                  string
	Replicas                                     string // "" when not asked for
	CertificatesExpiryDays                       int32
	MaxSurge                                     int32
	Output                                       string
	OnFailure                                    string // the change verbs'
	Timeout                                      time.Duration
	Timeouts                                     rollout.Timeouts
	DryRun, ExitCode                             bool
}

func resolvedRequest(r result, o *requestOptions) resolved {
	t := o.request
	v := resolved{
		Cluster: o.conn.Cluster, Namespace: r.opts.ConfigFlags.Namespace(), EtcdEndpoint: o.conn.EtcdEndpoint, KCPVersion: o.conn.KCPVersion,
		Operation: string(t.Operation), Version: t.Version, Replace: t.Replace,
		MaxSurge: t.MaxSurge, Output: o.Output, CertificatesExpiryDays: t.CertificatesExpiryDays,
	}
	if t.Replicas != nil {
		v.Replicas = fmt.Sprint(*t.Replicas)
	}
	return v
}

// requestDefaults is what a request verb resolves to with nothing but its
// cluster and operation.
func requestDefaults(operation string) resolved {
	return resolved{Cluster: "demo", Operation: operation, MaxSurge: -1, Output: "text", Timeouts: rollout.DefaultTimeouts}
}

// optionsCase is a command line, environment and config file, and how what
// they resolve to differs from the verb's base.
type optionsCase struct {
	name   string
	args   []string
	env    map[string]string
	config string
	want   func(*resolved)
}

// checkOptions runs each case through verb and compares what its options
// say, by way of view, with base as the case changes it.
func checkOptions[O any](t *testing.T, verb string, newCmd func(*RootOptions, func(O) error) *cobra.Command,
	view func(result, O) resolved, base resolved, cases []optionsCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			isolateWith(t, tc.config, tc.env)
			o, r := parse(t, newCmd, append([]string{verb}, tc.args...)...)
			if r.err != nil {
				t.Fatalf("did not reach Run: %v", r.err)
			}
			want := base
			if tc.want != nil {
				tc.want(&want)
			}
			if got := view(r, o); got != want {
				t.Errorf("resolved\n %+v\nwant\n %+v", got, want)
			}
		})
	}
}

func viewChange(r result, c *changeOptions) resolved {
	v := resolvedRequest(r, &c.req)
	v.Timeout, v.Timeouts, v.DryRun, v.OnFailure = c.wait.Timeout, c.wait.Timeouts, c.DryRun, c.OnFailure
	return v
}

// allRunFlags sets every flag that upgrade, scale and replace share.
var allRunFlags = []string{
	"--max-surge", "0", "--timeout", "1h", "--provision-timeout", "5m", "--health-timeout", "2m",
	"--delete-timeout", "3m", "--settle", "10s", "--unhealthy-grace", "4m", "--handback-timeout", "30s", "-o", "json", "--dry-run",
	"--etcd-endpoint", "https://{{.NodeIP}}:2379", "--kcp-version", "v1.14.2", "--on-failure", "handback",
}

func withAllRunFlags(v *resolved) {
	v.MaxSurge, v.Output, v.DryRun, v.OnFailure = 0, "json", true, "handback"
	v.Timeout = time.Hour
	v.Timeouts = rollout.Timeouts{Provision: 5 * time.Minute, Health: 2 * time.Minute, Delete: 3 * time.Minute, Settle: 10 * time.Second, Recovery: 4 * time.Minute, Handback: 30 * time.Second, Gates: rollout.DefaultTimeouts.Gates,
		Pause: rollout.DefaultTimeouts.Pause, Topology: rollout.DefaultTimeouts.Topology}
	v.EtcdEndpoint, v.KCPVersion = "https://{{.NodeIP}}:2379", "v1.14.2"
}

func TestUpgradeOptions(t *testing.T) {
	base := requestDefaults("upgrade")
	base.Version, base.OnFailure = "v1.36.3", "stay"
	checkOptions(t, "upgrade", NewCmdUpgrade, func(r result, o *UpgradeOptions) resolved { return viewChange(r, &o.change) }, base, []optionsCase{
		{name: "defaults", args: []string{"demo", "--version", "v1.36.3"}},
		{name: "every flag", args: append([]string{"demo", "--version", "v1.36.3"}, allRunFlags...), want: withAllRunFlags},
		{name: "namespace flag", args: []string{"demo", "--version", "v1.36.3", "-n", "capi"},
			want: func(v *resolved) { v.Namespace = "capi" }},
		{name: "no wait after the hand-back", args: []string{"demo", "--version", "v1.36.3", "--no-wait"},
			want: func(v *resolved) { v.Timeouts.Handback = 0 }},
		// A BeforeClusterUpgrade hook may hold the topology controller's copy
		// of the version for longer than the default.
		{name: "topology timeout", args: []string{"demo", "--version", "v1.36.3", "--topology-timeout", "15m"},
			want: func(v *resolved) { v.Timeouts.Topology = 15 * time.Minute }},
		{name: "environment", args: []string{"demo", "--version", "v1.36.3"},
			env:  map[string]string{"CP_ROLLOUT_HEALTH_TIMEOUT": "1m", "CP_ROLLOUT_OUTPUT": "json"},
			want: func(v *resolved) { v.Timeouts.Health, v.Output = time.Minute, "json" }},
		// An empty variable sets nothing, so it is no reason to refuse.
		{name: "empty variable", args: []string{"demo", "--version", "v1.36.3"}, env: map[string]string{"CP_ROLLOUT_VERSION": ""}},
		{name: "config file", args: []string{"demo", "--version", "v1.36.3"},
			config: "health-timeout: 1m\nsettle: 30s\noutput: json\n",
			want: func(v *resolved) {
				v.Timeouts.Health, v.Timeouts.Settle, v.Output = time.Minute, 30*time.Second, "json"
			}},
		{name: "flag beats environment beats file", args: []string{"demo", "--version", "v1.36.3", "--settle", "3s"},
			env: map[string]string{"CP_ROLLOUT_SETTLE": "2s", "CP_ROLLOUT_DELETE_TIMEOUT": "7m"}, config: "settle: 1s\ndelete-timeout: 9m\nprovision-timeout: 8m\n",
			want: func(v *resolved) {
				v.Timeouts.Settle, v.Timeouts.Delete, v.Timeouts.Provision = 3*time.Second, 7*time.Minute, 8*time.Minute
			}},
		// A dry run only plans, and a plan never looks at the KCP controller.
		{name: "dry run may name any KCP version", args: []string{"demo", "--version", "v1.36.3", "--dry-run", "--kcp-version", "v1.13.0"},
			want: func(v *resolved) { v.DryRun, v.KCPVersion = true, "v1.13.0" }},
		// kubectl's values of --dry-run: the tool's is client-side.
		{name: "dry run client", args: []string{"demo", "--version", "v1.36.3", "--dry-run=client"},
			want: func(v *resolved) { v.DryRun = true }},
		{name: "dry run true, as when it was a bool", args: []string{"demo", "--version", "v1.36.3", "--dry-run=true"},
			want: func(v *resolved) { v.DryRun = true }},
		{name: "dry run none", args: []string{"demo", "--version", "v1.36.3", "--dry-run=none"}},
		{name: "dry run false", args: []string{"demo", "--version", "v1.36.3", "--dry-run=false"}},
		// 0 lifts a wait's limit, as --timeout 0 does.
		{name: "no wait limits", args: []string{"demo", "--version", "v1.36.3", "--provision-timeout", "0", "--health-timeout", "0", "--delete-timeout", "0"},
			want: func(v *resolved) { v.Timeouts.Provision, v.Timeouts.Health, v.Timeouts.Delete = 0, 0, 0 }},
		// A site's --workers-timeout waits for the runs that ask to wait for
		// the workers: the others do not use it, and it is no reason to
		// refuse them (typed, it is: TestBadInputIsUsageError).
		{name: "workers timeout from the config file", args: []string{"demo", "--version", "v1.36.3"}, config: "workers-timeout: 45m\n"},
	})
}

func TestScaleOptions(t *testing.T) {
	base := requestDefaults("scale")
	base.Replicas, base.OnFailure = "3", "stay"
	checkOptions(t, "scale", NewCmdScale, func(r result, o *ScaleOptions) resolved { return viewChange(r, &o.change) }, base, []optionsCase{
		{name: "replicas", args: []string{"demo", "--replicas", "3"}},
		{name: "every flag", args: append([]string{"demo", "--replicas", "3"}, allRunFlags...), want: withAllRunFlags},
		{name: "one replica surging", args: []string{"demo", "--replicas", "1", "--max-surge", "1"},
			want: func(v *resolved) { v.Replicas, v.MaxSurge = "1", 1 }},
		// Whether 2 is allowed depends on the cluster's etcd.
		{name: "even count left to the cluster", args: []string{"demo", "--replicas", "2", "--max-surge", "0"},
			want: func(v *resolved) { v.Replicas, v.MaxSurge = "2", 0 }},
	})
}

func TestReplaceOptions(t *testing.T) {
	base := requestDefaults("replace")
	base.Replace, base.OnFailure = "demo-cp-x2k9", "stay"
	checkOptions(t, "replace", NewCmdReplace, func(r result, o *ReplaceOptions) resolved { return viewChange(r, &o.change) }, base, []optionsCase{
		{name: "machine", args: []string{"demo", "demo-cp-x2k9"}},
		{name: "every flag", args: append([]string{"demo", "demo-cp-x2k9"}, allRunFlags...), want: withAllRunFlags},
		{name: "etcd endpoint from config file", args: []string{"demo", "demo-cp-x2k9", "-n", "capi"},
			config: "etcd-endpoint: https://{{.NodeIP}}:2379\n",
			want:   func(v *resolved) { v.Namespace, v.EtcdEndpoint = "capi", "https://{{.NodeIP}}:2379" }},
	})
}

func TestRolloutOptions(t *testing.T) {
	base := requestDefaults("rollout")
	base.OnFailure = "stay"
	checkOptions(t, "rollout", NewCmdRollout, func(r result, o *RolloutOptions) resolved { return viewChange(r, &o.change) }, base, []optionsCase{
		{name: "spec", args: []string{"demo"}},
		{name: "certificates in days", args: []string{"demo", "--certificates-expiring-within", "30d"},
			want: func(v *resolved) { v.CertificatesExpiryDays = 30 }},
		{name: "certificates as a duration", args: []string{"demo", "--certificates-expiring-within", "336h"},
			want: func(v *resolved) { v.CertificatesExpiryDays = 14 }},
		{name: "every flag", args: append([]string{"demo"}, allRunFlags...), want: withAllRunFlags},
	})
}

func TestRestartOptions(t *testing.T) {
	base := requestDefaults("restart")
	base.OnFailure = "stay"
	checkOptions(t, "restart", NewCmdRestart, func(r result, o *RestartOptions) resolved { return viewChange(r, &o.change) }, base, []optionsCase{
		{name: "defaults", args: []string{"demo"}},
		{name: "every flag", args: append([]string{"demo"}, allRunFlags...), want: withAllRunFlags},
	})
}

func TestPauseOptions(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		reason string
	}{
		{[]string{"demo"}, ""},
		{[]string{"demo", "--reason", "CHG-1234: audit flags"}, "CHG-1234: audit flags"},
	} {
		isolate(t)
		o, r := parse(t, NewCmdPause, append([]string{"pause"}, tc.args...)...)
		if o == nil {
			t.Fatalf("%v: did not reach Run: %v", tc.args, r.err)
		}
		if o.conn.Cluster != "demo" || o.Reason != tc.reason || o.conn.Management != r.opts.ConfigFlags {
			t.Errorf("%v: cluster %q, reason %q, management from the root's flags %v", tc.args, o.conn.Cluster, o.Reason, o.conn.Management == r.opts.ConfigFlags)
		}
	}
}

func TestParseDays(t *testing.T) {
	for _, tc := range []struct {
		in    string
		least int32
		days  int32
		says  string
	}{
		{"30d", 1, 30, ""}, {"1d", 1, 1, ""}, {"720h", 1, 30, ""}, {"24h0m0s", 1, 1, ""}, {"7d", 7, 7, ""},
		{"0d", 1, 0, "must be positive"}, {"-3d", 1, 0, "must be positive"}, {"-24h", 1, 0, "must be positive"},
		{"36h", 1, 0, "--certificates-expiring-within 36h is not whole days: use 1d or 2d (KCP's certificatesExpiryDays is whole days)"},
		{"1.5d", 1, 0, "1.5d is not whole days: use 1d or 2d"},
		{"180h", 7, 0, "180h is not whole days: use 7d or 8d"},
		// Under the least, the whole days either side would be refused
		// too: the least is named instead.
		{"36h", 7, 0, "--certificates-expiring-within 36h: at least 7 days, as KCP's spec.rollout.before.certificatesExpiryDays: use 7d or more"},
		{"6d", 7, 0, "at least 7 days"},
		{"xd", 1, 0, "not a number of days"}, {"soon", 1, 0, "not a duration"}, {"30", 1, 0, "not a duration"},
	} {
		days, err := parseDays("certificates-expiring-within", tc.in, tc.least)
		switch {
		case tc.says == "" && (err != nil || days != tc.days):
			t.Errorf("%q: %d, %v; want %d", tc.in, days, err, tc.days)
		case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says) || exitcode.Of(err) != exitcode.Usage):
			t.Errorf("%q: %v; want a usage error saying %q", tc.in, err, tc.says)
		}
	}
}

func TestPlanOptions(t *testing.T) {
	base := requestDefaults("upgrade")
	base.Version = "v1.36.3"
	base.Timeouts = rollout.Timeouts{} // a plan carries no wait limits
	view := func(r result, o *PlanOptions) resolved {
		v := resolvedRequest(r, &o.req)
		v.ExitCode = o.ExitCode
		return v
	}
	checkOptions(t, "plan", NewCmdPlan, view, base, []optionsCase{
		{name: "upgrade", args: []string{"demo", "--version", "v1.36.3"}},
		{name: "scale", args: []string{"demo", "--replicas", "5", "-o", "json"},
			want: func(v *resolved) { v.Operation, v.Version, v.Replicas, v.Output = "scale", "", "5", "json" }},
		{name: "replace", args: []string{"demo", "--replace", "demo-cp-x2k9", "--max-surge", "0"},
			want: func(v *resolved) { v.Operation, v.Version, v.Replace, v.MaxSurge = "replace", "", "demo-cp-x2k9", 0 }},
		{name: "rollout", args: []string{"demo", "--rollout"},
			want: func(v *resolved) { v.Operation, v.Version = "rollout", "" }},
		{name: "rollout with certificates", args: []string{"demo", "--rollout", "--certificates-expiring-within", "14d"},
			want: func(v *resolved) { v.Operation, v.Version, v.CertificatesExpiryDays = "rollout", "", 14 }},
		{name: "restart", args: []string{"demo", "--restart"},
			want: func(v *resolved) { v.Operation, v.Version = "restart", "" }},
		{name: "exit code and etcd endpoint", args: []string{"demo", "--version", "v1.36.3", "--exit-code", "--etcd-endpoint", "https://{{.NodeName}}:2379"},
			want: func(v *resolved) { v.ExitCode, v.EtcdEndpoint = true, "https://{{.NodeName}}:2379" }},
		// What the request itself takes, as the changing verbs do; their
		// wait limits, --dry-run and --on-failure are no flags of plan's.
		{name: "request flags", args: []string{"demo", "--version", "v1.36.3", "--max-surge", "0", "-o", "json",
			"--etcd-endpoint", "https://{{.NodeIP}}:2379", "--kcp-version", "v1.14.2"},
			want: func(v *resolved) {
				v.MaxSurge, v.Output = 0, "json"
				v.EtcdEndpoint, v.KCPVersion = "https://{{.NodeIP}}:2379", "v1.14.2"
			}},
	})
}

func TestStatusOptions(t *testing.T) {
	view := func(r result, o *StatusOptions) resolved {
		return resolved{Cluster: o.conn.Cluster, Namespace: r.opts.ConfigFlags.Namespace(), EtcdEndpoint: o.conn.EtcdEndpoint, Output: o.output.Output}
	}
	checkOptions(t, "status", NewCmdStatus, view, resolved{Cluster: "demo", Output: "text"}, []optionsCase{
		{name: "defaults", args: []string{"demo"}},
		{name: "wide", args: []string{"demo", "-o", "wide", "--etcd-endpoint", "https://{{.NodeIP}}:2379"},
			want: func(v *resolved) { v.Output, v.EtcdEndpoint = "wide", "https://{{.NodeIP}}:2379" }},
		{name: "yaml from environment", args: []string{"demo", "-n", "capi"}, env: map[string]string{"CP_ROLLOUT_OUTPUT": "yaml"},
			want: func(v *resolved) { v.Output, v.Namespace = "yaml", "capi" }},
	})
}

func TestHandbackOptions(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		force bool
	}{
		{[]string{"demo"}, false},
		{[]string{"demo", "--force"}, true},
	} {
		isolate(t)
		o, r := parse(t, NewCmdHandback, append([]string{"handback"}, tc.args...)...)
		if o == nil {
			t.Fatalf("%v: did not reach Run: %v", tc.args, r.err)
		}
		if o.conn.Cluster != "demo" || o.Force != tc.force || o.conn.Management != r.opts.ConfigFlags {
			t.Errorf("%v: cluster %q, force %v, management from the root's flags %v", tc.args, o.conn.Cluster, o.Force, o.conn.Management == r.opts.ConfigFlags)
		}
	}
}

func TestVersionAndCompletionOptions(t *testing.T) {
	isolate(t)
	version := func(root *RootOptions, runF func(*VersionOptions) error) *cobra.Command {
		return NewCmdVersion(root.Streams, runF)
	}
	if o, r := parse(t, version, "version", "-o", "json"); o == nil || o.output.Output != "json" {
		t.Errorf("version -o json: %+v, %v", o, r.err)
	}
	completion := func(root *RootOptions, runF func(*CompletionOptions) error) *cobra.Command {
		return NewCmdCompletion(root.Streams, runF)
	}
	if o, r := parse(t, completion, "completion", "zsh"); o == nil || o.Shell != "zsh" || o.Tree.Name() != "kubectl-cp_rollout" {
		t.Errorf("completion zsh: %+v, %v", o, r.err)
	}
}

// The rows of test/e2e TestBadInputChangesNothing whose refusal follows from
// the command line, the environment, the config file and the kubeconfig
// alone, checked here without a cluster: same exit code, same reason.
func TestBadInputRefusedBeforeAnyCluster(t *testing.T) {
	const to = "v1.36.3"
	badConfig := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, badConfig, "namespace: default\n\tcontext: x\n")
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"upgrade", "demo", "--version", "1.36.3"}, 2, "--version 1.36.3 is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example v1.36.3"},
		{[]string{"upgrade", "demo", "--version", "v1.36"}, 2, "--version v1.36 is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example v1.36.0"},
		{[]string{"upgrade", "demo", "--version", "vlatest"}, 2, "--version vlatest is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example v1.36.3"},
		{[]string{"upgrade", "demo", "--version", "v1.36.3.1"}, 2, "--version v1.36.3.1 is not a Kubernetes version"},
		{[]string{"upgrade", "demo", "--version", to, "--via", "v1.35"}, 2, "--via v1.35 is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example v1.35.0"},
		{[]string{"plan", "demo", "--version", "v1.36"}, 2, "--version v1.36 is not a Kubernetes version"},
		{[]string{"upgrade", "demo", "--version", to, "--kcp-version", "latest"}, 2, "--kcp-version latest is not a Cluster API version: want vMAJOR.MINOR.PATCH, for example v1.14.0"},
		{[]string{"plan", "demo", "--version", to, "--kcp-version", "latest"}, 2, "--kcp-version latest is not a Cluster API version"},
		{[]string{"upgrade", "demo", "--version", to, "--kubeconfig", "/nonexistent/kubeconfig"}, 7,
			"no kubeconfig: --kubeconfig /nonexistent/kubeconfig does not exist; point --kubeconfig or KUBECONFIG at a management cluster's kubeconfig (for example: export KUBECONFIG=~/.kube/config)"},
		{[]string{"upgrade", "demo"}, 2, "--version is required"},
		{[]string{"upgrade", "demo", "--version", to, "--max-surge", "2"}, 2, "--max-surge must be 0 or 1"},
		{[]string{"upgrade", "demo", "--version", to, "--health-timeout", "-1m"}, 2, "must not be negative"},
		{[]string{"upgrade", "demo", "--version", to, "--on-failure", "retry"}, 2, "--on-failure"},
		{[]string{"upgrade", "demo", "--version", to, "--etcd-endpoint", "https://{{.Nope}}:2379"}, 2, "--etcd-endpoint"},
		{[]string{"scale", "demo", "--replicas", "0"}, 2, "at least 1"},
		{[]string{"scale", "demo", "--replicas", "-1"}, 2, "at least 1"},
		{[]string{"scale", "demo"}, 2, "--replicas is required"},
		{[]string{"scale", "demo", "--replicas", "1", "--max-surge", "0"}, 2, "--max-surge 0 needs at least 3"},
		{[]string{"replace", "demo"}, 2, "two arguments"},
		// replace names one machine of one cluster: no selection, no fleet.
		{[]string{"replace", "demo", "m", "-A"}, 2, "unknown shorthand flag: 'A' in -A"},
		{[]string{"replace", "demo", "m", "-l", "env=prod"}, 2, "unknown shorthand flag: 'l' in -l"},
		{[]string{"replace", "demo", "m", "--parallel", "2"}, 2, "unknown flag: --parallel"},
		{[]string{"replace", "demo", "m", "--max-failures", "1"}, 2, "unknown flag: --max-failures"},
		// A plan changes nothing and waits for nothing.
		{[]string{"plan", "demo", "--version", to, "--no-wait"}, 2, "unknown flag: --no-wait"},
		{[]string{"plan", "demo", "--version", to, "--handback-timeout", "1m"}, 2, "unknown flag: --handback-timeout"},
		{[]string{"plan", "demo", "--version", to, "--timeout", "1h"}, 2, "unknown flag: --timeout"},
		{[]string{"plan", "demo", "--version", to, "--dry-run"}, 2, "unknown flag: --dry-run"},
		{[]string{"plan", "demo", "--version", to, "--replicas", "3"}, 2, "not several"},
		{[]string{"plan", "demo"}, 2, "needs one of --version, --replicas, --replace, --rollout or --restart"},
		{[]string{"plan", "demo", "--rollout", "--restart"}, 2, "not several"},
		{[]string{"plan", "demo", "--certificates-expiring-within", "30d"}, 2, "needs --rollout"},
		{[]string{"plan", "demo", "--rollout", "--certificates-expiring-within", "180h"}, 2, "180h is not whole days: use 7d or 8d"},
		{[]string{"rollout", "demo", "--certificates-expiring-within", "0d"}, 2, "must be positive"},
		{[]string{"rollout", "demo", "--certificates-expiring-within", "6d"}, 2, "at least 7 days"},
		{[]string{"rollout", "demo", "--certificates-expiring-within", "soon"}, 2, "not a duration"},
		{[]string{"rollout", "demo", "--version", to}, 2, "unknown flag: --version"},
		{[]string{"restart", "demo", "--certificates-expiring-within", "30d"}, 2, "unknown flag: --certificates-expiring-within"},
		{[]string{"restart", "demo", "demo2"}, 2, "restart takes at most one argument, the Cluster's name (or -l/-A instead); got 2"},
		{[]string{"pause"}, 2, "one argument"},
		{[]string{"pause", "demo", "--version", to}, 2, "unknown flag: --version"},
		{[]string{"upgrade", "demo", "--version", to, "--context", "no-such-context"}, 2, "no-such-context"},
		{[]string{"upgrade", "demo", "--version", to, "--kcp-version", "v1.12.4"}, 3, "proven with KCP v1.13.x–v1.14.x"},
		{[]string{"upgrade", "demo", "--version", to, "--config", badConfig}, 2, "line 2"},
		{[]string{"upgarde", "demo"}, 2, "unknown command"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			isolate(t)
			r := run(t, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit code %d, want %d (err: %v)", r.code, tc.code, r.err)
			}
			if msg := r.err.Error(); !strings.Contains(msg, tc.says) || strings.Contains(msg, "\n") {
				t.Fatalf("error %q: want one line containing %q", msg, tc.says)
			}
			if r.out != "" || r.log != "" {
				t.Fatalf("refusal printed: stdout %q, stderr %q", r.out, r.log)
			}
		})
	}
}

// The same flag values that the change verbs refuse, plan and status refuse
// too.
func TestSharedFlagsRefusedByEveryVerb(t *testing.T) {
	isolate(t)
	for _, args := range [][]string{
		{"plan", "demo", "--replicas", "1", "--max-surge", "0"},
		{"plan", "demo", "--version", "v1.36.3", "--etcd-endpoint", "http://{{.NodeIP}}"},
		{"plan", "demo", "--version", "v1.36.3", "--kcp-version", "latest"},
		{"status", "demo", "--etcd-endpoint", "https://{{.Nope}}"},
		{"replace", "demo", "m", "--kcp-version", "latest"},
	} {
		if r := run(t, args...); r.code != exitcode.Usage {
			t.Errorf("%v: exit %d (err: %v), want exit 2", args, r.code, r.err)
		}
	}
}

// TestMinExpiryDaysIsKCPs holds minExpiryDays to the KubeadmControlPlane
// CRD's own minimum for spec.rollout.before.certificatesExpiryDays.
func TestMinExpiryDaysIsKCPs(t *testing.T) {
	crds, err := manifests.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		if crd.Spec.Names.Kind != "KubeadmControlPlane" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if v.Name != "v1beta2" {
				continue
			}
			field := v.Schema.OpenAPIV3Schema.Properties["spec"].Properties["rollout"].Properties["before"].Properties["certificatesExpiryDays"]
			if field.Minimum == nil || *field.Minimum != minExpiryDays {
				t.Fatalf("KCP's CRD has minimum %v for certificatesExpiryDays, the tool %d", field.Minimum, minExpiryDays)
			}
			return
		}
	}
	t.Fatal("no v1beta2 KubeadmControlPlane CRD")
}
