package cli

import (
	"flag"
	"fmt"
	"regexp"
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
// (The flags every verb inherits, the connection's, --config and -v, are
// listed by the options verb instead: TestHelpListsTheVerbsOwnFlags.)
func TestEachVerbHasOnlyItsFlags(t *testing.T) {
	// A change over -l/-A: its pace, its record, and when each cluster goes
	// (which plan shows too).
	recorded := []string{"parallel", "max-failures", "yes", "run", "resume", "run-namespace"}
	fleetRun := append([]string{"stages", "stage-soak", "machine-time"}, recorded...)
	// What only a run that changes a control plane takes: a question
	// between its machines, and the readiness checks an upgrade (and
	// plan --version) accepts knowingly.
	runOnly := []string{"interactive"}
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
		"pause":   {forbidden: all(fleetRun, waits, runOnly, []string{"dry-run", "on-failure", "skip-check"})},
		// A plan changes nothing and waits for nothing.
		"plan":     {selects: true, forbidden: all(recorded, waits, runOnly, []string{"dry-run", "on-failure"})},
		"status":   {selects: true, forbidden: all(fleetRun, waits, runOnly, []string{"dry-run", "on-failure", "skip-check"})},
		"check":    {selects: true, forbidden: all(fleetRun, waits, runOnly, []string{"dry-run", "on-failure"})},
		"handback": {selects: true, forbidden: all(slices.DeleteFunc(slices.Clone(fleetRun), func(f string) bool { return f == "yes" }), waits, runOnly, []string{"dry-run", "on-failure", "skip-check"})},
		// Recorded fleet runs, read or marked; not a run itself.
		"fleet":      {forbidden: all(fleetRun, waits, runOnly)},
		"rbac":       {forbidden: all(fleetRun, waits, runOnly)},
		"version":    {forbidden: all(fleetRun, waits, runOnly)},
		"completion": {forbidden: all(fleetRun, waits, runOnly)},
		"options":    {forbidden: all(fleetRun, waits, runOnly)},
		// One cluster, read-only; --timeout alone of the run's waits.
		"wait": {forbidden: all(fleetRun, slices.DeleteFunc(slices.Clone(waits), func(f string) bool { return f == "timeout" }), runOnly, []string{"dry-run", "on-failure", "etcd-endpoint", "kcp-version", "skip-check"})},
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
	refused(t, run(t, "status", "demo", "-v", "high"), exitcode.Usage, "-v high: not a whole number")
}

func setKlogVerbosity(t *testing.T, level int) {
	t.Helper()
	var fs flag.FlagSet
	klog.InitFlags(&fs)
	if err := fs.Set("v", strconv.Itoa(level)); err != nil {
		t.Fatal(err)
	}
}

// helpFlagLine is a flag's line in a help text: "  -n, --namespace string …".
var helpFlagLine = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([\w-]+)`)

// helpFlags are the flags a help text lists, by long name, in order.
func helpFlags(help string) []string {
	var names []string
	for _, m := range helpFlagLine.FindAllStringSubmatch(help, -1) {
		names = append(names, m[1])
	}
	return names
}

// TestHelpListsTheVerbsOwnFlags: each verb's --help lists every flag of its
// own, and none of those every verb inherits, which it ends by pointing at
// the options verb for; options lists those, and each of them still works on
// every verb.
func TestHelpListsTheVerbsOwnFlags(t *testing.T) {
	isolate(t)
	root := NewRootCmd(genericiooptions.IOStreams{})
	var global []string
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { global = append(global, f.Name) })
	if len(global) < 20 || !slices.Contains(global, "kubeconfig") || !slices.Contains(global, "as") || !slices.Contains(global, "v") {
		t.Fatalf("the root's persistent flags: %q", global)
	}
	r := run(t, "options")
	if r.err != nil || !strings.HasPrefix(r.out, "The following options can be passed to any command:\n\n") {
		t.Fatalf("options: %v\n%s", r.err, r.out)
	}
	if got := helpFlags(r.out); !slices.Equal(got, global) {
		t.Errorf("options lists %q, want the flags every verb inherits, %q", got, global)
	}
	const hint = `Use "kubectl cp-rollout options" for a list of global command-line options (applies to all commands).`
	for _, cmd := range append(root.Commands(), root) {
		verb := cmd.Name()
		t.Run(verb, func(t *testing.T) {
			args := []string{verb, "--help"}
			if cmd == root {
				args = args[1:]
			}
			help := run(t, args...)
			if help.err != nil {
				t.Fatal(help.err)
			}
			var own []string
			cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
				if f.Deprecated == "" && root.PersistentFlags().Lookup(f.Name) == nil {
					own = append(own, f.Name)
				}
			})
			if cmd != root {
				own = append(own, "help") // cobra adds -h when it runs
			}
			got := helpFlags(help.out)
			for _, name := range own {
				if !slices.Contains(got, name) {
					t.Errorf("--help does not list its own --%s", name)
				}
			}
			for _, name := range got {
				if slices.Contains(global, name) {
					t.Errorf("--help lists --%s, which options lists", name)
				}
			}
			if !strings.HasSuffix(help.out, "\n"+hint+"\n") {
				t.Errorf("--help does not end with %q:\n%s", hint, help.out)
			}
			// Not listed, and still taken: --help after them shows that
			// each parses, and runs nothing.
			for _, name := range global {
				value := "x"
				switch name {
				case "v":
					value = "1"
				case "disable-compression", "insecure-skip-tls-verify":
					value = "true"
				}
				if r := run(t, append(args, "--"+name+"="+value)...); r.err != nil {
					t.Errorf("--%s: %v", name, r.err)
				}
			}
		})
	}
}

// TestHelpListsRequiredFlagsFirst: a flag that a verb refuses to run
// without is listed first, in a section of its own; the verb still refuses
// its absence in its own words, which say what to give, not cobra's.
func TestHelpListsRequiredFlagsFirst(t *testing.T) {
	isolate(t)
	want := map[string][]string{"upgrade": {"version"}, "scale": {"replicas"}, "check": {"version"}, "wait": {"for"}}
	for _, cmd := range NewRootCmd(genericiooptions.IOStreams{}).Commands() {
		verb := cmd.Name()
		help := run(t, verb, "--help").out
		var required []string
		if before, after, ok := strings.Cut(help, "\nRequired flags:\n"); ok {
			if strings.Contains(before, "\nFlags:\n") {
				t.Errorf("%s: the required flags follow the others", verb)
			}
			section, _, _ := strings.Cut(after, "\n\n")
			required = helpFlags(section)
		}
		if !slices.Equal(required, want[verb]) {
			t.Errorf("%s: required flags %q, want %q", verb, required, want[verb])
		}
		for _, name := range required {
			if slices.Contains(helpFlags(strings.SplitAfter(help, "\nFlags:\n")[1]), name) {
				t.Errorf("%s: --%s is listed twice", verb, name)
			}
			r := run(t, verb, "demo")
			if msg := fmt.Sprint(r.err); r.code != exitcode.Usage || !strings.HasPrefix(msg, "--"+name+" is required") {
				t.Errorf("%s without --%s: exit %d, %v; want the verb's own refusal", verb, name, r.code, r.err)
			}
		}
	}
}
