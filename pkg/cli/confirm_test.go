package cli

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// The tests' streams are no terminal, as a script's are: -A alone on a verb
// that changes clusters needs --yes, and is refused at once without it.
func TestEveryClusterNeedsYesWithoutATerminal(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		refused bool
	}{
		{[]string{"upgrade", "-A", "--version", "v1.36.3"}, true},
		{[]string{"scale", "-A", "--replicas", "3"}, true},
		{[]string{"handback", "-A"}, true},
		{[]string{"handback", "--all-namespaces", "--force"}, true},
		{[]string{"upgrade", "-A", "--version", "v1.36.3", "--yes"}, false},
		{[]string{"scale", "-A", "--replicas", "3", "--yes", "--parallel", "2"}, false},
		{[]string{"handback", "-A", "--yes"}, false},
		// A selector names the clusters; a dry run and the read-only verbs
		// change nothing.
		{[]string{"upgrade", "-A", "-l", "env=staging", "--version", "v1.36.3"}, false},
		{[]string{"upgrade", "-l", "env=staging", "--version", "v1.36.3"}, false},
		{[]string{"upgrade", "-A", "--version", "v1.36.3", "--dry-run"}, false},
		{[]string{"scale", "-A", "--replicas", "3", "--dry-run"}, false},
		{[]string{"status", "-A"}, false},
		{[]string{"plan", "-A", "--version", "v1.36.3"}, false},
		// How many clusters -l selects is known only once they are listed.
		{[]string{"handback", "-l", "env=staging"}, false},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			isolate(t)
			reached, r := parseVerb(t, tc.args...)
			if !tc.refused {
				if !reached {
					t.Fatalf("did not reach Run: %v", r.err)
				}
				return
			}
			if reached || r.code != exitcode.Usage {
				t.Fatalf("exit %d, reached Run %v (err: %v); want exit 2 before Run", r.code, reached, r.err)
			}
			msg := r.err.Error()
			for _, want := range []string{"-A without -l acts on every cluster in every namespace", "pass --yes", "nothing was changed"} {
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

// parseVerb runs args through the command tree with the verb args[0]
// names stopped at its runF seam, and says whether the seam was reached.
func parseVerb(t *testing.T, args ...string) (reached bool, r result) {
	t.Helper()
	switch args[0] {
	case "upgrade":
		o, r := parse(t, NewCmdUpgrade, args...)
		return o != nil, r
	case "scale":
		o, r := parse(t, NewCmdScale, args...)
		return o != nil, r
	case "handback":
		o, r := parse(t, NewCmdHandback, args...)
		return o != nil, r
	case "status":
		o, r := parse(t, NewCmdStatus, args...)
		return o != nil, r
	case "plan":
		o, r := parse(t, NewCmdPlan, args...)
		return o != nil, r
	}
	t.Fatalf("no seam for %s", args[0])
	return false, result{}
}

// The read-only verbs have nothing to confirm, so they take no --yes.
func TestReadOnlyVerbsTakeNoYes(t *testing.T) {
	isolate(t)
	for _, args := range [][]string{{"status", "-A", "--yes"}, {"plan", "-A", "--version", "v1.36.3", "--yes"}, {"replace", "demo", "m", "--yes"}} {
		if r := run(t, args...); r.code != exitcode.Usage || !strings.Contains(r.err.Error(), "unknown flag: --yes") {
			t.Errorf("%v: exit %d, err %v", args, r.code, r.err)
		}
	}
}

// On a terminal the command can ask instead: Validate lets it through, and
// Run asks once the clusters are listed.
func TestEveryClusterOnATerminalIsAskedInRun(t *testing.T) {
	c := confirmation{CanAsk: true}
	if err := c.validateEveryCluster("upgrade", &selection{AllNamespaces: true}); err != nil {
		t.Fatal(err)
	}
}

var twoClusters = []fleet.Cluster{{Namespace: "a", Name: "one"}, {Namespace: "b", Name: "two"}}

func TestConfirmAsksAtATerminal(t *testing.T) {
	for _, tc := range []struct {
		answer string
		yes    bool
	}{
		{"y\n", true}, {"Yes\n", true}, {" y \n", true},
		{"n\n", false}, {"\n", false}, {"", false}, {"yep\n", false},
	} {
		var errOut bytes.Buffer
		streams := genericiooptions.IOStreams{In: strings.NewReader(tc.answer), Out: &bytes.Buffer{}, ErrOut: &errOut}
		c := confirmation{CanAsk: true}
		err := c.confirm(context.Background(), streams, "upgrade to v1.36.3", twoClusters)
		if want := "upgrade to v1.36.3 would act on these 2 clusters:\n  a/one\n  b/two\nProceed? [y/N] "; errOut.String() != want {
			t.Errorf("%q: asked\n%q\nwant\n%q", tc.answer, errOut.String(), want)
		}
		switch {
		case tc.yes && err != nil:
			t.Errorf("%q: %v, want to proceed", tc.answer, err)
		case !tc.yes && (exitcode.Of(err) != exitcode.Usage || !strings.Contains(err.Error(), "upgrade to v1.36.3 not confirmed; nothing was changed")):
			t.Errorf("%q: %v, want exit 2 saying it was not confirmed", tc.answer, err)
		}
	}
}

func TestConfirmWithoutATerminalRefusesAndYesProceeds(t *testing.T) {
	var errOut bytes.Buffer
	streams := genericiooptions.IOStreams{In: strings.NewReader("y\n"), Out: &bytes.Buffer{}, ErrOut: &errOut}
	err := (&confirmation{}).confirm(context.Background(), streams, "handback", twoClusters)
	if exitcode.Of(err) != exitcode.Usage || err.Error() != "handback would act on 2 clusters (a/one, b/two): pass --yes to confirm; nothing was changed" {
		t.Errorf("without a terminal: %v", err)
	}
	if errOut.Len() != 0 {
		t.Errorf("asked where nobody can answer: %q", errOut.String())
	}
	for _, c := range []confirmation{{Yes: true}, {Yes: true, CanAsk: true}} {
		if err := c.confirm(context.Background(), streams, "handback", twoClusters); err != nil || errOut.Len() != 0 {
			t.Errorf("%+v: %v, asked %q", c, err, errOut.String())
		}
	}
}

// An interrupt ends the question as it ends a run, though the read of the
// terminal goes on.
func TestConfirmEndsWithTheContext(t *testing.T) {
	in, w := io.Pipe()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	streams := genericiooptions.IOStreams{In: in, Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}
	if err := (&confirmation{CanAsk: true}).confirm(ctx, streams, "handback", twoClusters); !errors.Is(err, context.Canceled) {
		t.Fatalf("%v, want the context's end", err)
	}
}

// A handback of one cluster by selector goes ahead; of more than one, or of
// every cluster, it needs the confirmation.
func TestHandbackOfSeveralClustersIsConfirmed(t *testing.T) {
	for _, tc := range []struct {
		sel      selection
		clusters []fleet.Cluster
		yes      bool
		refused  bool
	}{
		{selection{Selector: "env=a"}, twoClusters[:1], false, false},
		{selection{Selector: "env=a", AllNamespaces: true}, twoClusters[:1], false, false},
		{selection{Selector: "env=a"}, twoClusters, false, true},
		{selection{AllNamespaces: true}, twoClusters[:1], false, true},
		{selection{Selector: "env=a"}, twoClusters, true, false},
	} {
		o := NewHandbackOptions(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}})
		o.sel, o.consent.Yes = tc.sel, tc.yes
		err := o.confirmHandback(context.Background(), tc.clusters)
		if refused := exitcode.Of(err) == exitcode.Usage; refused != tc.refused {
			t.Errorf("%+v of %d clusters, --yes %v: %v, want refused %v", tc.sel, len(tc.clusters), tc.yes, err, tc.refused)
		}
	}
}

// parseRun is parseVerb for the five run verbs, with the options' change
// part to look at.
func parseRun(t *testing.T, args ...string) (*changeOptions, result) {
	t.Helper()
	switch args[0] {
	case "upgrade":
		o, r := parse(t, NewCmdUpgrade, args...)
		if o == nil {
			return nil, r
		}
		return &o.change, r
	case "scale":
		o, r := parse(t, NewCmdScale, args...)
		if o == nil {
			return nil, r
		}
		return &o.change, r
	case "replace":
		o, r := parse(t, NewCmdReplace, args...)
		if o == nil {
			return nil, r
		}
		return &o.change, r
	case "rollout":
		o, r := parse(t, NewCmdRollout, args...)
		if o == nil {
			return nil, r
		}
		return &o.change, r
	case "restart":
		o, r := parse(t, NewCmdRestart, args...)
		if o == nil {
			return nil, r
		}
		return &o.change, r
	}
	t.Fatalf("no seam for %s", args[0])
	return nil, result{}
}

// --interactive needs someone to answer: the tests' streams are no terminal,
// as a script's are, so every run verb refuses it at once, and before that
// the command line's own conflicts (-l/-A, -o json) whatever the terminal.
func TestInteractiveIsRefusedWhereNobodyCanAnswer(t *testing.T) {
	const (
		noTerminal = "--interactive needs a terminal on stdin and stderr"
		fleet      = "cannot go with -l/-A (many clusters at once)"
		json       = "--interactive cannot go with -o json"
	)
	for _, tc := range []struct {
		args []string
		says string // "": accepted
	}{
		{[]string{"upgrade", "demo", "--version", "v1.36.3", "--interactive"}, noTerminal},
		{[]string{"scale", "demo", "--replicas", "5", "--interactive"}, noTerminal},
		{[]string{"replace", "demo", "demo-control-plane-abc", "--interactive"}, noTerminal},
		{[]string{"rollout", "demo", "--interactive"}, noTerminal},
		{[]string{"restart", "demo", "--interactive"}, noTerminal},
		{[]string{"upgrade", "-l", "env=staging", "--version", "v1.36.3", "--interactive"}, fleet},
		{[]string{"restart", "-A", "--yes", "--interactive"}, fleet},
		{[]string{"upgrade", "demo", "--version", "v1.36.3", "--interactive", "-o", "json"}, json},
		{[]string{"scale", "demo", "--replicas", "5", "-o", "json", "--interactive=true"}, json},
		// A plan asks nothing; without the flag nothing is asked either.
		{[]string{"upgrade", "demo", "--version", "v1.36.3", "--interactive", "--dry-run"}, ""},
		{[]string{"upgrade", "demo", "--version", "v1.36.3", "--interactive=false", "-o", "json"}, ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			isolate(t)
			o, r := parseRun(t, tc.args...)
			if tc.says == "" {
				if o == nil {
					t.Fatalf("did not reach Run: %v", r.err)
				}
				return
			}
			if o != nil || r.code != exitcode.Usage {
				t.Fatalf("exit %d, reached Run %v (err: %v); want exit 2 before Run", r.code, o != nil, r.err)
			}
			msg := r.err.Error()
			if !strings.Contains(msg, tc.says) || !strings.HasSuffix(msg, "nothing was changed") {
				t.Errorf("error %q, want it to say %q and that nothing was changed", msg, tc.says)
			}
			if strings.Contains(msg, "\n") || r.out != "" || r.log != "" {
				t.Errorf("want one line and nothing printed: error %q, stdout %q, stderr %q", msg, r.out, r.log)
			}
		})
	}
}

// At a terminal, one cluster's run in text may ask; the command line's
// conflicts hold there too.
func TestInteractiveAtATerminal(t *testing.T) {
	c := confirmation{CanAsk: true}
	if err := c.validateInteractive(false, "text"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		fleet  bool
		output string
	}{{true, "text"}, {false, "json"}} {
		if err := c.validateInteractive(tc.fleet, tc.output); exitcode.Of(err) != exitcode.Usage {
			t.Errorf("fleet %v, -o %s: %v, want exit 2", tc.fleet, tc.output, err)
		}
	}
}

var firstDone = rollout.Boundary{Done: 1, Total: 3, Added: "demo-control-plane-xyz", Removed: "demo-control-plane-abc"}

// The question between machines, through a fake terminal: y goes on; any
// other answer, or none, stops the run as Ctrl-C does (exit 130), saying how
// to resume or hand back. The progress is held before the question.
func TestBetweenMachinesAsksAtTheTerminal(t *testing.T) {
	for _, tc := range []struct {
		answer string
		goOn   bool
	}{
		{"y\n", true}, {"YES\n", true}, {" y\n", true},
		{"n\n", false}, {"\n", false}, {"", false}, {"continue\n", false},
	} {
		var errOut bytes.Buffer
		streams := genericiooptions.IOStreams{In: strings.NewReader(tc.answer), Out: &bytes.Buffer{}, ErrOut: &errOut}
		held := 0
		err := betweenMachines(streams, func() { held++ }, "demo", "default")(context.Background(), firstDone)
		if want := "machine 1/3 done (demo-control-plane-abc replaced by demo-control-plane-xyz); continue with 2/3? [y/N] "; errOut.String() != want {
			t.Errorf("%q: asked\n%q\nwant\n%q", tc.answer, errOut.String(), want)
		}
		if held != 1 {
			t.Errorf("%q: progress held %d times before the question, want once", tc.answer, held)
		}
		if tc.goOn {
			if err != nil {
				t.Errorf("%q: %v, want to go on", tc.answer, err)
			}
			continue
		}
		if exitcode.Of(err) != exitcode.Interrupted || rollout.Failed(err) {
			t.Errorf("%q: exit %d (%v), want 130, a stop and no failure", tc.answer, exitcode.Of(err), err)
			continue
		}
		for _, want := range []string{"stopped before machine 2/3", "nothing is in flight", "re-run the same command",
			"`kubectl cp-rollout handback demo -n default`"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q: %q does not say %q", tc.answer, err, want)
			}
		}
	}
}

// Ctrl-C at the question ends it as it ends a run: the signal's stop, not an
// answer.
func TestBetweenMachinesEndsWithTheContext(t *testing.T) {
	in, w := io.Pipe()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var errOut bytes.Buffer
	streams := genericiooptions.IOStreams{In: in, Out: &bytes.Buffer{}, ErrOut: &errOut}
	err := betweenMachines(streams, func() {}, "demo", "default")(ctx, firstDone)
	if !errors.Is(err, context.Canceled) || exitcode.Of(err) == exitcode.Interrupted {
		t.Fatalf("%v, want the context's end itself", err)
	}
	if !strings.HasSuffix(errOut.String(), "[y/N] \n") {
		t.Errorf("the line after the question would start on it: %q", errOut.String())
	}
}
