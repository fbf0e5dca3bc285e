package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/pkg/access"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// StatusOptions shows where a control plane stands.
type StatusOptions struct {
	conn connection
	sel  selection
	// output is -o, --no-headers and --sort-by.
	output  printFlags
	Streams genericiooptions.IOStreams
	// Etcd adds, over a fleet, each workload cluster's etcd health.
	Etcd bool
	// Watch shows the status again, read afresh every Interval, until
	// Ctrl-C.
	Watch    bool
	Interval time.Duration
	// intervalGiven is whether --interval was on the command line: it
	// needs -w.
	intervalGiven bool
}

// defaultWatchInterval is how often status -w reads the status afresh.
const defaultWatchInterval = 2 * time.Second

// NewStatusOptions returns the status verb's defaults.
func NewStatusOptions(streams genericiooptions.IOStreams) *StatusOptions {
	return &StatusOptions{output: printFlags{Output: "text", values: statusOutputs}, Streams: streams, Interval: defaultWatchInterval}
}

// NewCmdStatus returns the status verb. runF, when set, replaces Run, so tests
// can see what the flags resolve to.
func NewCmdStatus(root *RootOptions, runF func(*StatusOptions) error) *cobra.Command {
	o := NewStatusOptions(root.Streams)
	o.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "status (CLUSTER | -l SELECTOR | -A)",
		Short: "Show a control plane: KCP, lock, machines, etcd members and the next step",
		Long: `Show the KubeadmControlPlane of CLUSTER (version, replicas, pause and this
tool's operation record), the KCP controller's version and whether this tool
is proven with it, who holds the lock, the control-plane machines and the
etcd members, and the step a rollout would take next. Read-only: it takes
no lock and works while a rollout runs. An identity that may not read the
cluster's <cluster>-kubeconfig and <cluster>-etcd Secrets (cp-rollout-view
alone) sees the management cluster's half, without nodes, etcd members or the
next step, and a warning on stderr; the exit code is still 0.

With -l SELECTOR or -A instead of CLUSTER: one row per cluster (version,
machines up to date, who acts, pause and by whom, lock holder, operation in
progress and the last one finished), from a few reads of the management
cluster alone; --etcd adds each workload cluster's etcd health, read a few
clusters at a time.

With -w, the status is read afresh every --interval and shown again until
Ctrl-C (exit 0), whether this tool or KCP rolls the machines (ACTING says
which): on a terminal redrawn in place, as watch(1) does; otherwise a new
block, headed by its time, only when the status changed; with -o json one
object per line for each change (over -l/-A, each cluster's row that changed).`,
		Example: `  kubectl cp-rollout status prod-eu1
  kubectl cp-rollout status prod-eu1 -w
  kubectl cp-rollout status prod-eu1 -o json | jq '.etcdMembers[] | select(.leader)'
  kubectl cp-rollout status prod-eu1 -o custom-columns=NAME:.name,VERSION:.version,DOMAIN:.failureDomain --sort-by .failureDomain
  kubectl cp-rollout status -A
  kubectl cp-rollout status -l env=staging --etcd -o wide`,
		Args:              clusterOrSelection,
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	addOutputFlag(cmd, &o.output.Output, o.output.values, "Output format: text (the status), wide (with more columns), json (one object; over -l/-A one compact row object per cluster, a line each), yaml (that object; over -l/-A the list of rows), name (machine.cluster.x-k8s.io/NAME per machine; over -l/-A cluster.cluster.x-k8s.io/NAME per cluster), jsonpath=TEMPLATE or go-template=TEMPLATE (read the object -o json prints; over -l/-A each row in turn), or custom-columns=HEADER:FIELD,... (a line per machine, over -l/-A per cluster)")
	cmd.Flags().BoolVar(&o.output.NoHeaders, "no-headers", false, "With the text, wide and custom-columns formats: print no column headers")
	cmd.Flags().StringVar(&o.output.SortBy, "sort-by", "", "Order the machines (over -l/-A, the clusters) by this field of their JSON, e.g. .created or '{.failureDomain}'")
	o.conn.addEtcdEndpointFlag(cmd.Flags())
	o.sel.addFlags(cmd.Flags())
	cmd.Flags().BoolVar(&o.Etcd, "etcd", false, "With -l/-A: also read each workload cluster's etcd members and health (a single cluster's status always does)")
	cmd.Flags().BoolVarP(&o.Watch, "watch", "w", false, "Show the status again as it changes, read afresh every --interval, until Ctrl-C")
	cmd.Flags().DurationVar(&o.Interval, "interval", o.Interval, "With -w: how often the status is read afresh")
	return cmd
}

// Complete takes the cluster's name, if given, and makes the printer -o
// asks for.
func (o *StatusOptions) Complete(cmd *cobra.Command, args []string) error {
	o.conn.completeCluster(args)
	o.intervalGiven = cmd.Flags().Changed("interval")
	return o.output.complete()
}

// Validate checks the flags; it changes nothing.
func (o *StatusOptions) Validate() error {
	if err := validateSelection("status", o.conn.Cluster, o.sel); err != nil {
		return err
	}
	switch {
	case o.intervalGiven && !o.Watch:
		return exitcode.Usagef("--interval needs -w: it is how often a watch reads the status")
	case o.Interval <= 0:
		return exitcode.Usagef("--interval must be positive, not %s", o.Interval)
	case o.Watch && o.output.format == "yaml":
		// A YAML stream of changes would need document separators no one
		// reads for; JSON Lines are what a program follows.
		return exitcode.Usagef("-w cannot go with -o yaml: use -o json, which prints one object per line for each change")
	}
	return o.conn.validateEtcdEndpoint()
}

// Run prints the status to stdout, or with -w keeps printing it.
func (o *StatusOptions) Run(ctx context.Context) error {
	var read func(context.Context) (*statusView, error)
	if o.sel.fleet() {
		readFleet, err := o.fleetReader()
		if err != nil {
			return err
		}
		read = readFleet
	} else {
		readCluster, closeEngine, err := o.clusterReader(ctx)
		if err != nil {
			return err
		}
		defer closeEngine()
		read = readCluster
	}
	if o.output.sortBy != nil {
		read = o.sorted(read)
	}
	if o.Watch {
		return o.watcher().run(ctx, read)
	}
	v, err := read(ctx)
	if err != nil {
		return err
	}
	return o.print(o.Streams.Out, v, time.Now())
}

// statusView is what one read shows: one cluster's status, or the rows of
// a fleet.
type statusView struct {
	status *rollout.Status
	rows   []fleet.Row
}

// docs are the objects -o json prints (over a fleet, each on a line of its
// own) and jsonpath and go-template read, each in turn.
func (v *statusView) docs() []doc {
	if v.status != nil {
		return []doc{{v.status.Namespace + "/" + v.status.Cluster, v.status}}
	}
	docs := make([]doc, len(v.rows))
	for i, r := range v.rows {
		docs[i] = doc{r.Cluster.String(), r}
	}
	return docs
}

// rowSet is the view's rows: its machines, the natural rows of one
// cluster's status (its other parts are one of each), or its clusters.
func (v *statusView) rowSet() []row {
	var rows []row
	if v.status != nil {
		for _, m := range v.status.Machines {
			rows = append(rows, row{"Machine", m.Name, m})
		}
		return rows
	}
	for _, r := range v.rows {
		rows = append(rows, row{"Cluster", r.Name, r})
	}
	return rows
}

// sorted orders each read's rows by --sort-by, whatever then prints them.
func (o *StatusOptions) sorted(read func(context.Context) (*statusView, error)) func(context.Context) (*statusView, error) {
	return func(ctx context.Context) (*statusView, error) {
		v, err := read(ctx)
		switch {
		case err != nil:
			return nil, err
		case v.status != nil:
			err = sortRows(v.status.Machines, o.output.sortBy)
		default:
			err = sortRows(v.rows, o.output.sortBy)
		}
		return v, exitcode.New(exitcode.Usage, err)
	}
}

// clusterReader connects to the named cluster once and returns what reads
// its status, afresh at each call: -w calls it every interval. The
// connection (the permission check, the workload cluster's kubeconfig, the
// etcd client) is set up once; every read through it is live.
func (o *StatusOptions) clusterReader(ctx context.Context) (read func(context.Context) (*statusView, error), closeEngine func(), err error) {
	c, err := o.conn.connect(ctx, viewOnly(o.Streams.ErrOut))
	if err != nil {
		return nil, nil, err
	}
	// The first read takes the control plane connect has just read.
	engine, cp, connected := c.engine, c.cp, c.first
	warned := false
	return func(ctx context.Context) (*statusView, error) {
		st, err := engine.Status(ctx, connected)
		connected = nil
		if err != nil {
			return nil, err
		}
		if st.KubeadmConfigsNotRead && !warned {
			warned = true // once, as the preflight's: -w reads again and again
			fmt.Fprintln(o.Streams.ErrOut, o.kubeadmConfigsWarning(ctx, cp.Kube()))
		}
		st.KCPController = kcpController(cp.KCPControllerVersion(ctx))
		return &statusView{status: st}, nil
	}, c.close, nil
}

// kubeadmConfigsWarning says, as the preflight says of the Secrets, that
// the machines' KubeadmConfigs were not read, why, which Role grants them,
// and what the UP-TO-DATE column shows instead; kube is the management
// client, whose identity it names.
func (o *StatusOptions) kubeadmConfigsWarning(ctx context.Context, kube client.Client) string {
	identity := "this identity"
	if who := access.Identity(ctx, kube); who != "" {
		identity = who
	}
	scope := access.Scope{Namespace: o.conn.Namespace, Cluster: o.conn.Cluster}
	return fmt.Sprintf("warning: KubeadmConfigs not read: they hold the machines' node-join token, and reading them needs get and list on kubeadmconfigs.%s in namespace %s, which %s lacks (Role %s grants it; %s prints it); UP-TO-DATE is KCP's own UpToDate condition on each machine, and unknown where KCP has not judged the KubeadmControlPlane's current spec",
		bootstrapv1.GroupVersion.Group, o.conn.Namespace, identity, rbac.Operate.RoleName(o.conn.Cluster), access.PrintRoles(scope))
}

func (o *StatusOptions) where() (cluster, namespace string) { return o.conn.where(&o.sel) }

// print prints v as -o asks: the one path every format of status, with or
// without -w, takes. Over a fleet -o json prints JSON Lines, a row a line,
// as each cluster is read.
func (o *StatusOptions) print(out io.Writer, v *statusView, now time.Time) error {
	return o.output.print(out, v, v.status == nil, func(opts tableOptions) error {
		if v.status != nil {
			return printStatus(out, v.status, opts, now)
		}
		return printFleetStatus(out, v.rows, opts, o.Etcd)
	})
}

// kcpController is what status shows of the KCP controller, whatever the
// read gave: status refuses nothing, so the version it could not read is
// only "unknown", and why. The reasons are short: KCPControllerVersion's own
// words tell a verb that refuses to pass --kcp-version, which status has not.
func kcpController(version string, err error) *rollout.KCPControllerStatus {
	switch {
	case err == nil && version == "":
		return &rollout.KCPControllerStatus{Error: "its image has no tag"}
	case err == nil:
		return &rollout.KCPControllerStatus{Version: version, Proven: rollout.KCPVersionProven(version)}
	case apierrors.IsForbidden(err):
		// Without the get the role grants, the preflight has warned of it.
		return &rollout.KCPControllerStatus{Error: "forbidden"}
	case exitcode.Of(err) == exitcode.Unsafe:
		// KCPControllerVersion refuses (exit 3) only when it found no
		// Deployment running the controller.
		return &rollout.KCPControllerStatus{Error: "not found"}
	}
	return &rollout.KCPControllerStatus{Error: exitcode.Cause(err).Error()}
}

// kcpControllerLine is the KCP CONTROLLER line's text: the version, and
// whether the verbs that roll machines will take it.
func kcpControllerLine(k *rollout.KCPControllerStatus) string {
	switch {
	case k.Version == "":
		return "unknown (" + k.Error + ")"
	case k.Proven:
		return fmt.Sprintf("%s (proven: %s)", k.Version, rollout.ProvenKCPRange())
	}
	return fmt.Sprintf("%s (not proven: this tool is proven with %s; upgrade, scale, replace, restart and rollout refuse it)",
		k.Version, rollout.ProvenKCPRange())
}

// printStatus prints one cluster's status: a line for each part of the
// control plane, then its machines and etcd members as tables.
func printStatus(out io.Writer, st *rollout.Status, opts tableOptions, now time.Time) error {
	w := newTabWriter(out)
	cp := st.ControlPlane
	fmt.Fprintf(w, "CLUSTER\t%s/%s\n", st.Namespace, st.Cluster)
	fmt.Fprintf(w, "ACTING\t%s\n", st.Acting)
	fmt.Fprintf(w, "CONTROL PLANE\t%s  %s  %d replicas  %s\n", cp.Name, cp.Version, cp.Replicas, rollout.PauseState(cp.Paused, st.Operation))
	if st.KCPController != nil {
		fmt.Fprintf(w, "KCP CONTROLLER\t%s\n", kcpControllerLine(st.KCPController))
	}
	if op := st.Operation; op != nil && cp.PausedByUs {
		line := op.String()
		if f := op.LastFailure; f != nil {
			line += fmt.Sprintf("; last run failed %s (exit %d)", f.Time.UTC().Format(time.RFC3339), f.ExitCode)
		}
		fmt.Fprintf(w, "OPERATION\t%s\n", line)
	}
	if t := st.Topology; t != nil {
		replicas := ""
		if t.Replicas != nil {
			replicas = fmt.Sprintf("  %d replicas", *t.Replicas)
		}
		fmt.Fprintf(w, "TOPOLOGY\tClusterClass %s  %s%s (the topology controller sets the control plane's version and replicas from here)\n", t.Class, t.Version, replicas)
	}
	lock := "free"
	if st.Lock != nil && st.Lock.Holder != "" {
		lock = st.Lock.Holder
		if st.Lock.RenewTime != nil {
			lock += fmt.Sprintf(" (renewed %s ago)", age(*st.Lock.RenewTime, now))
		}
		if !st.Lock.Live {
			lock += ", expired"
		}
	}
	fmt.Fprintf(w, "LOCK\t%s\n", lock)
	if last := st.LastOperation; last != nil {
		line := last.String()
		if last.Finished != nil {
			line += ", finished " + last.Finished.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "LAST OPERATION\t%s\n", line)
	}
	if st.Next != nil {
		fmt.Fprintf(w, "NEXT\t%s: %s\n", st.Next.Action, st.Next.Reason)
	}
	fmt.Fprintln(w)

	var machines [][]any
	for _, m := range st.Machines {
		var upToDate any = m.UpToDate
		if m.UpToDateUnknown {
			upToDate = "unknown"
		}
		machines = append(machines, []any{m.Name, m.Version, dash(m.Node), dash(m.FailureDomain), dash(m.Phase),
			upToDate, m.Deleting, age(m.Created, now), dash(m.Problem), dash(m.HealthCheck)})
	}
	if err := printTable(w, machineColumns, machines, opts); err != nil {
		return err
	}
	switch {
	case st.ManagementOnly:
		fmt.Fprintln(w, "\nETCD\tnot read: the workload cluster was not reached (see the warning on stderr)")
	case st.EtcdManaged:
		fmt.Fprintln(w)
		var members [][]any
		for _, m := range st.EtcdMembers {
			members = append(members, []any{dash(m.Name), m.ID, m.Leader, m.Healthy, m.Learner,
				resource.NewQuantity(m.DBSize, resource.BinarySI).String(), dash(strings.Join(m.Alarms, ",")),
				dash(m.Version), dash(strings.Join(m.Errors, "; "))})
		}
		if err := printTable(w, memberColumns, members, opts); err != nil {
			return err
		}
	default:
		fmt.Fprintln(w, "\nETCD\texternal (not managed by the control plane)")
	}
	for _, e := range st.Errors {
		fmt.Fprintf(w, "\nWARNING\t%s\n", e)
	}
	return w.Flush()
}

// The tables of status CLUSTER; -o wide adds the last columns of each.
var (
	machineColumns = tableColumns([]string{"MACHINE", "VERSION", "NODE", "FAILURE DOMAIN", "PHASE", "UP-TO-DATE", "DELETING", "AGE"},
		"PROBLEM", "HEALTH CHECK")
	memberColumns = tableColumns([]string{"ETCD MEMBER", "ID", "LEADER", "HEALTHY", "LEARNER", "DB SIZE", "ALARMS"},
		"VERSION", "ERRORS")
)

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
