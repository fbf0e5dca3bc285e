package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// HandbackOptions gives a control plane back to KCP.
type HandbackOptions struct {
	conn connection
	sel  selection
	// Force releases a lock that its holder still renews.
	Force bool
	// Handing back more than one cluster, or with -A alone, is confirmed.
	consent confirmation
	Streams genericiooptions.IOStreams
	// output is -o: text (a line for each thing done) or one of the
	// formats of an object, one per cluster.
	output printFlags
}

// handbackOutputs are the values of handback's -o: it prints an object per
// cluster.
var handbackOutputs = objectOutputs

// handedBack is what handback -o json prints of a cluster: what it did, in
// the words of the text form's lines.
type handedBack struct {
	Cluster   string   `json:"cluster"`
	Namespace string   `json:"namespace"`
	Done      []string `json:"done"`
}

// NewHandbackOptions returns the handback verb's defaults.
func NewHandbackOptions(streams genericiooptions.IOStreams) *HandbackOptions {
	return &HandbackOptions{Streams: streams, consent: newConfirmation(streams), output: printFlags{Output: "text", values: handbackOutputs}}
}

// NewCmdHandback returns the handback verb. runF, when set, replaces Run, so
// tests can see what the flags resolve to.
func NewCmdHandback(root *RootOptions, runF func(*HandbackOptions) error) *cobra.Command {
	o := NewHandbackOptions(root.Streams)
	o.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use: "handback (CLUSTER | -l SELECTOR | -A)",
		// resume is what clusterctl (alpha rollout resume) and kubectl
		// (rollout resume) call giving a paused object back to its
		// controller: a user who reaches for it finds this verb.
		Aliases: []string{"resume"},
		Short:   "Give a control plane back to KCP after an interrupted run or a pause (alias: resume)",
		Long: `End this tool's ownership of CLUSTER's control plane: release a lock whose
run is gone, remove the pause and the operation record this tool set on the
KubeadmControlPlane, and say what KCP will now do by itself. A pause that
carries no record of this tool is someone else's and is never removed. A lock
that a live run still renews is only released with --force. With -l/-A, each
matching cluster is handed back in turn, once the list of them is confirmed
(--yes, or an answer at the terminal) when it holds more than one.

"resume" is another name for this verb, as clusterctl and kubectl name
theirs: "kubectl cp-rollout resume CLUSTER" is the same command.`,
		Example:           `  kubectl cp-rollout handback prod-eu1`,
		Args:              clusterOrSelection,
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	o.sel.addFlags(cmd.Flags())
	cmd.Flags().BoolVar(&o.Force, "force", false, "Release the lock even while its holder renews it (only when you know that run is gone)")
	o.consent.addYesFlag(cmd.Flags())
	addOutputFlag(cmd, &o.output.Output, handbackOutputs, "Output format: text (a line for each thing done; over -l/-A each line names its cluster), json (one object, {cluster, namespace, done}; over -l/-A one per cluster, compact on a line of its own), yaml (that object; over -l/-A a list of them), or jsonpath=TEMPLATE or go-template=TEMPLATE (read that object, per cluster)")
	return cmd
}

// Complete takes the cluster's name, if given.
func (o *HandbackOptions) Complete(_ *cobra.Command, args []string) error {
	o.conn.completeCluster(args)
	return nil
}

// Validate checks that a cluster or a selection was given, and that -A alone
// is confirmed or can be.
func (o *HandbackOptions) Validate() error {
	if err := o.output.complete(); err != nil {
		return err
	}
	if err := validateSelection("handback", o.conn.Cluster, o.sel); err != nil {
		return err
	}
	return o.consent.validateEveryCluster("handback", &o.sel)
}

// Run hands the named control plane back, or each selected one in turn, and
// prints what it did to stdout; over several clusters each line names its
// cluster, and one that fails does not stop the others.
func (o *HandbackOptions) Run(ctx context.Context) error {
	if !o.sel.fleet() {
		return o.handback(ctx, false)
	}
	clusters, skipped, err := o.conn.selectClusters(ctx, o.sel)
	if err != nil {
		return err
	}
	if err := o.confirmHandback(ctx, clusters); err != nil {
		return err
	}
	return o.conn.inTurn(ctx, o.Streams.ErrOut, clusters, skipped, func(one connection) error {
		opts := *o
		opts.conn, opts.sel = one, selection{}
		return opts.handback(ctx, true)
	})
}

func (o *HandbackOptions) where() (cluster, namespace string) { return o.conn.where(&o.sel) }

// confirmHandback asks before handing back more than one cluster, or every
// cluster: each goes back to KCP where it stands, and KCP then finishes any
// rollout left there in its own way, not one machine at a time as this tool.
func (o *HandbackOptions) confirmHandback(ctx context.Context, clusters []fleet.Cluster) error {
	if len(clusters) < 2 && !o.sel.everyCluster() {
		return nil
	}
	return o.consent.confirm(ctx, o.Streams, "handback", clusters)
}

// handback hands one control plane back and prints what it did.
func (o *HandbackOptions) handback(ctx context.Context, inFleet bool) error {
	// Progress on stderr: the wait to see whether a lock's holder still
	// renews it takes up to its duration.
	reporter := progress.New("", o.Streams.Out, o.Streams.ErrOut)
	defer reporter.Stop()
	c, err := o.conn.connect(ctx, handbackUse(reporter, o.Streams.ErrOut))
	if err != nil {
		return err
	}
	defer c.close()
	h, err := c.engine.Handback(ctx, o.Force)
	if err != nil {
		return err
	}
	return printHandedBack(o.Streams.Out, o.output, inFleet, handedBack{Cluster: o.conn.Cluster, Namespace: o.conn.Namespace, Done: h.Lines()})
}

// printHandedBack prints what handback did to one cluster: a line for each
// thing, each line naming the cluster in a fleet; otherwise the object, as
// -o asks, -o json on one line in a fleet (JSON Lines).
func printHandedBack(out io.Writer, output printFlags, inFleet bool, h handedBack) error {
	return output.print(out, h, inFleet, func(tableOptions) error {
		prefix := ""
		if inFleet {
			prefix = h.Namespace + "/" + h.Cluster + ": "
		}
		for _, line := range h.Done {
			if _, err := fmt.Fprintln(out, prefix+line); err != nil {
				return err
			}
		}
		return nil
	})
}

func (h handedBack) docs() []doc   { return []doc{{h.Namespace + "/" + h.Cluster, h}} }
func (h handedBack) rowSet() []row { return nil } // no -o name or custom-columns
