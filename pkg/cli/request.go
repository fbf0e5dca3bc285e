package cli

import (
	"context"
	"slices"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// requestOptions are what plan and every verb that changes a control plane
// share: the cluster or selection a request is for, what it asks of the
// control plane, and how its answer is shown.
type requestOptions struct {
	conn connection
	sel  selection
	// request is what the verb asks of the control plane: the operation and
	// its version, replicas or machine, and the surge.
	request rollout.Request
	// Output is -o: for a run, how its progress is shown (text, or json's
	// events); for plan, and a run's --dry-run, how the plan is printed.
	Output  string
	Streams genericiooptions.IOStreams
	// printer prints the plan as -o asks: validate completes it from
	// Output and the verb's values.
	printer printFlags
	// jsonLines prints -o json's plan on one line: one cluster's of
	// several (JSON Lines).
	jsonLines bool
	// skip is --skip-check, on the verbs that make the readiness checks
	// (upgrade and plan).
	skip skipChecks
	// staged is a fleet run's stages, windows and record: plan shows when
	// each cluster goes, a run goes so.
	staged stagedFlags
}

func newRequestOptions(streams genericiooptions.IOStreams, operation rollout.Operation) requestOptions {
	return requestOptions{
		Streams: streams,
		request: rollout.Request{Operation: operation, MaxSurge: -1},
		Output:  "text",
		printer: printFlags{values: requestOutputs},
		staged:  newStagedFlags(),
	}
}

// runOutputHelp is the run verbs' -o: text or an event stream, nothing that
// reads one object.
const runOutputHelp = "Output format of the run's progress: text (a spinner on a terminal, timestamped lines otherwise) or json (an event stream: one JSON object per line on stdout, JSON Lines, ending with a summary event; not one object, so yaml, jsonpath and the other formats of plan and status do not apply). With --dry-run, the plan as plan -o text or -o json prints it"

// planOutputHelp is plan's -o: one object, not the run's event stream.
const planOutputHelp = "Output format: text (a row per step, then the readiness checks), wide (also each step's failure domain and the checks' durations), json (one object, {cluster, namespace, operation, target, steps, checks}, not an event stream; with -l/-A one such object per cluster, compact on a line of its own), yaml (that object; with -l/-A the list of them), jsonpath=TEMPLATE or go-template=TEMPLATE (read that object, per cluster), or custom-columns=HEADER:FIELD,... (a line per step, from its fields and cluster, namespace)"

// addFlags adds the run verbs' flags that plan shares, with the run's -o.
func (o *requestOptions) addFlags(cmd *cobra.Command) {
	o.addFlagsWith(cmd, requestOutputs, runOutputHelp)
}

// addFlagsWith adds those flags with the -o values and help of the verb:
// plan prints objects, a run its events.
func (o *requestOptions) addFlagsWith(cmd *cobra.Command, outputs []string, outputHelp string) {
	f := cmd.Flags()
	o.printer.values = outputs
	f.Int32Var(&o.request.MaxSurge, "max-surge", o.request.MaxSurge, "Machines created above the replica count during a rollout: 1 (replacement first) or 0 (delete first, for clusters without spare capacity; needs at least 3 replicas); -1 uses the KubeadmControlPlane's rollout.strategy.rollingUpdate.maxSurge")
	addOutputFlag(cmd, &o.Output, outputs, outputHelp)
	o.conn.addEtcdEndpointFlag(f)
	o.conn.addKCPVersionFlag(f)
}

// validate checks the request's own rules (rollout.Request.Validate) and
// the flags every request shares.
func (o *requestOptions) validate() error {
	if err := o.request.Validate(); err != nil {
		return err
	}
	o.printer.Output = o.Output
	if err := o.printer.complete(); err != nil {
		if slices.Equal(o.printer.values, requestOutputs) && !acceptsOutput(requestOutputs, o.Output) {
			// Someone who asks a run for yaml or a template wants an
			// object: say where one is.
			return exitcode.Usagef("%v: a run prints its progress, as text or as a stream of JSON events; plan prints the plan in the other formats", err)
		}
		return err
	}
	if err := o.skip.validate(); err != nil {
		return err
	}
	if err := o.conn.checkKCPVersionFlag(); err != nil {
		return err
	}
	return o.conn.validateEtcdEndpoint()
}

func (o *requestOptions) where() (cluster, namespace string) { return o.conn.where(&o.sel) }

// readiness makes the readiness checks (check) for an upgrade that has not
// begun, as Prepare found the cluster: nil for any other request, for one
// with nothing to do, and for a run resuming an upgrade of its own, which
// made them before it took the cluster over; its own half-done rollout is
// no reason to stop finishing it.
func (o *requestOptions) readiness(ctx context.Context, c *connected, p *rollout.Prepared, timeouts rollout.Timeouts) (*checkReport, error) {
	if o.request.Operation != rollout.UpgradeOperation || p == nil || p.NothingToDo != "" {
		return nil, nil
	}
	if rec, err := record.Of(p.Snapshot.CP.KCP); err != nil || rec != nil && rec.Operation == string(rollout.UpgradeOperation) {
		return nil, err
	}
	// A live read of the cluster as it is: Prepare's snapshot is projected
	// onto the spec the run will set, against which every machine is
	// outdated.
	s, err := c.engine.Read(ctx)
	if err != nil {
		return nil, err
	}
	return readinessOf(ctx, c, s, o.request.Version, timeouts, o.skip.names)
}
