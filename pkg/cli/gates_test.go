package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// The gates' flags reach the run's Timeouts; --settle still sets the soak,
// and says it is deprecated; a command line that gives either name wins
// over the file and the environment giving the other.
func TestGateFlags(t *testing.T) {
	base := []string{"upgrade", "demo", "--version", "v1.36.3"}
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		config string
		gates  rollout.Gates
		soak   time.Duration
		log    string // what stderr must say
	}{
		{name: "defaults", gates: rollout.Gates{Count: 1, Timeout: rollout.DefaultGateTimeout}},
		{name: "every flag", args: []string{"--gate", "./check.sh --strict", "--gate-count", "3", "--gate-timeout", "20m", "--soak", "30s"},
			gates: rollout.Gates{Command: "./check.sh --strict", Count: 3, Timeout: 20 * time.Minute}, soak: 30 * time.Second},
		{name: "settle, deprecated", args: []string{"--settle", "10s"},
			gates: rollout.Gates{Count: 1, Timeout: rollout.DefaultGateTimeout}, soak: 10 * time.Second, log: "--settle has been deprecated, use --soak"},
		{name: "soak and gate timeout from the file", config: "soak: 1m\ngate-timeout: 30m\n",
			gates: rollout.Gates{Count: 1, Timeout: 30 * time.Minute}, soak: time.Minute},
		{name: "settle from a site's old file", config: "settle: 20s\n",
			gates: rollout.Gates{Count: 1, Timeout: rollout.DefaultGateTimeout}, soak: 20 * time.Second},
		{name: "--soak beats settle in the environment and the file", args: []string{"--soak", "3s"},
			env: map[string]string{"CP_ROLLOUT_SETTLE": "2s"}, config: "settle: 1s\n",
			gates: rollout.Gates{Count: 1, Timeout: rollout.DefaultGateTimeout}, soak: 3 * time.Second},
		{name: "--settle beats soak in the file", args: []string{"--settle", "3s"}, config: "soak: 1s\n",
			gates: rollout.Gates{Count: 1, Timeout: rollout.DefaultGateTimeout}, soak: 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			isolateWith(t, tc.config, tc.env)
			o, r := parse(t, NewCmdUpgrade, append(base, tc.args...)...)
			if o == nil {
				t.Fatalf("did not reach Run: %v", r.err)
			}
			got := o.change.wait.Timeouts
			if got.Gates != tc.gates || got.Settle != tc.soak {
				t.Errorf("gates %+v, soak %s; want %+v, %s", got.Gates, got.Settle, tc.gates, tc.soak)
			}
			if !strings.Contains(r.log, tc.log) {
				t.Errorf("stderr %q does not say %q", r.log, tc.log)
			}
			if r.out != "" {
				t.Errorf("stdout %q: want nothing there, where -o json's events go", r.out)
			}
		})
	}
}

// Bad gate flags are usage errors before anything is read.
func TestGateFlagsValidated(t *testing.T) {
	base := []string{"upgrade", "demo", "--version", "v1.36.3"}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--gate", "true", "--gate-count", "0"}, "--gate-count must be at least 1"},
		{[]string{"--gate-count", "2"}, "--gate-count 2 needs --gate"},
		{[]string{"--gate", "true", "--gate-timeout", "0s"}, "--gate-timeout must be positive"},
		{[]string{"--gate", "true", "--gate-count", "3", "--gate-timeout", "20s"}, "--gate-timeout 20s is too short for --gate-count 3"},
		{[]string{"--soak", "-1s"}, "--soak must not be negative"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			isolate(t)
			refused(t, run(t, append(base, tc.args...)...), exitcode.Usage, tc.says)
		})
	}
}

// --gate runs a command as the operator: from the config file or the
// environment it is refused, exit 2, naming where it came from and without
// repeating the command (it may hold a token).
func TestGateRefusedFromConfigAndEnvironment(t *testing.T) {
	const command = "curl -H 'Authorization: Bearer s3cr3t' https://check"
	t.Run("config file", func(t *testing.T) {
		isolateWith(t, "output: json\ngate: \""+command+"\"\n", nil)
		reached, r := parseVerb(t, "upgrade", "demo", "--version", "v1.36.3")
		if reached {
			t.Fatal("reached Run")
		}
		refused(t, r, exitcode.Usage, "config.yaml: line 2: key \"gate\" is not allowed", "--gate runs a command as you", "pass --gate there")
	})
	t.Run("environment", func(t *testing.T) {
		isolateWith(t, "", map[string]string{"CP_ROLLOUT_GATE": command})
		reached, r := parseVerb(t, "upgrade", "demo", "--version", "v1.36.3")
		if reached {
			t.Fatal("reached Run")
		}
		refused(t, r, exitcode.Usage, "environment variable CP_ROLLOUT_GATE=… is not allowed", "--gate runs a command as you")
		if strings.Contains(r.err.Error(), "s3cr3t") {
			t.Errorf("error %q repeats the command", r.err)
		}
	})
	t.Run("count from the environment", func(t *testing.T) {
		isolateWith(t, "", map[string]string{"CP_ROLLOUT_GATE_COUNT": "3"})
		refused(t, run(t, "upgrade", "demo", "--version", "v1.36.3"), exitcode.Usage, "CP_ROLLOUT_GATE_COUNT=3 is not allowed")
	})
	// A gate that runs the tool again finds the cluster and namespace in
	// its environment: the refusal says what to do about it.
	t.Run("the tool run from a gate", func(t *testing.T) {
		isolateWith(t, "", map[string]string{rollout.GateEnvStep: "1/3", rollout.GateEnvNamespace: "default", rollout.GateEnvMachine: "demo-cp-abcde"})
		refused(t, run(t, "status", "demo"), exitcode.Usage, "CP_ROLLOUT_NAMESPACE=default is not allowed", "set for a --gate command", "env -u CP_ROLLOUT_CLUSTER -u CP_ROLLOUT_NAMESPACE")
	})
}
