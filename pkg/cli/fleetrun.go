package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/pkg/access"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// This file is a change over -l/-A as a recorded run in stages: the rings
// of --stages go in order with a soak between them, each cluster only inside
// its maintenance window, and the run's state is kept in the management
// cluster (pkg/fleet's record) so that it outlives the terminal.

// stagedFlags are the flags of a staged, recorded fleet run.
type stagedFlags struct {
	Stages      string
	StageSoak   time.Duration
	MachineTime time.Duration
	// Run names a new run; Resume continues a recorded one.
	Run, Resume string
	// RunNamespace is where runs are recorded: -n's, or the kubeconfig
	// context's, namespace when empty.
	RunNamespace string
	stages       []labels.Selector
	// given are the flags typed, for the refusals of flags that do not
	// apply; a site's config file may set the configurable ones for every
	// verb.
	given map[string]bool
}

func newStagedFlags() stagedFlags { return stagedFlags{MachineTime: 15 * time.Minute} }

// addPlanFlags adds what plan needs to say when each cluster goes.
func (s *stagedFlags) addPlanFlags(f *pflag.FlagSet) {
	f.StringVar(&s.Stages, "stages", "", "With -l/-A: the rings, as label selectors separated by ';' (e.g. 'ring=canary;ring=early;ring=prod'), run in that order; a cluster is in the first it matches")
	f.DurationVar(&s.StageSoak, "stage-soak", 0, "With --stages: how long a finished stage's clusters must stay healthy (read live every 10s) before the next stage starts")
	f.DurationVar(&s.MachineTime, "machine-time", s.MachineTime, "With -l/-A: how long one machine's replacement takes here; a cluster with a maintenance window starts only when replicas × this fits before it closes")
}

// addFlags adds the staged run's flags to a verb that changes clusters.
func (s *stagedFlags) addFlags(f *pflag.FlagSet) {
	s.addPlanFlags(f)
	f.StringVar(&s.Run, "run", "", "With -l/-A: the name of this fleet run's record (default: the verb, the time and a random suffix)")
	f.StringVar(&s.Resume, "resume", "", "With -l/-A: continue the recorded fleet run RUN, given the same command; clusters it has done are not run again")
	f.StringVar(&s.RunNamespace, "run-namespace", "", "The namespace where fleet runs are recorded (default: -n's, or the kubeconfig context's)")
}

func (s *stagedFlags) complete(f *pflag.FlagSet) {
	s.given = map[string]bool{}
	for _, name := range []string{"stages", "stage-soak", "machine-time", "run", "resume"} {
		s.given[name] = typed(f, name)
	}
}

func (s *stagedFlags) validate(fleetMode bool) error {
	var given []string
	for _, name := range []string{"stages", "stage-soak", "machine-time", "run", "resume"} {
		if s.given[name] {
			given = append(given, "--"+name)
		}
	}
	var err error
	switch {
	case len(given) > 0 && !fleetMode:
		return exitcode.Usagef("%s: only with -l or -A, a fleet run; a named cluster is one cluster", strings.Join(given, ", "))
	case s.StageSoak < 0 || s.MachineTime <= 0:
		return exitcode.Usagef("--stage-soak must not be negative and --machine-time must be positive")
	case s.given["stage-soak"] && s.Stages == "":
		return exitcode.Usagef("--stage-soak goes with --stages: it is the wait between stages")
	case s.Run != "" && s.Resume != "":
		return exitcode.Usagef("--run names a new fleet run and --resume continues one: give one of them")
	}
	for _, name := range []string{s.Run, s.Resume} {
		if name != "" {
			if err := fleet.ValidRunName(name); err != nil {
				return exitcode.Usagef("%v", err)
			}
		}
	}
	if s.Stages != "" {
		if s.stages, err = fleet.ParseStages(s.Stages); err != nil {
			return exitcode.Usagef("--stages: %v", err)
		}
	}
	return nil
}

// stageSelectors are the stages as recorded: one selecting every cluster
// without --stages.
func (s *stagedFlags) stageSelectors() []string {
	if len(s.stages) == 0 {
		return []string{""}
	}
	out := make([]string, len(s.stages))
	for i, sel := range s.stages {
		out[i] = sel.String()
	}
	return out
}

// records is where this connection's fleet runs are recorded.
func (c *connection) records(runNamespace string) (*fleet.Records, error) {
	cfg, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	// A run writes each cluster's start and end: client-go's default of 5
	// requests a second would be its pace at fleet scale.
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if runNamespace == "" {
		if runNamespace, err = c.kubeconfigNamespace(); err != nil {
			return nil, err
		}
	}
	return fleet.NewRecords(cs, runNamespace), nil
}

// place selects the clusters of the run and places them in stages.
func (o *changeOptions) place(ctx context.Context) ([]fleet.Member, []fleet.Skipped, error) {
	scope, err := o.req.conn.scope(o.req.sel)
	if err != nil {
		return nil, nil, err
	}
	mgmt, err := o.req.conn.managementReader()
	if err != nil {
		return nil, nil, err
	}
	members, skipped, err := fleet.Place(ctx, mgmt, scope, o.req.staged.stages)
	switch {
	case err != nil:
		return nil, nil, o.req.conn.firstContact(ctx, err)
	case len(members) == 0 && len(skipped) == 0:
		return nil, nil, exitcode.Usagef("no Cluster %s", scope)
	case len(members) == 0:
		return nil, nil, exitcode.Usagef("no Cluster %s can be acted on (%s: %s)", scope, skipped[0].Cluster, skipped[0].Reason)
	}
	return members, skipped, nil
}

// startRun records a new fleet run, or takes over the one --resume names.
// A resumed run keeps its clusters and stages; their windows and sizes are
// read afresh.
func (o *changeOptions) startRun(ctx context.Context, records *fleet.Records) (*fleet.Recorder, []fleet.Member, []fleet.Skipped, error) {
	members, skipped, err := o.place(ctx)
	if err != nil && o.req.staged.Resume == "" {
		return nil, nil, nil, err
	}
	request := o.req.request.String()
	if name := o.req.staged.Resume; name != "" {
		// The request is checked before any wait to take the run over.
		recorded, err := records.Load(ctx, name)
		if err != nil {
			return nil, nil, nil, o.req.conn.firstContact(ctx, err)
		}
		if recorded.Request != request {
			return nil, nil, nil, exitcode.Usagef("fleet run %s is a run to %s, not to %s: --resume continues a run with its own request (%s)", name, strings.TrimPrefix(recorded.Request, string(o.req.request.Operation)+" to "), o.req.request.TargetString(), recorded.Command)
		}
		if o.req.staged.Stages != "" && strings.Join(o.req.staged.stageSelectors(), ";") != recordedStages(*recorded) {
			return nil, nil, nil, exitcode.Usagef("fleet run %s has the stages %q, not %q: leave --stages out, or start a new run", name, recordedStages(*recorded), o.req.staged.Stages)
		}
		rec, err := records.TakeOver(ctx, name, func(msg string) { fmt.Fprintln(o.req.Streams.ErrOut, msg) })
		if err != nil {
			return nil, nil, nil, err
		}
		run := rec.Run()
		now := map[fleet.Cluster]fleet.Member{}
		for _, m := range members {
			now[m.Cluster] = m
		}
		var resumed []fleet.Member
		for _, c := range run.Clusters {
			m := now[c.Cluster]
			m.Cluster, m.Stage = c.Cluster, c.Stage
			resumed = append(resumed, m)
		}
		_ = rec.UpdateRun(ctx, func(r *fleet.RunRecord) { r.State, r.Message = fleet.RunRunning, "" })
		return rec, resumed, nil, nil
	}
	if o.req.sel.everyCluster() {
		clusters := make([]fleet.Cluster, len(members))
		for i, m := range members {
			clusters[i] = m.Cluster
		}
		if err := o.consent.confirm(ctx, o.req.Streams, request, clusters); err != nil {
			return nil, nil, nil, err
		}
	}
	name := o.req.staged.Run
	if name == "" {
		// The suffix keeps two runs started in the same second apart.
		name = fmt.Sprintf("%s-%s-%s", o.req.request.Operation, time.Now().UTC().Format("20060102-150405"), utilrand.String(4))
	}
	run := fleet.RunRecord{Name: name, Request: request, Command: strings.Join(os.Args, " "), Parallel: o.limits.Parallel,
		MaxFail: o.limits.MaxFailures, StartedBy: o.req.conn.whoAmI(ctx), Started: time.Now().UTC(), State: fleet.RunRunning}
	if scope, err := o.req.conn.scope(o.req.sel); err == nil {
		run.Scope = scope.String()
	}
	if o.req.staged.StageSoak > 0 {
		run.StageSoak = o.req.staged.StageSoak.String()
	}
	for _, sel := range o.req.staged.stageSelectors() {
		run.Stages = append(run.Stages, fleet.StageRecord{Selector: sel, State: fleet.StagePending})
	}
	for _, m := range members {
		run.Clusters = append(run.Clusters, fleet.ClusterRecord{Cluster: m.Cluster, Stage: m.Stage, State: fleet.Pending})
	}
	rec, err := records.Create(ctx, run)
	if err != nil {
		return nil, nil, nil, err
	}
	return rec, members, skipped, nil
}

func recordedStages(run fleet.RunRecord) string {
	sels := make([]string, len(run.Stages))
	for i, s := range run.Stages {
		sels[i] = s.Selector
	}
	return strings.Join(sels, ";")
}

// whoAmI is the identity the management cluster knows this user by, for the
// record; the user name of the machine when it will not say.
func (c *connection) whoAmI(ctx context.Context) string {
	if cfg, err := c.restConfig(); err == nil {
		if kube, err := client.New(cfg, client.Options{}); err == nil {
			if who := access.Identity(ctx, kube); who != "" {
				return who
			}
		}
	}
	return os.Getenv("USER")
}

// runFleet runs the change on every selected cluster, stage by stage,
// --parallel at a time, recording the run, and closes with a table (or with
// -o json a "fleet" event) of how each ended. Its error carries the worst
// exit code of the clusters (exitcode.Worst), or the soak's finding.
func (o *changeOptions) runFleet(ctx context.Context) error {
	streams := o.req.Streams
	records, err := o.req.conn.records(o.req.staged.RunNamespace)
	if err != nil {
		return err
	}
	rec, members, skipped, err := o.startRun(ctx, records)
	if err != nil {
		return err
	}
	run := rec.Run()
	ctx, quit := context.WithCancelCause(ctx)
	defer quit(nil)
	// The record is renewed until the run's last write, after a stop too:
	// otherwise another --resume could take the run over while this one
	// still writes.
	keep, stopKeeping := context.WithCancel(context.WithoutCancel(ctx))
	kept := make(chan struct{})
	go func() { defer close(kept); rec.Keep(keep, holderName()) }()

	stopStarting := make(chan struct{})
	var stopOnce sync.Once
	board := progress.NewFleet(o.req.Output, streams.Out, streams.ErrOut, streams.In, progress.FleetKeys{
		StopStarting: func() { stopOnce.Do(func() { close(stopStarting) }) },
		Quit:         func() { quit(exitcode.Stopped(os.Interrupt)) },
	})
	var rows []progress.FleetRow
	for _, m := range members {
		rows = append(rows, progress.FleetRow{Namespace: m.Namespace, Cluster: m.Name, Stage: m.Stage, Machines: int(m.Replicas)})
	}
	board.Plan(run.Name, len(run.Stages), rows)
	if o.req.Output != "json" {
		fmt.Fprintf(streams.ErrOut, "fleet run %s (recorded in namespace %s): fleet status %s shows it; after a stop, --resume %s continues it\n",
			run.Name, run.Namespace, run.Name, run.Name)
	}
	for _, s := range skipped {
		board.Skipped(s.Namespace, s.Name, s.Reason)
	}

	var ranMu sync.Mutex
	ran := map[fleet.Cluster]bool{}
	staged := fleet.Staged{Record: rec, Stages: len(run.Stages), Limits: o.limits.Limits, Soak: o.req.staged.StageSoak, SoakEvery: 10 * time.Second,
		MachineTime: o.req.staged.MachineTime, Now: time.Now, Watch: board, StopStarting: stopStarting,
		Healthy: o.healthy,
		Do: func(ctx context.Context, m fleet.Member) (string, error) {
			ranMu.Lock()
			ran[m.Cluster] = true
			ranMu.Unlock()
			return o.fleetOne(ctx, board, m)
		}}
	runErr := staged.Run(ctx, members)
	board.Stop()
	stopKeeping()
	<-kept

	stop := exitcode.OK
	if ctx.Err() != nil {
		stop = exitcode.StopOf(ctx)
	}
	final := rec.Run()
	rowsOut, failed, notStarted, codes := recordRows(final, skipped, ran, stop)
	summary := runErr
	if summary == nil {
		summary = o.summary(final, rowsOut, failed, notStarted, codes, stop)
	}
	if err := printFleet(streams.Out, o.req.Output, run.Name, rowsOut, exitcode.Of(summary)); err != nil {
		return err
	}
	if n := final.Count()[fleet.OutsideWindow]; n > 0 {
		which := fmt.Sprintf("%d clusters were outside their maintenance windows and wait for them", n)
		if n == 1 {
			which = "1 cluster was outside its maintenance window and waits for it"
		}
		fmt.Fprintf(streams.ErrOut, "%s: continue with the same command and --resume %s once they open (plan shows when)\n", which, run.Name)
	}
	if ctx.Err() != nil {
		fmt.Fprintf(streams.ErrOut, "stopped; each KubeadmControlPlane a run had paused stays paused with its operation record. Continue with the same command and --resume %s.\n", run.Name)
	}
	return summary
}

// fleetOne runs the change on one cluster of a fleet run, exactly as a run
// on that cluster alone, its events on its row of the board, and says what
// it did to the machines.
func (o *changeOptions) fleetOne(ctx context.Context, board *progress.Fleet, m fleet.Member) (string, error) {
	one := *o
	one.req.conn, one.req.sel, one.inFleet = o.req.conn.forCluster(m.Cluster), selection{}, true
	counter := &machineCounter{Reporter: board.For(m.Namespace, m.Name)}
	began := time.Now()
	err := one.runOne(ctx, counter)
	changed := counter.machines()
	outcome := fmt.Sprintf("done: %s in %s", strings.Replace(changed, "none", "no machine changed", 1), time.Since(began).Round(100*time.Millisecond))
	if err != nil {
		outcome = fmt.Sprintf("failed (exit %d): %v", exitcode.Of(err), err)
	}
	board.Finished(m.Namespace, m.Name, err == nil, outcome)
	return changed, err
}

// summary is a fleet run's error when clusters failed or did not start:
// which, and why, with the worst of their exit codes; nil when none did.
// An abort that stopped the starts is an operator's stop, as Ctrl-C is.
func (o *changeOptions) summary(final fleet.RunRecord, rows []fleetRow, failed, notStarted int, codes []int, stop int) error {
	if failed == 0 && notStarted == 0 {
		return nil
	}
	var parts []string
	if failed > 0 {
		what := "failed"
		if stop != exitcode.OK {
			what = "failed or were stopped"
		}
		parts = append(parts, fmt.Sprintf("%d of %d clusters %s (%s)", failed, len(final.Clusters), what, strings.Join(failedNames(rows), ", ")))
	}
	if notStarted > 0 {
		why := fmt.Sprintf("--max-failures %d", o.limits.MaxFailures)
		switch {
		case stop != exitcode.OK:
			why = "stopped"
		case final.State == fleet.RunAborted:
			why = final.Message
		}
		what := fmt.Sprintf("%d not started (%s)", notStarted, why)
		if failed == 0 {
			what = fmt.Sprintf("%d of %d clusters not started (%s)", notStarted, len(final.Clusters), why)
		}
		parts = append(parts, what)
	}
	code := exitcode.Worst(codes...)
	switch {
	case code != exitcode.OK:
	case stop != exitcode.OK:
		code = stop
	default: // aborted
		code = exitcode.Interrupted
	}
	return exitcode.New(code, errors.New(strings.Join(parts, "; ")))
}

// recordRows is the closing table from the run's record: its clusters in
// stage and name order, then those skipped. It counts the failed and the
// never started, and gathers the failed ones' exit codes. When the run was
// stopped (stop is then its code, 130 or 143), a cluster that ended with an
// error was stopped, with the stop's code, unless its error has a code of
// its own.
func recordRows(run fleet.RunRecord, skipped []fleet.Skipped, ran map[fleet.Cluster]bool, stop int) (rows []fleetRow, failed, notStarted int, codes []int) {
	for _, c := range run.Clusters {
		row := fleetRow{Cluster: c.Cluster, Stage: c.Stage, Result: c.State, Machines: c.Machines, Message: c.Message}
		if c.Started != nil && c.Ended != nil {
			row.DurationMs = c.Ended.Sub(*c.Started).Milliseconds()
		}
		switch {
		case c.State == fleet.Done && !ran[c.Cluster]:
			row.Message = "done earlier"
			if c.Ended != nil {
				row.Message = "done earlier, at " + c.Ended.Format(time.RFC3339)
			}
		case c.State == fleet.Pending || c.State == fleet.NotStarted:
			row.Result = fleet.NotStarted
			notStarted++
			rows = append(rows, row)
			continue
		case c.State == fleet.OutsideWindow:
			rows = append(rows, row)
			continue
		}
		code := exitcode.OK
		if c.ExitCode != nil {
			code = *c.ExitCode
		}
		if c.State == fleet.Failed || c.State == fleet.Stopped {
			failed++
			if stop != exitcode.OK && (code == exitcode.Failure || exitcode.IsStop(code)) {
				row.Result, code = fleet.Stopped, stop
			}
			codes = append(codes, code)
		}
		row.ExitCode = &code
		rows = append(rows, row)
	}
	for _, s := range skipped {
		rows = append(rows, fleetRow{Cluster: s.Cluster, Result: "skipped", Message: s.Reason})
	}
	return rows, failed, notStarted, codes
}

// healthy reads a cluster live, as a run's first look does, and says what
// its guards would refuse: a machine or an etcd member at fault.
func (o *changeOptions) healthy(ctx context.Context, c fleet.Cluster) error {
	conn := o.req.conn.forCluster(c)
	connected, err := conn.connect(ctx, noLoop)
	if err != nil {
		return err
	}
	defer connected.close()
	s, err := connected.engine.Read(ctx)
	if err != nil {
		return err
	}
	return rollout.Healthy(s)
}

// holderName names this process in the run's record.
func holderName() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// scheduled is when a cluster of a fleet run goes, as plan shows it.
type scheduled struct {
	fleet.Cluster
	Stage  int    `json:"stage"`
	Window string `json:"window,omitempty"`
	Goes   string `json:"goes"`
}

// printSchedule prints, before a fleet's plans, when each cluster would go:
// its stage, and for a cluster with a maintenance window whether it is open
// long enough now or when it next is. It prints nothing for a fleet without
// stages or windows, which goes as the plans say.
func (o *requestOptions) printSchedule(ctx context.Context) error {
	scope, err := o.conn.scope(o.sel)
	if err != nil {
		return err
	}
	mgmt, err := o.conn.managementReader()
	if err != nil {
		return err
	}
	members, skipped, err := fleet.Place(ctx, mgmt, scope, o.staged.stages)
	if err != nil {
		return o.conn.firstContact(ctx, err)
	}
	windows := false
	for _, m := range members {
		windows = windows || !m.Window.IsZero()
	}
	if len(o.staged.stages) == 0 && !windows {
		return nil
	}
	now := time.Now()
	var rows []scheduled
	for _, m := range members {
		d := m.Window.Decide(now, time.Duration(max(m.Replicas, 1))*o.staged.MachineTime)
		goes := d.When(now)
		if d.Now && m.Stage > 1 {
			goes = fmt.Sprintf("after stage %d", m.Stage-1)
			if !m.Window.IsZero() {
				goes += " (its window is open now)"
			}
		}
		rows = append(rows, scheduled{Cluster: m.Cluster, Stage: m.Stage, Window: m.Window.String(), Goes: goes})
	}
	switch o.printer.format {
	case "json":
		return writeJSON(o.Streams.Out, struct {
			Schedule []scheduled     `json:"schedule"`
			Skipped  []fleet.Skipped `json:"skipped,omitempty"`
		}{rows, skipped}, true)
	case "text", "wide":
	default:
		return nil
	}
	var cells [][]any
	for _, r := range rows {
		cells = append(cells, []any{r.Cluster.String(), fmt.Sprint(r.Stage), dash(r.Window), r.Goes})
	}
	for _, s := range skipped {
		cells = append(cells, []any{s.Cluster.String(), "-", "-", "skipped: " + s.Reason})
	}
	w := newTabWriter(o.Streams.Out)
	if err := printTable(w, tableColumns([]string{"CLUSTER", "STAGE", "WINDOW", "GOES"}), cells, tableOptions{}); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintln(o.Streams.Out)
	return err
}
