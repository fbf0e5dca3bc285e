package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// TestArgumentErrorsHaveOneWording: every verb refuses the wrong number of
// arguments in the same words, what it takes and how many it got, and none
// in cobra's ("accepts 1 arg(s), received 0", "unknown command").
func TestArgumentErrorsHaveOneWording(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"upgrade", "a", "b", "--version", "v1.36.3"}, "upgrade takes at most one argument, the Cluster's name (or -l/-A instead); got 2"},
		{[]string{"status", "a", "b", "c"}, "status takes at most one argument, the Cluster's name (or -l/-A instead); got 3"},
		{[]string{"resume", "a", "b"}, "handback takes at most one argument, the Cluster's name (or -l/-A instead); got 2"},
		{[]string{"rbac", "a", "b"}, "rbac takes at most one argument, the Cluster's name; got 2"},
		{[]string{"version", "extra"}, "version takes no arguments; got 1"},
		{[]string{"options", "extra"}, "options takes no arguments; got 1"},
		{[]string{"completion"}, "completion needs one argument, the shell: bash, zsh, fish, powershell; got 0"},
		{[]string{"completion", "bash", "zsh"}, "completion needs one argument, the shell: bash, zsh, fish, powershell; got 2"},
		{[]string{"completion", "tcsh"}, `completion needs one argument, the shell: bash, zsh, fish, powershell; got "tcsh"`},
		{[]string{"pause"}, "pause needs one argument, the Cluster's name; got 0"},
		{[]string{"replace", "a"}, "replace needs two arguments, the Cluster's name and the Machine's; got 1"},
	} {
		r := run(t, tc.args...)
		if r.code != exitcode.Usage || fmt.Sprint(r.err) != tc.want {
			t.Errorf("%q: exit %d, %v; want exit 2, %s", tc.args, r.code, r.err, tc.want)
		}
	}
}

// TestUsageErrorNamesTheVerb: Run says which command refused, so that main's
// hint names that verb's --help, which lists its flags; the root's when no
// verb was found.
func TestUsageErrorNamesTheVerb(t *testing.T) {
	isolate(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"upgrade", "demo", "--bogus"}, "kubectl cp-rollout upgrade"},
		{[]string{"upgrade", "a", "b"}, "kubectl cp-rollout upgrade"},
		{[]string{"resume"}, "kubectl cp-rollout handback"},
		{[]string{"completion", "tcsh"}, "kubectl cp-rollout completion"},
		{[]string{"upgarde"}, "kubectl cp-rollout"},
	} {
		streams := genericiooptions.IOStreams{In: strings.NewReader(""), Out: &strings.Builder{}, ErrOut: &strings.Builder{}}
		res, err := Run(context.Background(), streams, tc.args)
		if exitcode.Of(err) != exitcode.Usage || res.Command != tc.want {
			t.Errorf("%q: %v, command %q; want a usage error of %q", tc.args, err, res.Command, tc.want)
		}
	}
}

// TestResumeIsHandback: resume, as clusterctl and kubectl call it, is
// handback under another name, and its help says so.
func TestResumeIsHandback(t *testing.T) {
	isolate(t)
	o, r := parse(t, NewCmdHandback, "resume", "demo", "-o", "json")
	if o == nil || o.conn.Cluster != "demo" || o.output.Output != "json" {
		t.Fatalf("resume demo -o json: %+v, %v", o, r.err)
	}
	help := run(t, "handback", "--help").out
	for _, want := range []string{"Aliases:\n  handback, resume\n", `"kubectl cp-rollout resume CLUSTER" is the same command`} {
		if !strings.Contains(help, want) {
			t.Errorf("handback --help lacks %q", want)
		}
	}
	if root := run(t, "--help").out; !strings.Contains(root, "(alias: resume)") {
		t.Errorf("the verbs' list does not name resume:\n%s", root)
	}
}
