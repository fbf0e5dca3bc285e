package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// PendingExitCode is what `plan --exit-code` returns when steps are pending.
const PendingExitCode = 10

// PlanOptions shows the steps a change would take, changing nothing.
type PlanOptions struct {
	rolloutOptions
	Version  string
	Replicas int32
	Replace  string
	ExitCode bool
	Streams  genericiooptions.IOStreams
}

// NewCmdPlan returns the plan verb.
func NewCmdPlan(root *RootOptions) *cobra.Command {
	o := &PlanOptions{Streams: root.Streams}
	o.Root = root
	cmd := &cobra.Command{
		Use:   "plan CLUSTER (--version V | --replicas N | --replace MACHINE)",
		Short: "Show the steps an upgrade, scale or replace would take, changing nothing",
		Long: `Show, in order, the steps that upgrade, scale or replace would take on CLUSTER
now, each with its reason, as the rollout loop itself would decide them. Nothing
is changed and no lock is taken. upgrade, scale and replace with --dry-run print
the same plan.`,
		Example: `  kubectl cp-rollout plan prod-eu1 --version v1.36.3
  kubectl cp-rollout plan prod-eu1 --replicas 5 -o json
  kubectl cp-rollout plan prod-eu1 --version v1.36.3 --exit-code || echo "rollout pending"`,
		Args: clusterArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Cluster = args[0]
			req, err := o.request(cmd)
			if err != nil {
				return err
			}
			if err := o.validate(); err != nil {
				return err
			}
			pending, err := o.plan(cmd.Context(), o.Streams.Out, req)
			if err == nil && pending && o.ExitCode {
				return exitcode.New(PendingExitCode, errPending)
			}
			return err
		},
	}
	o.addFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.Version, "version", "", "Plan an upgrade to this Kubernetes version")
	f.Int32Var(&o.Replicas, "replicas", o.Replicas, "Plan a scale to this many machines")
	f.StringVar(&o.Replace, "replace", "", "Plan the replacement of this machine")
	f.BoolVar(&o.ExitCode, "exit-code", false, fmt.Sprintf("Exit %d when steps are pending, 0 when there is nothing to do", PendingExitCode))
	// The progress flags do not apply to a plan.
	for _, name := range []string{"timeout", "provision-timeout", "health-timeout", "delete-timeout", "settle", "dry-run"} {
		_ = f.MarkHidden(name)
	}
	return cmd
}

// errPending is the "error" of a successful plan with steps, under --exit-code;
// main prints nothing for it beyond the exit code.
var errPending = errors.New("steps pending")

func (o *PlanOptions) request(cmd *cobra.Command) (rollout.Request, error) {
	// Checked here rather than with cobra's flag groups, whose error would not
	// be marked as bad usage.
	set := 0
	for _, name := range []string{"version", "replicas", "replace"} {
		if cmd.Flags().Changed(name) {
			set++
		}
	}
	if set > 1 {
		return rollout.Request{}, exitcode.Usagef("plan takes one of --version, --replicas or --replace, not several")
	}
	switch {
	case o.Version != "":
		if _, err := rollout.ParseVersion(o.Version); err != nil {
			return rollout.Request{}, err
		}
		return rollout.Request{Operation: "upgrade", Version: o.Version}, nil
	case cmd.Flags().Changed("replicas"):
		if o.Replicas < 1 {
			return rollout.Request{}, exitcode.Usagef("--replicas must be at least 1, not %d", o.Replicas)
		}
		return rollout.Request{Operation: "scale", Replicas: &o.Replicas}, nil
	case o.Replace != "":
		return rollout.Request{Operation: "replace", Replace: o.Replace}, nil
	}
	return rollout.Request{}, exitcode.Usagef("plan needs one of --version, --replicas or --replace")
}

// plan prints the plan for req and reports whether it has steps.
func (o *rolloutOptions) plan(ctx context.Context, out io.Writer, req rollout.Request) (bool, error) {
	req.MaxSurge = o.MaxSurge
	engine, closeEngine, err := o.connect(ctx, o.Root.ConfigFlags, nil, false)
	if err != nil {
		return false, err
	}
	defer closeEngine()
	prepared, err := engine.Prepare(ctx, req)
	if err != nil {
		return false, err
	}
	var steps []rollout.Step
	if prepared.NothingToDo == "" {
		steps = rollout.Plan(ctx, prepared.Snapshot, prepared.Target)
	}
	if err := printPlan(out, o.Output, req, steps); err != nil {
		return false, err
	}
	for _, s := range steps {
		if s.Action == rollout.Refuse {
			return true, s.Err
		}
	}
	return len(steps) > 0, nil
}

// plannedStep is a step's stable JSON form.
type plannedStep struct {
	Index         int    `json:"index"`
	Action        string `json:"action"`
	Machine       string `json:"machine,omitempty"`
	FailureDomain string `json:"failureDomain,omitempty"`
	Reason        string `json:"reason"`
}

func printPlan(out io.Writer, format string, req rollout.Request, steps []rollout.Step) error {
	planned := make([]plannedStep, 0, len(steps))
	for i, s := range steps {
		p := plannedStep{Index: i + 1, Action: string(s.Action), FailureDomain: s.FailureDomain, Reason: s.Reason}
		if s.Machine != nil {
			p.Machine = s.Machine.Name
		}
		planned = append(planned, p)
	}
	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Operation string        `json:"operation"`
			Target    string        `json:"target"`
			Steps     []plannedStep `json:"steps"`
		}{req.Operation, req.TargetString(), planned})
	}
	if len(planned) == 0 {
		_, err := fmt.Fprintf(out, "nothing to do: the control plane already matches %s\n", req.TargetString())
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "#\tACTION\tMACHINE\tREASON")
	for _, p := range planned {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\n", p.Index, p.Action, dash(p.Machine), p.Reason)
	}
	return w.Flush()
}
