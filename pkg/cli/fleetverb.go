package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
)

// This file is the fleet verb: what a recorded fleet run (fleetrun.go)
// looks like from anywhere, and how to stop it starting new clusters.

// FleetOptions are fleet status and fleet abort's.
type FleetOptions struct {
	conn         connection
	RunNamespace string
	Name         string // the run's
	abort        bool
	output       printFlags
	Streams      genericiooptions.IOStreams
}

// NewCmdFleet returns the fleet verb and its two sub-verbs.
func NewCmdFleet(root *RootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Show or abort the fleet runs recorded in the management cluster",
		Long: `A change over -l/-A (upgrade -A --stages …) is a fleet run: its stages and
each cluster's state are recorded in ConfigMaps of the management cluster
(in --run-namespace: -n's, or the kubeconfig context's, namespace), so that it
can be watched from any terminal and continued with --resume after a crash,
a closed laptop or Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newCmdFleetStatus(root), newCmdFleetAbort(root))
	return cmd
}

func newFleetOptions(root *RootOptions, abort bool) *FleetOptions {
	o := &FleetOptions{abort: abort, output: printFlags{Output: "text", values: objectOutputs}, Streams: root.Streams}
	o.conn.Management = root.ConfigFlags
	return o
}

func newCmdFleetStatus(root *RootOptions) *cobra.Command {
	o := newFleetOptions(root, false)
	cmd := &cobra.Command{
		Use:   "status [RUN]",
		Short: "Show a recorded fleet run, or list them",
		Long: `Show a fleet run as recorded in the management cluster: who started it, its
request, each stage's state and each cluster's (state, exit code, machines,
attempts, when it started and ended). Without RUN, list the runs, newest
first. Read-only; it reads ConfigMaps in --run-namespace alone.`,
		Example: `  kubectl cp-rollout fleet status
  kubectl cp-rollout fleet status upgrade-20261207-071500 -o json | jq '.clusters[] | select(.state != "done")'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return wrongArgs(cmd, "takes at most one argument, the fleet run's name", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return runVerb(cmd, args, o, nil) },
	}
	o.addFlags(cmd)
	addOutputFlag(cmd, &o.output.Output, objectOutputs, "Output format: text (a table), json, yaml, or jsonpath=TEMPLATE or go-template=TEMPLATE (read the run's record)")
	return cmd
}

func newCmdFleetAbort(root *RootOptions) *cobra.Command {
	o := newFleetOptions(root, true)
	cmd := &cobra.Command{
		Use:   "abort RUN",
		Short: "Have a fleet run start no new cluster",
		Long: `Mark the fleet run RUN so that it starts no new cluster: before each cluster
it starts, the run reads its record and, marked, starts none. The clusters in
flight finish, each as its own run does; the run then ends as aborted (exit
130), with the others "not started", and may be continued later with the same
command and --resume RUN.`,
		Example: `  kubectl cp-rollout fleet abort upgrade-20261207-071500`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return wrongArgs(cmd, "needs one argument, the fleet run's name", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return runVerb(cmd, args, o, nil) },
	}
	o.addFlags(cmd)
	return cmd
}

func (o *FleetOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.RunNamespace, "run-namespace", "", "The namespace where fleet runs are recorded (default: -n's, or the kubeconfig context's)")
}

// Complete takes the run's name.
func (o *FleetOptions) Complete(_ *cobra.Command, args []string) error {
	if len(args) == 1 {
		o.Name = args[0]
	}
	return nil
}

// Validate checks the run's name and the output; it changes nothing.
func (o *FleetOptions) Validate() error {
	if o.Name != "" {
		if err := fleet.ValidRunName(o.Name); err != nil {
			return exitcode.Usagef("%v", err)
		}
	}
	return o.output.complete()
}

// Run shows or aborts the run.
func (o *FleetOptions) Run(ctx context.Context) error {
	records, err := o.conn.records(o.RunNamespace)
	if err != nil {
		return err
	}
	if o.abort {
		if err := records.Abort(ctx, o.Name, o.conn.whoAmI(ctx)); err != nil {
			return o.conn.firstContact(ctx, err)
		}
		fmt.Fprintf(o.Streams.Out, "fleet run %s: asked to start no new cluster; the clusters in flight finish (watch with kubectl cp-rollout fleet status %s)\n", o.Name, o.Name)
		return nil
	}
	if o.Name == "" {
		runs, err := records.List(ctx)
		if err != nil {
			return o.conn.firstContact(ctx, err)
		}
		return o.output.print(o.Streams.Out, runList(runs), false, func(opts tableOptions) error { return printRuns(o.Streams.Out, runs, opts) })
	}
	run, err := records.Load(ctx, o.Name)
	if err != nil {
		return o.conn.firstContact(ctx, err)
	}
	return o.output.print(o.Streams.Out, runView{run}, false, func(opts tableOptions) error { return printRun(o.Streams.Out, run, opts) })
}

type runView struct{ run *fleet.RunRecord }

func (v runView) docs() []doc { return []doc{{v.run.Name, v.run}} }
func (v runView) rowSet() []row {
	rows := make([]row, len(v.run.Clusters))
	for i, c := range v.run.Clusters {
		rows[i] = row{kind: "FleetRunCluster", name: c.Cluster.String(), v: c}
	}
	return rows
}

type runList []fleet.RunRecord

func (l runList) docs() []doc {
	docs := make([]doc, len(l))
	for i, r := range l {
		docs[i] = doc{r.Name, r}
	}
	return docs
}
func (l runList) rowSet() []row {
	rows := make([]row, len(l))
	for i, r := range l {
		rows[i] = row{kind: "FleetRun", name: r.Name, v: r}
	}
	return rows
}

// printRuns is fleet status without a run: one line a run.
func printRuns(out io.Writer, runs []fleet.RunRecord, opts tableOptions) error {
	var cells [][]any
	for _, r := range runs {
		cells = append(cells, []any{r.Name, r.State, r.Request, fmt.Sprint(len(r.Stages)), r.StartedBy, age(r.Started, time.Now())})
	}
	w := newTabWriter(out)
	if err := printTable(w, tableColumns([]string{"RUN", "STATE", "REQUEST", "STAGES", "STARTED BY", "AGE"}), cells, opts); err != nil {
		return err
	}
	return w.Flush()
}

// printRun is one run: a few lines about it, its stages, then its clusters.
func printRun(out io.Writer, run *fleet.RunRecord, opts tableOptions) error {
	count := run.Count()
	var tally []string
	for _, state := range []string{fleet.Done, fleet.Running, fleet.Failed, fleet.Stopped, fleet.Pending, fleet.NotStarted, fleet.OutsideWindow} {
		if count[state] > 0 {
			tally = append(tally, fmt.Sprintf("%d %s", count[state], state))
		}
	}
	fmt.Fprintf(out, "Run:         %s (namespace %s)\nRequest:     %s\nState:       %s%s\nStarted:     %s by %s\nClusters:    %d: %s\n",
		run.Name, run.Namespace, run.Request, run.State, prefixed(": ", run.Message), run.Started.Format(time.RFC3339), run.StartedBy, len(run.Clusters), strings.Join(tally, ", "))
	if run.State == fleet.RunRunning && !run.Renewed.IsZero() {
		// A killed run's record stays "running": when it was last renewed
		// tells a live run (every 5s) from a dead one.
		fmt.Fprintf(out, "Renewed:     %s by %s (%s ago; a running run renews it every 5s)\n", run.Renewed.Format(time.RFC3339), run.Holder, age(run.Renewed, time.Now()))
	}
	if run.AbortRequested != "" {
		fmt.Fprintf(out, "Abort:       asked %s\n", run.AbortRequested)
	}
	for i, s := range run.Stages {
		sel := s.Selector
		if sel == "" {
			sel = "(every selected cluster)"
		}
		fmt.Fprintf(out, "Stage %d:     %s  %s%s\n", i+1, sel, s.State, prefixed(": ", s.Message))
	}
	fmt.Fprintln(out)
	var cells [][]any
	for _, c := range run.Clusters {
		exit, took := "-", "-"
		if c.ExitCode != nil {
			exit = fmt.Sprint(*c.ExitCode)
		}
		if c.Started != nil && c.Ended != nil {
			took = c.Ended.Sub(*c.Started).Round(time.Second).String()
		}
		cells = append(cells, []any{c.Cluster.String(), fmt.Sprint(c.Stage), c.State, exit, dash(c.Machines), fmt.Sprint(c.Attempts), took, dash(firstLine(c.Message))})
	}
	w := newTabWriter(out)
	if err := printTable(w, tableColumns([]string{"CLUSTER", "STAGE", "STATE", "EXIT", "MACHINES", "ATTEMPTS", "TOOK", "MESSAGE"}), cells, opts); err != nil {
		return err
	}
	return w.Flush()
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}
