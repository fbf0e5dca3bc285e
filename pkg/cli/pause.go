package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// PauseOptions holds a control plane back from KCP before its spec changes,
// so that this tool, not KCP, rolls the change out.
type PauseOptions struct {
	conn    connection
	Reason  string
	Streams genericiooptions.IOStreams
}

// NewPauseOptions returns the pause verb's defaults.
func NewPauseOptions(streams genericiooptions.IOStreams) *PauseOptions {
	return &PauseOptions{Streams: streams}
}

// NewCmdPause returns the pause verb. runF, when set, replaces Run, so tests
// can see what the flags resolve to.
func NewCmdPause(root *RootOptions, runF func(*PauseOptions) error) *cobra.Command {
	o := NewPauseOptions(root.Streams)
	o.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "pause CLUSTER [--reason TEXT]",
		Short: "Pause a control plane before changing its spec, so this tool rolls the change out",
		Long: `Pause the KubeadmControlPlane of CLUSTER as a rollout of this tool does, with
a record that says who paused it and why, and wait until KCP reports Paused.
A change of the KubeadmControlPlane's spec made next (in Git, or with kubectl)
then starts no rollout of KCP's own. Roll it out one machine at a time with
"kubectl cp-rollout rollout CLUSTER", which takes the pause over and hands the
control plane back at the end; or let KCP roll it with "kubectl cp-rollout
handback CLUSTER".

Pausing a control plane already paused by pause changes nothing. One paused by
someone else, or by another operation of this tool, is refused (exit 3).
While paused, KCP remediates no machine and renews no certificate.`,
		Example: `  kubectl cp-rollout pause prod-eu1 --reason "CHG-1234: apiServer audit flags"
  # apply the change (Git, kubectl apply), then:
  kubectl cp-rollout rollout prod-eu1`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return exitcode.Usagef("pause needs one argument, the Cluster's name; got %d", len(args))
			}
			return nil
		},
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	cmd.Flags().StringVar(&o.Reason, "reason", "", "Why the control plane is paused (a change ticket, say), kept in the pause's record and shown by status")
	return cmd
}

// Complete takes the cluster's name.
func (o *PauseOptions) Complete(_ *cobra.Command, args []string) error {
	o.conn.completeCluster(args)
	return nil
}

// Validate checks the flags; it changes nothing.
func (o *PauseOptions) Validate() error {
	// pause takes no -l/-A: an empty CLUSTER name is refused in the words
	// the verbs that take them use for a missing one.
	return validateSelection("pause", o.conn.Cluster, selection{})
}

// Run pauses the control plane, then prints on stdout what it did and what to
// do next.
func (o *PauseOptions) Run(ctx context.Context) error {
	reporter := progress.New("", o.Streams.Out, o.Streams.ErrOut)
	defer reporter.Stop()
	c, err := o.conn.connect(ctx, pauseUse(reporter, o.Streams.ErrOut))
	if err != nil {
		return err
	}
	defer c.close()
	held, err := c.engine.Hold(ctx, o.Reason)
	if err != nil {
		return err
	}
	reporter.Stop()
	printHeld(o.Streams, held, o.conn.Cluster, o.conn.Namespace)
	return nil
}

func (o *PauseOptions) where() (cluster, namespace string) { return o.conn.Cluster, o.conn.Namespace }

// printHeld says whose pause holds the control plane, and the ways on.
func printHeld(streams genericiooptions.IOStreams, held *rollout.Held, cluster, namespace string) {
	state := "paused"
	if held.Already {
		state = "was already paused"
	}
	ns := ""
	if namespace != "" {
		ns = " -n " + namespace
	}
	fmt.Fprintf(streams.Out, "KubeadmControlPlane %s %s by cp-rollout pause (%s); KCP reports Paused.\n", held.KCP, state, held.Record.Detail())
	fmt.Fprintf(streams.Out, `Next: apply the change to the KubeadmControlPlane's spec (Git, kubectl apply); KCP does not act on it while paused. Then either
  kubectl cp-rollout rollout %[1]s%[2]s    # replace the outdated machines one at a time, then hand back
  kubectl cp-rollout handback %[1]s%[2]s   # or let KCP roll the change out itself
`, cluster, ns)
}
