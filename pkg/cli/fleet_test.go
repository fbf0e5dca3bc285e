package cli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
)

// A fleet stopped by SIGTERM reports its stopped clusters with 143, as the
// process exits, and keeps the codes of clusters that failed for a reason of
// their own; a cluster done by an earlier attempt says so.
func TestFleetRowsOfAStoppedRun(t *testing.T) {
	a, b, c, d, e := fleet.Cluster{Namespace: "n", Name: "a"}, fleet.Cluster{Namespace: "n", Name: "b"},
		fleet.Cluster{Namespace: "n", Name: "c"}, fleet.Cluster{Namespace: "n", Name: "d"}, fleet.Cluster{Namespace: "n", Name: "e"}
	code := func(c int) *int { return &c }
	run := fleet.RunRecord{Clusters: []fleet.ClusterRecord{
		{Cluster: a, State: fleet.Stopped, ExitCode: code(exitcode.Terminated)},
		{Cluster: b, State: fleet.Stopped, ExitCode: code(exitcode.Failure)},
		{Cluster: c, State: fleet.Failed, ExitCode: code(exitcode.Locked)},
		{Cluster: d, State: fleet.Pending},
		{Cluster: e, State: fleet.Done, ExitCode: code(0)},
	}}
	ran := map[fleet.Cluster]bool{a: true, b: true, c: true}
	rows, failed, notStarted, codes := recordRows(run, nil, ran, exitcode.Terminated)
	want := []struct {
		result string
		code   int
	}{{"stopped", 143}, {"stopped", 143}, {"failed", exitcode.Locked}, {"not started", -1}, {"done", 0}}
	for i, w := range want {
		got := rows[i]
		code := -1
		if got.ExitCode != nil {
			code = *got.ExitCode
		}
		if got.Result != w.result || code != w.code {
			t.Errorf("%s: %s, exit %d; want %s, exit %d", got.Cluster, got.Result, code, w.result, w.code)
		}
	}
	if !strings.HasPrefix(rows[4].Message, "done earlier") {
		t.Errorf("a cluster done by an earlier attempt says %q, want done earlier", rows[4].Message)
	}
	if failed != 3 || notStarted != 1 || exitcode.Worst(codes...) != exitcode.Terminated {
		t.Errorf("failed %d, not started %d, worst %d; want 3, 1, 143", failed, notStarted, exitcode.Worst(codes...))
	}
}

// TestBlankSelectorIsRefused: -l ' ' parses to a selector that matches every
// Cluster, so -A -l ' ' would act on the whole fleet without the --yes that
// -A alone needs (and -l ' ' on every Cluster of the namespace). A selector
// without a requirement is bad usage, whatever the verb, before Run.
func TestBlankSelectorIsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"upgrade", "-A", "-l", " ", "--version", "v1.36.3"},
		{"upgrade", "-A", "-l", "\t", "--version", "v1.36.3", "--yes"},
		{"upgrade", "-l", "  ", "--version", "v1.36.3"},
		{"scale", "-A", "-l", " ", "--replicas", "3"},
		{"handback", "-A", "-l", " "},
		{"status", "-A", "-l", " "},
		{"plan", "-A", "-l", " ", "--version", "v1.36.3"},
	} {
		t.Run(fmt.Sprintf("%q", args), func(t *testing.T) {
			isolate(t)
			reached, r := parseVerb(t, args...)
			if r.code != exitcode.Usage || reached {
				t.Fatalf("exit %d, reached Run %v (err: %v); want exit 2 before Run", r.code, reached, r.err)
			}
			for _, want := range []string{"-l \"", "has no requirement", "every Cluster"} {
				if !strings.Contains(r.err.Error(), want) {
					t.Errorf("error %q lacks %q", r.err, want)
				}
			}
			if strings.Contains(r.err.Error(), "\n") {
				t.Errorf("error is not one line: %q", r.err)
			}
		})
	}
}
