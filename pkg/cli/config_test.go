package cli

import (
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// What to act on and how comes only from the command line: a flag outside
// configurable, set in the environment or the config file, stops the command
// before its Run, naming the key and where it was set.
func TestTargetAndScopeRefusedFromConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		config string
		says   []string
	}{
		{name: "version from the environment", args: []string{"upgrade", "demo"},
			env:  map[string]string{"CP_ROLLOUT_VERSION": "v1.36.3"},
			says: []string{"environment variable CP_ROLLOUT_VERSION=v1.36.3 is not allowed", "pass --version there"}},
		// The variable is refused even where the command line says the same:
		// left in the shell, it would act on the next command that lacks it.
		{name: "version from the environment and the command line", args: []string{"upgrade", "demo", "--version", "v1.36.3"},
			env:  map[string]string{"CP_ROLLOUT_VERSION": "v1.36.3"},
			says: []string{"CP_ROLLOUT_VERSION"}},
		{name: "version from the environment, for a read-only verb", args: []string{"status", "demo"},
			env:  map[string]string{"CP_ROLLOUT_VERSION": "v1.36.3"},
			says: []string{"CP_ROLLOUT_VERSION"}},
		{name: "all namespaces from the file", args: []string{"upgrade", "--version", "v1.36.3"},
			config: "context: mgmt\nall-namespaces: true\n",
			says:   []string{"config.yaml: line 2: key \"all-namespaces\" is not allowed", "pass --all-namespaces there"}},
		{name: "all namespaces from the environment", args: []string{"upgrade", "--version", "v1.36.3"},
			env:  map[string]string{"CP_ROLLOUT_ALL_NAMESPACES": "true"},
			says: []string{"environment variable CP_ROLLOUT_ALL_NAMESPACES=true"}},
		{name: "force from the file", args: []string{"handback", "demo"}, config: "force: true\n",
			says: []string{"config.yaml: line 1: key \"force\" is not allowed"}},
		{name: "force from the environment", args: []string{"handback", "demo"},
			env:  map[string]string{"CP_ROLLOUT_FORCE": "true"},
			says: []string{"environment variable CP_ROLLOUT_FORCE=true"}},
		{name: "yes from the environment", args: []string{"upgrade", "-A", "--version", "v1.36.3"},
			env:  map[string]string{"CP_ROLLOUT_YES": "true"},
			says: []string{"environment variable CP_ROLLOUT_YES=true", "pass --yes there"}},
		{name: "yes from the file", args: []string{"handback", "-A"}, config: "yes: true\n",
			says: []string{"line 1: key \"yes\""}},
		{name: "selector from the file", args: []string{"status", "-A"}, config: "output: json\n\nselector: env=prod\n",
			says: []string{"line 3: key \"selector\""}},
		{name: "replicas from the file", args: []string{"scale", "demo"}, config: "replicas: 3\n",
			says: []string{"key \"replicas\""}},
		{name: "parallel from the environment", args: []string{"upgrade", "-l", "env=a", "--version", "v1.36.3"},
			env:  map[string]string{"CP_ROLLOUT_PARALLEL": "5"},
			says: []string{"CP_ROLLOUT_PARALLEL"}},
		{name: "dry run from the file", args: []string{"upgrade", "demo", "--version", "v1.36.3"}, config: "dry-run: true\n",
			says: []string{"key \"dry-run\""}},
		{name: "surge from the environment", args: []string{"upgrade", "demo", "--version", "v1.36.3"},
			env:  map[string]string{"CP_ROLLOUT_MAX_SURGE": "0"},
			says: []string{"CP_ROLLOUT_MAX_SURGE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isolateWith(t, tc.config, tc.env)
			reached, r := parseVerb(t, tc.args...)
			if r.code != exitcode.Usage || reached {
				t.Fatalf("exit %d, reached Run %v (err: %v); want exit 2 before Run", r.code, reached, r.err)
			}
			msg := r.err.Error()
			for _, want := range tc.says {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q lacks %q", msg, want)
				}
			}
			if strings.Contains(msg, "\n") || r.out != "" || r.log != "" {
				t.Errorf("want one line and nothing printed: error %q, stdout %q, stderr %q", msg, r.out, r.log)
			}
		})
	}
}

// configurableValues is a value for each configurable flag, as a person
// would write it.
var configurableValues = map[string]string{
	"kubeconfig": "KUBECONFIG", "context": "mgmt", "disable-compression": "true",
	"request-timeout": "30s", "etcd-endpoint": "https://{{.NodeIP}}:2379", "output": "json", "etcd": "true",
	"timeout": "1h", "provision-timeout": "5m", "health-timeout": "2m", "delete-timeout": "3m", "settle": "10s", "soak": "10s", "gate-timeout": "20m",
	"handback-timeout": "30s", "no-wait": "true", "workers-timeout": "40m", "unhealthy-grace": "3m",
	"topology-timeout": "15m", "stage-soak": "10m", "machine-time": "20m", "run-namespace": "cp-rollout-runs",
}

// The allowlist names only flags that exist, and each of them still comes
// from the file and from the environment.
func TestConfigurableKeysStillWork(t *testing.T) {
	known := knownFlags(NewRootCmd(genericiooptions.IOStreams{}))
	var names []string
	for name := range configurable {
		if !known[name] {
			t.Errorf("configurable %q is no flag of any verb", name)
		}
		if _, ok := configurableValues[name]; !ok {
			t.Errorf("configurable %q has no value in this test", name)
		}
		if targetOrIdentity[name] {
			t.Errorf("%q is both configurable and a flag of the target or identity", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)

	check := func(t *testing.T, o *UpgradeOptions, r result) {
		t.Helper()
		if o == nil {
			t.Fatalf("did not reach Run: %v", r.err)
		}
		ov := r.opts.ConfigFlags.overrides
		if r.opts.ConfigFlags.rules.ExplicitPath != "KUBECONFIG" || ov.CurrentContext != "mgmt" ||
			!ov.ClusterInfo.DisableCompression || ov.Timeout != "30s" {
			t.Errorf("connection flags not applied: kubeconfig %q, %+v", r.opts.ConfigFlags.rules.ExplicitPath, ov)
		}
		req, wait := o.change.req, o.change.wait
		if req.Output != "json" || req.conn.EtcdEndpoint != "https://{{.NodeIP}}:2379" || wait.Timeout != time.Hour ||
			wait.Timeouts.Health != 2*time.Minute || wait.Timeouts.Handback != 0 || wait.Timeouts.Topology != 15*time.Minute || req.request.Version != "v1.36.3" {
			t.Errorf("verb flags not applied: output %q, etcd endpoint %q, timeout %s, timeouts %+v", req.Output, req.conn.EtcdEndpoint, wait.Timeout, wait.Timeouts)
		}
	}
	args := []string{"upgrade", "demo", "--version", "v1.36.3"}

	t.Run("file", func(t *testing.T) {
		var body strings.Builder
		for _, name := range names {
			body.WriteString(name + ": '" + configurableValues[name] + "'\n")
		}
		isolateWith(t, body.String(), nil)
		o, r := parse(t, NewCmdUpgrade, args...)
		check(t, o, r)
	})
	t.Run("environment", func(t *testing.T) {
		env := map[string]string{}
		for _, name := range names {
			env[envName(name)] = configurableValues[name]
		}
		isolateWith(t, "", env)
		o, r := parse(t, NewCmdUpgrade, args...)
		check(t, o, r)
	})
}

// A key nobody knows stays an unknown key, not a forbidden one: the hint
// lists what may be written.
func TestUnknownKeyIsNotCalledForbidden(t *testing.T) {
	isolateWith(t, "machine: demo-cp-1\n", nil)
	r := run(t, "version")
	if r.code != exitcode.Usage || !strings.Contains(r.err.Error(), `unknown key "machine"`) {
		t.Fatalf("exit %d, err %v", r.code, r.err)
	}
}

// targetOrIdentityValues is a value for each flag that chooses the target or
// the identity, as a leftover variable or a shared file would hold it.
var targetOrIdentityValues = map[string]string{
	"namespace": "prod", "server": "https://10.0.0.1:6443", "cluster": "prod-cluster", "tls-server-name": "prod.example",
	"certificate-authority": "/ca.crt", "insecure-skip-tls-verify": "true", "user": "admin", "client-certificate": "/tls.crt",
	"client-key": "/tls.key", "token": "s3cr3t-t0ken", "username": "admin", "password": "s3cr3t-pw", "as": "system:admin",
	"as-group": "system:masters", "as-uid": "0",
}

// TestTargetAndIdentityRefusedFromConfig: a leftover CP_ROLLOUT_NAMESPACE=prod
// would turn "upgrade demo" into prod/demo, a shared file's "as:" would act
// as someone else. Each flag that chooses the namespace, the management
// cluster or the identity is refused from the environment and from the file,
// exit 2 before Run, in one line naming the variable or the file and line and
// the flag to pass instead; a credential's value is not repeated.
func TestTargetAndIdentityRefusedFromConfig(t *testing.T) {
	known := knownFlags(NewRootCmd(genericiooptions.IOStreams{}))
	for name := range targetOrIdentity {
		if !known[name] {
			t.Errorf("targetOrIdentity %q is no flag of any verb", name)
		}
		if _, ok := targetOrIdentityValues[name]; !ok {
			t.Errorf("targetOrIdentity %q has no value in this test", name)
		}
	}
	var names []string
	for name := range targetOrIdentityValues {
		names = append(names, name)
	}
	sort.Strings(names)
	args := []string{"upgrade", "demo", "--version", "v1.36.3"}
	check := func(t *testing.T, name string, reached bool, r result, says ...string) {
		t.Helper()
		if r.code != exitcode.Usage || reached {
			t.Fatalf("exit %d, reached Run %v (err: %v); want exit 2 before Run", r.code, reached, r.err)
		}
		msg := r.err.Error()
		for _, want := range append(says, "pass --"+name+" there", "namespace, cluster and identity") {
			if !strings.Contains(msg, want) {
				t.Errorf("error %q lacks %q", msg, want)
			}
		}
		if credential[name] && strings.Contains(msg, targetOrIdentityValues[name]) {
			t.Errorf("error %q repeats the secret value", msg)
		}
		if strings.Contains(msg, "\n") || r.out != "" || r.log != "" {
			t.Errorf("want one line and nothing printed: error %q, stdout %q, stderr %q", msg, r.out, r.log)
		}
	}
	for _, name := range names {
		t.Run(name+" from the environment", func(t *testing.T) {
			isolateWith(t, "", map[string]string{envName(name): targetOrIdentityValues[name]})
			reached, r := parseVerb(t, args...)
			check(t, name, reached, r, "environment variable "+envName(name)+"=", "is not allowed")
		})
		t.Run(name+" from the file", func(t *testing.T) {
			isolateWith(t, "output: json\n"+name+": '"+targetOrIdentityValues[name]+"'\n", nil)
			reached, r := parseVerb(t, args...)
			check(t, name, reached, r, "config.yaml: line 2: key \""+name+"\" is not allowed")
		})
	}
	// The case from issue 48, whatever the verb.
	t.Run("namespace for a read-only verb", func(t *testing.T) {
		isolateWith(t, "", map[string]string{"CP_ROLLOUT_NAMESPACE": "prod"})
		refused(t, run(t, "status", "demo"), exitcode.Usage, "environment variable CP_ROLLOUT_NAMESPACE=prod is not allowed", "pass --namespace there")
	})
}
