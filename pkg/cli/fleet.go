package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// This file is how a verb acts on many clusters: -l/--selector and
// -A/--all-namespaces select them instead of a CLUSTER name, and each
// selected cluster gets the one-cluster verb, unchanged.

// selection is -l and -A: the verbs that take it act on the clusters it
// selects instead of one named cluster.
type selection struct {
	Selector      string
	AllNamespaces bool
}

func (s *selection) addFlags(f *pflag.FlagSet) {
	f.StringVarP(&s.Selector, "selector", "l", "", "Act on every Cluster whose labels match this selector (e.g. -l env=staging,tier!=prod) instead of a CLUSTER name")
	f.BoolVarP(&s.AllNamespaces, "all-namespaces", "A", false, "Select Clusters in every namespace (with -l: those matching it; alone: all of them)")
}

// fleet reports whether the command acts on a selection of clusters rather
// than on one named cluster.
func (s *selection) fleet() bool { return s.Selector != "" || s.AllNamespaces }

// clusterOrSelection checks the positional arguments of a verb that takes a
// CLUSTER name or a selection: at most one name here; validateSelection
// checks that exactly one of the two was given.
func clusterOrSelection(cmd *cobra.Command, args []string) error {
	if len(args) > 1 {
		return wrongArgs(cmd, "takes at most one argument, the Cluster's name (or -l/-A instead)", len(args))
	}
	return nil
}

// completeCluster takes the CLUSTER argument, if one was given.
func (c *connection) completeCluster(args []string) {
	if len(args) == 1 {
		c.Cluster = args[0]
	}
}

// validateSelection checks that a verb got exactly one of a CLUSTER name or
// -l/-A, and that the selector parses. A verb without -l/-A passes an empty
// selection: it still needs its CLUSTER.
func validateSelection(verb, cluster string, s selection) error {
	switch {
	case cluster != "" && s.fleet():
		return exitcode.Usagef("%s takes a CLUSTER name or -l/-A, not both", verb)
	case cluster == "" && !s.fleet():
		return exitcode.Usagef("%s needs a CLUSTER name, or -l SELECTOR / -A to act on several clusters", verb)
	}
	_, err := s.labels()
	return err
}

// labels is -l parsed: every Cluster without it. A selector given but
// without a requirement (-l ' ') parses to every Cluster too, and would
// pass where -A alone needs --yes: it is refused, as the mistake it is.
func (s *selection) labels() (labels.Selector, error) {
	if s.Selector == "" {
		return labels.Everything(), nil
	}
	sel, err := labels.Parse(s.Selector)
	if err != nil {
		return nil, exitcode.Usagef("-l %s: %v", s.Selector, err)
	}
	if sel.Empty() {
		return nil, exitcode.Usagef("-l %q has no requirement and would select every Cluster: give one (for example -l env=staging), "+
			"or leave -l out (-A alone selects every cluster, with --yes to change them); nothing was changed", s.Selector)
	}
	return sel, nil
}

// scope is where s looks: every namespace with -A, otherwise -n or the
// kubeconfig context's namespace.
func (c *connection) scope(s selection) (fleet.Scope, error) {
	sel, err := s.labels()
	if err != nil {
		return fleet.Scope{}, err
	}
	scope := fleet.Scope{Selector: sel}
	if s.AllNamespaces {
		return scope, nil
	}
	ns, err := c.kubeconfigNamespace()
	scope.Namespace = ns
	return scope, err
}

// managementReader lists the management cluster's collections, for the
// reads that select clusters and show the fleet.
func (c *connection) managementReader() (*fleet.Lister, error) {
	cfg, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	// status -A makes its lists at once, and then, for control planes whose
	// own status may be stale, a Machine list each, eight at a time.
	cfg.QPS, cfg.Burst = 50, 100
	return fleet.NewLister(cfg)
}

// selectClusters lists the clusters s names. None is bad usage, naming the
// selector; so is a selection of clusters none of which has a
// KubeadmControlPlane.
func (c *connection) selectClusters(ctx context.Context, s selection) ([]fleet.Cluster, []fleet.Skipped, error) {
	scope, err := c.scope(s)
	if err != nil {
		return nil, nil, err
	}
	mgmt, err := c.managementReader()
	if err != nil {
		return nil, nil, err
	}
	clusters, skipped, err := fleet.Select(ctx, mgmt, scope)
	switch {
	case err != nil:
		return nil, nil, c.firstContact(ctx, err)
	case len(clusters) == 0 && len(skipped) == 0:
		return nil, nil, exitcode.Usagef("no Cluster %s", scope)
	case len(clusters) == 0:
		return nil, nil, exitcode.Usagef("no Cluster %s has a KubeadmControlPlane to act on (%s: %s)", scope, skipped[0].Cluster, skipped[0].Reason)
	}
	return clusters, skipped, nil
}

// forCluster is the connection to one selected cluster.
func (c connection) forCluster(cl fleet.Cluster) connection {
	c.Cluster, c.Namespace = cl.Name, cl.Namespace
	return c
}

// fleetLimits are --parallel and --max-failures.
type fleetLimits struct {
	fleet.Limits
	given bool // either flag was on the command line
}

// newFleetLimits is one cluster at a time. The default is set here rather
// than with the flag: replace has no --parallel and is validated all the
// same.
func newFleetLimits() fleetLimits {
	return fleetLimits{Limits: fleet.Limits{Parallel: 1}}
}

func (l *fleetLimits) addFlags(f *pflag.FlagSet) {
	f.IntVar(&l.Parallel, "parallel", l.Parallel, "With -l/-A: how many clusters roll at once (each one machine at a time)")
	f.IntVar(&l.MaxFailures, "max-failures", l.MaxFailures, "With -l/-A: once more clusters than this have failed, start no new one (those in flight finish)")
}

func (l *fleetLimits) complete(cmd *cobra.Command) {
	l.given = cmd.Flags().Changed("parallel") || cmd.Flags().Changed("max-failures")
}

func (l *fleetLimits) validate(fleetMode bool) error {
	switch {
	case l.given && !fleetMode:
		return exitcode.Usagef("--parallel and --max-failures need -l or -A: a named cluster is one cluster")
	case l.Parallel < 1:
		return exitcode.Usagef("--parallel must be at least 1, not %d", l.Parallel)
	case l.MaxFailures < 0:
		return exitcode.Usagef("--max-failures must not be negative, not %d", l.MaxFailures)
	}
	return nil
}

// machineCounter counts, as a cluster's events pass to its reporter, the
// machines its run created and deleted, for the fleet's closing table.
type machineCounter struct {
	progress.Reporter
	created, deleted atomic.Int32
}

func (m *machineCounter) Report(e progress.Event) {
	if e.Phase == progress.Done {
		switch rollout.Action(e.Action) {
		case rollout.Create:
			m.created.Add(1)
		case rollout.Delete:
			m.deleted.Add(1)
		}
	}
	m.Reporter.Report(e)
}

// machines says what the run did to the machines: "3 replaced", "2 added",
// "1 replaced, 2 removed".
func (m *machineCounter) machines() string {
	created, deleted := int(m.created.Load()), int(m.deleted.Load())
	replaced := min(created, deleted)
	var parts []string
	if replaced > 0 {
		parts = append(parts, fmt.Sprintf("%d replaced", replaced))
	}
	if n := created - replaced; n > 0 {
		parts = append(parts, fmt.Sprintf("%d added", n))
	}
	if n := deleted - replaced; n > 0 {
		parts = append(parts, fmt.Sprintf("%d removed", n))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// fleetRow is one cluster's line of the closing table; its JSON form is part
// of the documented "fleet" event.
type fleetRow struct {
	fleet.Cluster
	Stage      int    `json:"stage,omitempty"`
	Result     string `json:"result"` // done, failed, stopped, not started, outside window, skipped
	ExitCode   *int   `json:"exitCode,omitempty"`
	Machines   string `json:"machines,omitempty"`
	DurationMs int64  `json:"durationMs"`
	Message    string `json:"message,omitempty"`
}

func failedNames(rows []fleetRow) []string {
	var names []string
	for _, r := range rows {
		if r.Result == "failed" || r.Result == "stopped" {
			names = append(names, fmt.Sprintf("%s exit %d", r.Cluster, *r.ExitCode))
		}
	}
	return names
}

// printFleet prints the closing table, or with -o json the "fleet" event:
// an event like the others (action "fleet") with every cluster's row.
func printFleet(out io.Writer, output, run string, rows []fleetRow, code int) error {
	if output == "json" {
		phase := progress.Done
		if code != exitcode.OK {
			phase = progress.Failed
		}
		return writeJSON(out, struct {
			Time     time.Time      `json:"time"`
			Action   string         `json:"action"`
			Phase    progress.Phase `json:"phase"`
			Run      string         `json:"run"`
			ExitCode int            `json:"exitCode"`
			Clusters []fleetRow     `json:"clusters"`
		}{time.Now(), progress.FleetAction, phase, run, code, rows}, true)
	}
	var cells [][]any
	for _, r := range rows {
		exit, duration := "-", "-"
		if r.ExitCode != nil {
			exit = fmt.Sprint(*r.ExitCode)
			duration = (time.Duration(r.DurationMs) * time.Millisecond).Round(100 * time.Millisecond).String()
		}
		stage := "-"
		if r.Stage > 0 {
			stage = fmt.Sprint(r.Stage)
		}
		cells = append(cells, []any{r.Cluster.String(), stage, r.Result, exit, dash(r.Machines), duration, dash(firstLine(r.Message))})
	}
	w := newTabWriter(out)
	if err := printTable(w, tableColumns([]string{"CLUSTER", "STAGE", "RESULT", "EXIT", "MACHINES", "DURATION", "MESSAGE"}), cells, tableOptions{}); err != nil {
		return err
	}
	return w.Flush()
}

// firstLine keeps a table row to one line.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// inTurn runs do for each of the clusters that selectClusters chose, one
// after another, with the connection to that cluster: plan and handback over
// a fleet, which are quick and print as they go. The caller selects them, so
// that it can have them confirmed first. Skipped clusters are noted on
// errOut, and so is each failure; one does not stop the others. The error
// counts the failed clusters and carries the worst exit code.
func (c *connection) inTurn(ctx context.Context, errOut io.Writer, clusters []fleet.Cluster, skipped []fleet.Skipped, do func(one connection) error) error {
	for _, s := range skipped {
		fmt.Fprintf(errOut, "%s skipped: %s\n", s.Cluster, s.Reason)
	}
	var failed []string
	var codes []int
	for _, cl := range clusters {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := do(c.forCluster(cl)); err != nil {
			code := exitcode.Of(err)
			fmt.Fprintf(errOut, "%s: %v\n", cl, err)
			failed, codes = append(failed, fmt.Sprintf("%s exit %d", cl, code)), append(codes, code)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return exitcode.New(exitcode.Worst(codes...), fmt.Errorf("%d of %d clusters failed: %s", len(failed), len(clusters), strings.Join(failed, ", ")))
}
