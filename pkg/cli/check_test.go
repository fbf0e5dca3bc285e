package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/readiness"
)

func sampleReport(skip ...string) *checkReport {
	findings := []readiness.Finding{
		{Check: "removed-apis", Result: readiness.Block, Found: "flowschemas.v1beta3 requested, removed in v1.32", Do: "migrate to v1"},
		{Check: "etcd", Result: readiness.Warn, Found: "db 85% of quota", Do: "defragment"},
		{Check: "coredns", Result: readiness.Pass, Found: "Corefile migrates to 1.12.1"},
	}
	for i, f := range findings {
		for _, s := range skip {
			findings[i].Skipped = findings[i].Skipped || f.Check == s
		}
	}
	return &checkReport{Cluster: "demo", Namespace: "default", From: "v1.35.2", Version: "v1.36.3", Findings: findings}
}

// A block refuses with exit 3 naming the check and what it found; a block
// skipped by name refuses nothing; a warning never does.
func TestCheckReportRefusal(t *testing.T) {
	err := sampleReport().refusal()
	if exitcode.Of(err) != exitcode.Unsafe || !strings.Contains(err.Error(), "removed-apis blocks (flowschemas") ||
		!strings.Contains(err.Error(), "--skip-check removed-apis") || strings.Contains(err.Error(), "etcd") {
		t.Fatalf("refusal %v (exit %d): want exit 3 naming removed-apis and its skip", err, exitcode.Of(err))
	}
	if err := sampleReport("removed-apis").refusal(); err != nil {
		t.Fatalf("a skipped block refused: %v", err)
	}
}

// The table has a row per finding, a skipped one marked; over a fleet a
// CLUSTER column leads, and -o json is a report a line.
func TestCheckPrints(t *testing.T) {
	var table bytes.Buffer
	if err := printFindings(&table, checkView{sampleReport("removed-apis")}, false, tableOptions{}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(table.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "CHECK") || !strings.Contains(lines[1], "block (skipped)") || !strings.Contains(lines[3], "pass") {
		t.Fatalf("table:\n%s", table.String())
	}
	o := NewCheckOptions(genericiooptions.IOStreams{})
	o.sel.AllNamespaces = true
	o.output.Output = "json"
	if err := o.output.complete(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := o.print(&out, []*checkReport{sampleReport(), sampleReport()}); err != nil {
		t.Fatal(err)
	}
	reports := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r checkReport
	if len(reports) != 2 || json.Unmarshal([]byte(reports[0]), &r) != nil || len(r.Findings) != 3 || r.Findings[0].Result != readiness.Block {
		t.Fatalf("-o json over a fleet:\n%s", out.String())
	}
}
