package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/readiness"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// PendingExitCode is what `plan --exit-code` returns when steps are pending.
const PendingExitCode = 10

// printPlans prints the plan of the named cluster, or of each selected one
// in turn, and reports whether any has steps. Over several clusters a
// cluster whose plan cannot be made does not stop the others; the error
// carries the worst exit code.
func (o *requestOptions) printPlans(ctx context.Context) (pending bool, err error) {
	if !o.sel.fleet() {
		return o.printPlan(ctx)
	}
	clusters, skipped, err := o.conn.selectClusters(ctx, o.sel)
	if err != nil {
		return false, err
	}
	if err := o.printSchedule(ctx); err != nil {
		return false, err
	}
	first := true
	err = o.conn.inTurn(ctx, o.Streams.ErrOut, clusters, skipped, func(one connection) error {
		opts := *o
		opts.conn, opts.sel, opts.jsonLines = one, selection{}, true
		switch o.printer.format {
		case "text", "wide":
			// The tables carry no cluster: a heading names it.
			if !first {
				fmt.Fprintln(o.Streams.Out)
			}
			fmt.Fprintf(o.Streams.Out, "CLUSTER %s/%s\n", one.Namespace, one.Cluster)
		case "custom-columns":
			// One table of every cluster's steps: its header once.
			opts.printer.NoHeaders = o.printer.NoHeaders || !first
		}
		first = false
		p, err := opts.printPlan(ctx)
		pending = pending || p
		return err
	})
	return pending, err
}

// printPlan prints the plan for the request and reports whether it has
// steps. It also makes the checks the run makes before it locks or writes
// anything (runChecks), as the run makes them, so that the plan's outcome is
// the run's.
func (o *requestOptions) printPlan(ctx context.Context) (pending bool, err error) {
	c, err := o.conn.connect(ctx, readOnly(o.Streams.ErrOut))
	if err != nil {
		return false, err
	}
	defer c.close()
	refusal := o.conn.runChecks(ctx, c.cp, c.first.KCP)
	if c.cp.KubeadmConfigsUnread() {
		// Without them every machine would look to KCP's comparison as
		// if its KubeadmConfig matched, or were missing: no step decided
		// on that is the run's.
		return o.showPlan(nil, nil, nil, exitcode.Forbiddenf("a plan's steps compare the machines' KubeadmConfigs, which this identity may not get or list in namespace %s (Role %s grants it; `kubectl cp-rollout rbac %s -n %s` prints it)",
			o.conn.Namespace, "cp-rollout-operate-"+o.conn.Cluster, o.conn.Cluster, o.conn.Namespace), refusal)
	}
	prepared, err := c.engine.Prepare(ctx, o.request, c.first)
	var hops [][]rollout.Step
	var report *checkReport
	if err == nil && prepared.NothingToDo == "" {
		hops = rollout.PlanHops(ctx, prepared)
		report, err = o.readiness(ctx, c, prepared, rollout.DefaultTimeouts)
	}
	if refusal == nil && report != nil {
		refusal = report.refusal()
	}
	return o.showPlan(prepared, hops, report, err, refusal)
}

// showPlan prints the plan Prepare and PlanHops made with the readiness
// checks' report (nil but for an upgrade not begun), or the error that kept
// Prepare from making one (planErr), and reports whether it has steps. An
// error of runChecks (refusal) comes first, as in the run, which stops there
// before Prepare's checks or any step: the plan is still printed, and the
// error keeps its exit code with or without --exit-code, as a refusal among
// the steps does; when there is no plan, a warning says why. With -o json
// the plan stays one object on stdout, and main ends stdout with the
// error's.
func (o *requestOptions) showPlan(prepared *rollout.Prepared, hops [][]rollout.Step, report *checkReport, planErr, refusal error) (pending bool, err error) {
	refusal = wouldRefuse(refusal)
	switch {
	case planErr != nil && refusal != nil:
		fmt.Fprintf(o.Streams.ErrOut, "warning: no plan: %v\n", planErr)
		return false, refusal
	case planErr != nil:
		return false, planErr
	}
	if err := printPlan(o.Streams.Out, o.printer, o.jsonLines, o.request, prepared, hops, report); err != nil {
		return false, err
	}
	if refusal != nil {
		return false, refusal
	}
	for _, steps := range hops {
		for _, s := range steps {
			if s.Action == rollout.Refuse {
				return true, s.Err
			}
		}
		pending = pending || len(steps) > 0
	}
	return pending, nil
}

// wouldRefuse says that err, a refusal of runChecks (exit 3 or 6), is the
// run's and not the plan's: the plan itself needs neither the operate roles
// nor a proven KCP controller. Any other error kept a check from being made
// (a request that failed) and stays as it is.
func wouldRefuse(err error) error {
	switch code := exitcode.Of(err); code {
	case exitcode.Unsafe, exitcode.Forbidden:
		return exitcode.New(code, fmt.Errorf("the run would refuse: %w", err))
	}
	return err
}

// PlanOptions shows the steps a change would take, changing nothing.
type PlanOptions struct {
	req requestOptions
	// ExitCode makes pending steps exit PendingExitCode, for scripts.
	ExitCode bool

	// What the --version, --replicas, --replace, --rollout and --restart
	// flags hold; Complete turns the one given into the request.
	version  string
	via      []string
	replicas int32
	replace  string
	rollout  bool
	restart  bool
	expiring string // --certificates-expiring-within, with --rollout
	targets  int    // how many of those flags were given
}

// NewPlanOptions returns the plan verb's defaults.
func NewPlanOptions(streams genericiooptions.IOStreams) *PlanOptions {
	return &PlanOptions{req: newRequestOptions(streams, "")}
}

// NewCmdPlan returns the plan verb. runF, when set, replaces Run, so tests
// can see what the flags resolve to.
func NewCmdPlan(root *RootOptions, runF func(*PlanOptions) error) *cobra.Command {
	o := NewPlanOptions(root.Streams)
	o.req.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "plan (CLUSTER | -l SELECTOR | -A) (--version V | --replicas N | --replace MACHINE | --rollout | --restart)",
		Short: "Show the steps an upgrade, scale, replace, rollout or restart would take, changing nothing",
		Long: `Show, in order, the steps that upgrade, scale, replace, rollout or restart would
take on CLUSTER now, each with its reason, as the rollout loop itself would
decide them. Nothing is changed and no lock is taken. Those verbs with --dry-run
print the same plan. With -l/-A, each matching cluster's plan is printed in turn.
A plan depends on etcd's health and the nodes: without read access to the
cluster's two Secrets (see "kubectl cp-rollout rbac") it is refused, exit 6.

The plan also makes the checks the run makes before it changes anything: every
permission of the operate roles, and the KCP controller's version (detected,
or --kcp-version). When one of them would refuse the run, the plan is still
printed, and the command fails as the run would, with "the run would refuse:"
and the run's own reason: exit 6 for a missing permission, each named; exit 3
for a KCP controller this tool is not proven with. A plan of an upgrade also
shows the readiness checks (see "kubectl cp-rollout check"): a check that
blocks makes the plan fail as the run would, exit 3, unless it is named with
--skip-check. It fails so with or without
--exit-code, as it does for a step the run would refuse: an error the run
would meet is not a plan to follow. So with --exit-code, 10 means the run would
start and take steps, 0 that it would find nothing to do.`,
		Example: `  kubectl cp-rollout plan prod-eu1 --version v1.36.3
  kubectl cp-rollout plan prod-eu1 --replicas 5 -o json
  kubectl cp-rollout plan prod-eu1 --rollout --certificates-expiring-within 30d
  kubectl cp-rollout plan prod-eu1 --version v1.36.3 --exit-code || echo "rollout pending"`,
		Args:              clusterOrSelection,
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	f := cmd.Flags()
	// plan prints one object, not a run's events: its -o is its own.
	o.req.addFlagsWith(cmd, planOutputs, planOutputHelp)
	o.req.sel.addFlags(f)
	o.req.staged.addPlanFlags(f)
	// No wait limits, --dry-run or --on-failure: a plan changes nothing and
	// waits for nothing.
	f.StringVar(&o.version, "version", "", "Plan an upgrade to this Kubernetes version")
	f.StringSliceVar(&o.via, "via", nil, "With --version: the versions the upgrade passes through first, one rollout each")
	f.StringVar(&o.req.request.Template, "infrastructure-template", "", "With --version: the InfraMachineTemplate the new machines are made from")
	f.Int32Var(&o.replicas, "replicas", o.replicas, "Plan a scale to this many machines")
	f.StringVar(&o.replace, "replace", "", "Plan the replacement of this machine")
	_ = cmd.RegisterFlagCompletionFunc("replace", root.completePlanReplace)
	f.BoolVar(&o.rollout, "rollout", false, "Plan the rollout of the KubeadmControlPlane's spec as it stands (the outdated machines)")
	f.StringVar(&o.expiring, "certificates-expiring-within", "", "With --rollout: also the machines whose certificates expire within this time, in whole days (30d, 720h)")
	f.BoolVar(&o.restart, "restart", false, "Plan the replacement of every machine")
	f.BoolVar(&o.req.request.ReplaceUnhealthy, "replace-unhealthy", false, "With --version or --replicas: plan the broken machines' replacement first, as the run with --replace-unhealthy would")
	o.req.skip.addFlag(cmd)
	f.BoolVar(&o.ExitCode, "exit-code", false, fmt.Sprintf("Exit %d when steps are pending, 0 when there is nothing to do (a refusal the run would meet keeps its own code)", PendingExitCode))
	return cmd
}

// Complete turns the one target flag given into the request.
func (o *PlanOptions) Complete(cmd *cobra.Command, args []string) error {
	o.req.conn.completeCluster(args)
	o.req.staged.complete(cmd.Flags())
	for _, name := range []string{"version", "replicas", "replace", "rollout", "restart"} {
		if cmd.Flags().Changed(name) {
			o.targets++
		}
	}
	t := &o.req.request
	// --via with any other target is the request's to refuse (it needs
	// --version), not to drop.
	t.Via = o.via
	switch {
	case o.version != "":
		t.Operation, t.Version = rollout.UpgradeOperation, o.version
	case cmd.Flags().Changed("replicas"):
		t.Operation, t.Replicas = rollout.ScaleOperation, &o.replicas
	case o.replace != "":
		t.Operation, t.Replace = rollout.ReplaceOperation, o.replace
	case o.rollout:
		t.Operation = rollout.RolloutOperation
	case o.restart:
		t.Operation = rollout.RestartOperation
	}
	// A bad value is Validate's to refuse, after the checks that come first.
	t.CertificatesExpiryDays, _ = expiryDays(o.expiring)
	return nil
}

// Validate checks the flags; it changes nothing.
func (o *PlanOptions) Validate() error {
	// Checked here rather than with cobra's flag groups, whose error would not
	// be marked as bad usage.
	if o.targets > 1 {
		return exitcode.Usagef("plan takes one of --version, --replicas, --replace, --rollout or --restart, not several")
	}
	if len(o.req.skip.names) > 0 && o.version == "" {
		return exitcode.Usagef("--skip-check needs --version: the readiness checks are an upgrade's")
	}
	switch o.req.request.Operation {
	case rollout.ReplaceOperation, rollout.RolloutOperation, rollout.RestartOperation:
		// Only upgrade and scale take it: the plan would show steps that
		// no run of this target takes.
		if o.req.request.ReplaceUnhealthy {
			return exitcode.Usagef("--replace-unhealthy goes with --version or --replicas: of the runs plan shows, only upgrade and scale take it")
		}
	}
	if o.expiring != "" && !o.rollout {
		return exitcode.Usagef("--certificates-expiring-within needs --rollout: it names machines a rollout replaces too")
	}
	if _, err := expiryDays(o.expiring); err != nil {
		return err
	}
	if err := validateSelection("plan", o.req.conn.Cluster, o.req.sel); err != nil {
		return err
	}
	if err := o.req.staged.validate(o.req.sel.fleet()); err != nil {
		return err
	}
	// The request's own rules first: --via or --infrastructure-template
	// alone is told what it needs.
	if err := o.req.validate(); err != nil {
		return err
	}
	if o.req.request.Operation == "" {
		return exitcode.Usagef("plan needs one of --version, --replicas, --replace, --rollout or --restart")
	}
	return nil
}

// Run prints the plan to stdout.
func (o *PlanOptions) Run(ctx context.Context) error {
	return o.outcome(o.req.printPlans(ctx))
}

func (o *PlanOptions) where() (cluster, namespace string) { return o.req.where() }

// outcome is what a plan exits with: with --exit-code, PendingExitCode for
// pending steps; an error keeps its own code with or without --exit-code, as
// the run would meet it.
func (o *PlanOptions) outcome(pending bool, err error) error {
	if err == nil && pending && o.ExitCode {
		return exitcode.New(PendingExitCode, errPending)
	}
	return err
}

// errPending is the "error" of a successful plan with steps, under --exit-code;
// main prints nothing for it beyond the exit code.
var errPending = errors.New("steps pending")

// plannedStep is a step's stable JSON form.
type plannedStep struct {
	Index         int    `json:"index"`
	Action        string `json:"action"`
	Machine       string `json:"machine,omitempty"`
	FailureDomain string `json:"failureDomain,omitempty"`
	Reason        string `json:"reason"`
	progress.Hop
}

// planObject is what plan -o json prints: one object per cluster.
type planObject struct {
	Cluster   string              `json:"cluster"`
	Namespace string              `json:"namespace"`
	Operation string              `json:"operation"`
	Target    string              `json:"target"`
	Steps     []plannedStep       `json:"steps"`
	Checks    []readiness.Finding `json:"checks,omitempty"`
}

// stepRow is a step with its cluster: a line of -o custom-columns, which
// over -l/-A runs on from one cluster's steps to the next.
type stepRow struct {
	Cluster   string `json:"cluster"`
	Namespace string `json:"namespace"`
	plannedStep
}

// planView is a plan as the printers see it: the object, its steps the
// rows.
type planView struct{ plan planObject }

func (v planView) docs() []doc { return []doc{{v.plan.Namespace + "/" + v.plan.Cluster, v.plan}} }

func (v planView) rowSet() []row {
	rows := make([]row, len(v.plan.Steps))
	for i, s := range v.plan.Steps {
		rows[i] = row{"step", s.Action, stepRow{v.plan.Cluster, v.plan.Namespace, s}}
	}
	return rows
}

// printPlan prints the steps of each hop; an upgrade through several
// versions numbers its steps across hops and names each step's hop. Every
// format but text and wide prints the one planObject; with jsonLines (one
// cluster of several) -o json prints it on one line.
func printPlan(out io.Writer, printer printFlags, jsonLines bool, req rollout.Request, p *rollout.Prepared, hops [][]rollout.Step, report *checkReport) error {
	planned := []plannedStep{}
	for h, steps := range hops {
		var hop progress.Hop
		if len(p.Hops) > 1 {
			hop = progress.Hop{Index: p.FirstHop + h + 1, Of: len(p.Hops), Version: p.Hops[p.FirstHop+h]}
		}
		for _, s := range steps {
			ps := plannedStep{Index: len(planned) + 1, Action: string(s.Action), FailureDomain: s.FailureDomain, Reason: s.Reason, Hop: hop}
			if s.Machine != nil {
				ps.Machine = s.Machine.Name
			}
			planned = append(planned, ps)
		}
	}
	var findings []readiness.Finding
	if report != nil {
		findings = report.Findings
	}
	cluster := p.Snapshot.CP.Cluster
	v := planView{planObject{cluster.Name, cluster.Namespace, string(req.Operation), req.TargetString(), planned, findings}}
	return printer.print(out, v, jsonLines, func(opts tableOptions) error {
		if len(planned) == 0 {
			_, err := fmt.Fprintln(out, nothingToDoFor(req))
			return err
		}
		if err := printStepTable(out, p, planned, opts); err != nil {
			return err
		}
		if report == nil {
			return nil
		}
		fmt.Fprintf(out, "\nReadiness checks for %s:\n", report.Version)
		return printFindings(out, checkView{report}, false, tableOptions{Wide: opts.Wide})
	})
}

// printStepTable is the plan's table, a row per step; -o wide adds each
// step's failure domain.
func printStepTable(out io.Writer, p *rollout.Prepared, planned []plannedStep, opts tableOptions) error {
	// The HOP column is there only for an upgrade through several versions.
	names := []string{"#", "ACTION", "MACHINE", "REASON"}
	if len(p.Hops) > 1 {
		names = slices.Insert(names, 1, "HOP")
	}
	var cells [][]any
	for _, ps := range planned {
		line := []any{ps.Index, ps.Action, dash(ps.Machine), ps.Reason}
		if len(p.Hops) > 1 {
			line = slices.Insert(line, 1, any(fmt.Sprintf("%d/%d %s", ps.Hop.Index, ps.Hop.Of, ps.Hop.Version)))
		}
		cells = append(cells, append(line, dash(ps.FailureDomain)))
	}
	w := newTabWriter(out)
	if err := printTable(w, tableColumns(names, "FAILURE DOMAIN"), cells, opts); err != nil {
		return err
	}
	return w.Flush()
}

func nothingToDoFor(req rollout.Request) string {
	return req.Matched()
}
