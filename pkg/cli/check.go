package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/readiness"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// CheckOptions asks whether a cluster will survive a new Kubernetes
// version: the readiness checks (package readiness) that upgrade and plan
// also make, shown on their own.
type CheckOptions struct {
	conn connection
	sel  selection
	// Version is the target; skip names the checks accepted knowingly.
	Version string
	skip    skipChecks
	output  printFlags
	Streams genericiooptions.IOStreams
}

// NewCheckOptions returns the check verb's defaults.
func NewCheckOptions(streams genericiooptions.IOStreams) *CheckOptions {
	return &CheckOptions{output: printFlags{Output: "text", values: checkOutputs}, Streams: streams}
}

// checkOutputs are the values of check's -o: status's, but name and
// custom-columns print a line per finding.
var checkOutputs = statusOutputs

// NewCmdCheck returns the check verb. runF, when set, replaces Run, so tests
// can see what the flags resolve to.
func NewCmdCheck(root *RootOptions, runF func(*CheckOptions) error) *cobra.Command {
	o := NewCheckOptions(root.Streams)
	o.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "check (CLUSTER | -l SELECTOR | -A) --version VERSION",
		Short: "Check that a cluster is ready for a Kubernetes version: removed APIs, skew, drain blockers, webhooks, etcd, CoreDNS, certificates",
		Long: `Check what an upgrade of CLUSTER to VERSION would break outside the rollout
itself, as managed Kubernetes services check before they upgrade: one row per
check, with its result (pass, warn or block), what was found and what to do.

` + checkList() + `

Read-only. The same checks run inside plan and before upgrade takes a cluster
over: a block refuses the upgrade (exit 3) with nothing changed, unless the
check is named with --skip-check to accept it knowingly. check itself exits 3
when a check blocks, 0 otherwise (warnings included).

With -l SELECTOR or -A instead of CLUSTER, every matching cluster is checked
in turn.`,
		Example: `  kubectl cp-rollout check prod-eu1 --version v1.36.3
  kubectl cp-rollout check prod-eu1 --version v1.36.3 -o json | jq '.findings[] | select(.result != "pass")'
  kubectl cp-rollout check -A -l env=staging --version v1.36.3 -o custom-columns=CLUSTER:.cluster,CHECK:.check,RESULT:.result`,
		Args:              clusterOrSelection,
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Version, "version", "", "The Kubernetes version to check for, e.g. v1.36.3 (required)")
	o.skip.addFlag(cmd)
	addOutputFlag(cmd, &o.output.Output, o.output.values, "Output format: text (a row per check), wide (with how long each took), json (one object; over -l/-A one compact object per cluster, a line each), yaml (that object; over -l/-A the list of them), name (a line per finding), jsonpath=TEMPLATE or go-template=TEMPLATE (read the object -o json prints), or custom-columns=HEADER:FIELD,... (a line per finding)")
	f.BoolVar(&o.output.NoHeaders, "no-headers", false, "With the text, wide and custom-columns formats: print no column headers")
	o.conn.addEtcdEndpointFlag(f)
	o.sel.addFlags(f)
	return cmd
}

// checkList is the checks, a line each, for --help.
func checkList() string {
	var b strings.Builder
	b.WriteString("The checks:")
	for _, ch := range readiness.Checks {
		fmt.Fprintf(&b, "\n  %-21s %s", ch.Name, ch.What)
	}
	return b.String()
}

// Complete takes the cluster's name, if given, and makes the printer.
func (o *CheckOptions) Complete(cmd *cobra.Command, args []string) error {
	o.conn.completeCluster(args)
	return o.output.complete()
}

// Validate checks the flags; it changes nothing.
func (o *CheckOptions) Validate() error {
	if err := validateSelection("check", o.conn.Cluster, o.sel); err != nil {
		return err
	}
	if o.Version == "" {
		return exitcode.Usagef("--version is required, e.g. --version v1.36.3")
	}
	if _, err := rollout.ParseVersion("--version", o.Version); err != nil {
		return err
	}
	if err := o.skip.validate(); err != nil {
		return err
	}
	return o.conn.validateEtcdEndpoint()
}

func (o *CheckOptions) where() (cluster, namespace string) { return o.conn.where(&o.sel) }

// Run checks the cluster, or each selected one, prints the findings, and
// fails with exit 3 when a check blocks.
func (o *CheckOptions) Run(ctx context.Context) error {
	if !o.sel.fleet() {
		report, err := o.check(ctx, o.conn)
		if report != nil {
			if perr := o.print(o.Streams.Out, []*checkReport{report}); perr != nil {
				return perr
			}
		}
		if err != nil {
			return err
		}
		return report.refusal()
	}
	clusters, skipped, err := o.conn.selectClusters(ctx, o.sel)
	if err != nil {
		return err
	}
	var reports []*checkReport
	err = o.conn.inTurn(ctx, o.Streams.ErrOut, clusters, skipped, func(one connection) error {
		report, err := o.check(ctx, one)
		if err != nil {
			return err
		}
		reports = append(reports, report)
		return report.refusal()
	})
	if perr := o.print(o.Streams.Out, reports); perr != nil {
		return perr
	}
	return err
}

// check reads one cluster and makes every check on it.
func (o *CheckOptions) check(ctx context.Context, conn connection) (*checkReport, error) {
	c, err := conn.connect(ctx, readOnly(o.Streams.ErrOut))
	if err != nil {
		return nil, err
	}
	defer c.close()
	s, err := c.engine.SnapshotOf(ctx, c.first)
	if err != nil {
		return nil, err
	}
	return readinessOf(ctx, c, s, o.Version, rollout.DefaultTimeouts, o.skip.names)
}

// readinessOf makes every check on the cluster c connected to, as s shows
// it, for an upgrade to version within timeouts' waits.
func readinessOf(ctx context.Context, c *connected, s *rollout.Snapshot, version string, timeouts rollout.Timeouts, skip []string) (*checkReport, error) {
	cp := s.CP
	if c.workload == nil {
		return nil, exitcode.Forbiddenf("the readiness checks read the workload cluster of %s/%s, which needs its Secret %s-kubeconfig", cp.Cluster.Namespace, cp.Cluster.Name, cp.Cluster.Name)
	}
	target, err := rollout.ParseVersion("--version", version)
	if err != nil {
		return nil, err
	}
	from, err := rollout.ParseVersion("the KubeadmControlPlane's spec.version", cp.KCP.Spec.Version)
	if err != nil {
		return nil, err
	}
	capi, _ := c.cp.KCPControllerVersion(ctx) // "" when unknown: the check says so
	findings := readiness.Run(ctx, &readiness.Cluster{
		Snapshot: s, From: from, Target: target, Management: c.cp.Kube(), Workload: c.workload,
		CAPIVersion: capi, RunLimit: runLimit(timeouts, cp),
	}, skip)
	return &checkReport{Cluster: cp.Cluster.Name, Namespace: cp.Cluster.Namespace, From: cp.KCP.Spec.Version, Version: version, Findings: findings}, nil
}

// runLimit is the longest a rollout of cp may take within timeouts: every
// machine replaced, each wait to its limit — the join, the DaemonSets (a
// second --health-timeout), the gate, the soak and the deletion. A
// certificate that expires sooner may lapse mid-run.
func runLimit(t rollout.Timeouts, cp *kcpstate.ControlPlane) time.Duration {
	// A wait without a limit (0) is counted at its default: a run that
	// could last for ever has no horizon to judge a certificate by.
	limit := func(d, otherwise time.Duration) time.Duration {
		if d > 0 {
			return d
		}
		return otherwise
	}
	d := rollout.DefaultTimeouts
	perMachine := limit(t.Provision, d.Provision) + 2*limit(t.Health, d.Health) + t.Settle + limit(t.Delete, d.Delete)
	if t.Gates.Command != "" {
		perMachine += t.Gates.Limit()
	}
	machines := max(len(cp.Machines), 1)
	return time.Duration(machines) * perMachine
}

// checkReport is one cluster's findings: -o json's object.
type checkReport struct {
	Cluster   string              `json:"cluster"`
	Namespace string              `json:"namespace"`
	From      string              `json:"from"`
	Version   string              `json:"version"`
	Findings  []readiness.Finding `json:"findings"`
}

// refusal is the exit-3 error of a report with a block not skipped, naming
// each such check and the way past it; nil otherwise.
func (r *checkReport) refusal() error {
	blockers := readiness.Blockers(r.Findings)
	if len(blockers) == 0 {
		return nil
	}
	names := make([]string, len(blockers))
	for i, f := range blockers {
		names[i] = f.Check
	}
	verb := "blocks"
	if len(names) > 1 {
		verb = "block"
	}
	return exitcode.Unsafef("%s/%s is not ready for %s: %s %s (%s); fix what it found, or accept it knowingly with --skip-check %s",
		r.Namespace, r.Cluster, r.Version, strings.Join(names, ", "), verb, blockers[0].Found, strings.Join(names, ","))
}

// checkView is what check prints: each cluster's report, and its findings
// as rows.
type checkView []*checkReport

func (v checkView) docs() []doc {
	docs := make([]doc, len(v))
	for i, r := range v {
		docs[i] = doc{r.Namespace + "/" + r.Cluster, r}
	}
	return docs
}

// findingRow is a finding with its cluster, for custom-columns over a
// fleet.
type findingRow struct {
	Cluster   string `json:"cluster"`
	Namespace string `json:"namespace"`
	readiness.Finding
}

func (v checkView) rowSet() []row {
	var rows []row
	for _, r := range v {
		for _, f := range r.Findings {
			rows = append(rows, row{"check", f.Check, findingRow{r.Cluster, r.Namespace, f}})
		}
	}
	return rows
}

func (o *CheckOptions) print(out io.Writer, reports []*checkReport) error {
	v := checkView(reports)
	return o.output.print(out, v, o.sel.fleet(), func(opts tableOptions) error {
		return printFindings(out, v, o.sel.fleet(), opts)
	})
}

// printFindings is the table of check: a row per finding, with its cluster
// over a fleet; -o wide adds how long each check took.
func printFindings(out io.Writer, v checkView, fleet bool, opts tableOptions) error {
	names := []string{"CHECK", "RESULT", "FOUND", "DO"}
	if fleet {
		names = slices.Insert(names, 0, "CLUSTER")
	}
	var cells [][]any
	for _, r := range v {
		for _, f := range r.Findings {
			result := string(f.Result)
			if f.Skipped {
				result += " (skipped)"
			}
			line := []any{f.Check, result, f.Found, dash(f.Do), f.Took.Round(time.Millisecond).String()}
			if fleet {
				line = slices.Insert(line, 0, any(r.Namespace+"/"+r.Cluster))
			}
			cells = append(cells, line)
		}
	}
	w := newTabWriter(out)
	if err := printTable(w, tableColumns(names, "TOOK"), cells, opts); err != nil {
		return err
	}
	return w.Flush()
}

// skipChecks is --skip-check: the checks whose block or warning the
// operator accepts knowingly.
type skipChecks struct{ names []string }

func (s *skipChecks) addFlag(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&s.names, "skip-check", nil, "Accept a readiness check's block knowingly, by name (repeatable): it is still reported; one of "+strings.Join(readiness.Names(), ", "))
	_ = cmd.RegisterFlagCompletionFunc("skip-check", cobra.FixedCompletions(readiness.Names(), cobra.ShellCompDirectiveNoFileComp))
}

func (s *skipChecks) validate() error {
	if err := readiness.ValidateSkip(s.names); err != nil {
		return exitcode.New(exitcode.Usage, err)
	}
	return nil
}

// printFindingLines says, a line each, what the readiness checks found that
// is not a pass: what a run prints on stderr before it takes the cluster
// over.
func printFindingLines(w io.Writer, r *checkReport) {
	for _, f := range r.Findings {
		if f.Result == readiness.Pass {
			continue
		}
		skipped := ""
		if f.Skipped {
			skipped = " (skipped with --skip-check)"
		}
		fmt.Fprintf(w, "readiness check %s: %s%s: %s", f.Check, f.Result, skipped, f.Found)
		if f.Do != "" {
			fmt.Fprintf(w, "; do: %s", f.Do)
		}
		fmt.Fprintln(w)
	}
}
