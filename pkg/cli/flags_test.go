package cli

import (
	"flag"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// Each verb has only the flags it uses: --help lists nothing the verb would
// refuse or ignore, and a flag that does not apply is unknown, not hidden.
func TestEachVerbHasOnlyItsFlags(t *testing.T) {
	fleetRun := []string{"parallel", "max-failures", "yes"} // a change over -l/-A
	waits := []string{"timeout", "provision-timeout", "health-timeout", "delete-timeout", "soak", "settle", "unhealthy-grace",
		"handback-timeout", "no-wait", "workers-timeout", "topology-timeout", "gate", "gate-count", "gate-timeout"}
	all := func(lists ...[]string) []string { return slices.Concat(lists...) }
	verbs := map[string]struct {
		selects   bool     // takes -l/-A instead of a CLUSTER name
		forbidden []string // flags it must not have
	}{
		"upgrade": {selects: true},
		"scale":   {selects: true},
		"rollout": {selects: true},
		"restart": {selects: true},
		// One named machine of one cluster.
		"replace": {forbidden: fleetRun},
		"pause":   {forbidden: all(fleetRun, waits, []string{"dry-run", "on-failure"})},
		// A plan changes nothing and waits for nothing.
		"plan":       {selects: true, forbidden: all(fleetRun, waits, []string{"dry-run", "on-failure"})},
		"status":     {selects: true, forbidden: all(fleetRun, waits, []string{"dry-run", "on-failure"})},
		"check":      {selects: true, forbidden: all(fleetRun, waits, []string{"dry-run", "on-failure"})},
		"handback":   {selects: true, forbidden: all([]string{"parallel", "max-failures"}, waits, []string{"dry-run", "on-failure"})},
		"rbac":       {forbidden: all(fleetRun, waits)},
		"version":    {forbidden: all(fleetRun, waits)},
		"completion": {forbidden: all(fleetRun, waits)},
		// One cluster, read-only; --timeout alone of the run's waits.
		"wait": {forbidden: all(fleetRun, slices.DeleteFunc(slices.Clone(waits), func(f string) bool { return f == "timeout" }), []string{"dry-run", "on-failure", "etcd-endpoint", "kcp-version"})},
	}
	for _, cmd := range NewRootCmd(genericiooptions.IOStreams{}).Commands() {
		verb := cmd.Name()
		t.Run(verb, func(t *testing.T) {
			tc, ok := verbs[verb]
			if !ok {
				t.Fatalf("verb %s has no row in this test", verb)
			}
			flags := cmd.LocalFlags()
			for _, name := range []string{"selector", "all-namespaces"} {
				if has := flags.Lookup(name) != nil; has != tc.selects {
					t.Errorf("--%s: present %v, want %v", name, has, tc.selects)
				}
			}
			for _, name := range tc.forbidden {
				if flags.Lookup(name) != nil {
					t.Errorf("has --%s, which it does not use", name)
				}
			}
			flags.VisitAll(func(f *pflag.Flag) {
				// A deprecated name (--settle) is hidden by pflag, and says so
				// when used.
				if f.Hidden && f.Deprecated == "" {
					t.Errorf("--%s is hidden: a verb has only the flags it uses, each listed", f.Name)
				}
			})
		})
	}
}

// -v, as kubectl's, sets klog's verbosity, so client-go logs each request
// (6) and its body (8); without it klog stays quiet.
func TestVerbosity(t *testing.T) {
	t.Cleanup(func() { setKlogVerbosity(t, 0) })
	for _, tc := range []struct {
		args  []string
		level klog.Level // the highest enabled; 0 for none above 0
	}{
		{[]string{"status", "demo"}, 0},
		{[]string{"status", "demo", "-v", "6"}, 6},
		{[]string{"status", "demo", "-v=6"}, 6},
		{[]string{"upgrade", "demo", "--version", "v1.36.3", "--v=8"}, 8},
		{[]string{"plan", "demo", "--rollout", "-v", "6"}, 6},
		{[]string{"status", "demo", "-v", "0"}, 0},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			isolate(t)
			setKlogVerbosity(t, 0)
			if reached, r := parseVerb(t, tc.args...); !reached {
				t.Fatalf("did not reach Run: %v", r.err)
			}
			if tc.level > 0 && !klog.V(tc.level).Enabled() {
				t.Errorf("klog.V(%d) is not enabled", tc.level)
			}
			if klog.V(tc.level + 1).Enabled() {
				t.Errorf("klog.V(%d) is enabled, want at most %d", tc.level+1, tc.level)
			}
		})
	}
	isolate(t)
	refused(t, run(t, "status", "demo", "-v", "-1"), exitcode.Usage, "-v must not be negative")
	refused(t, run(t, "status", "demo", "-v", "high"), exitcode.Usage, `invalid argument "high"`)
}

func setKlogVerbosity(t *testing.T, level int) {
	t.Helper()
	var fs flag.FlagSet
	klog.InitFlags(&fs)
	if err := fs.Set("v", strconv.Itoa(level)); err != nil {
		t.Fatal(err)
	}
}
