package cli

import (
	"context"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

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
	Output  string
	Streams genericiooptions.IOStreams
	// jsonLines prints -o json's plan on one line: one cluster's of
	// several (JSON Lines).
	jsonLines bool
	// skip is --skip-check, on the verbs that make the readiness checks
	// (upgrade and plan).
	skip skipChecks
}

func newRequestOptions(streams genericiooptions.IOStreams, operation rollout.Operation) requestOptions {
	return requestOptions{
		Streams: streams,
		request: rollout.Request{Operation: operation, MaxSurge: -1},
		Output:  "text",
	}
}

// requestOutputs are the values of the request verbs' -o.
var requestOutputs = []string{"text", "json"}

func (o *requestOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.Int32Var(&o.request.MaxSurge, "max-surge", o.request.MaxSurge, "Machines created above the replica count during a rollout: 1 (replacement first) or 0 (delete first, for clusters without spare capacity; needs at least 3 replicas); -1 uses the KubeadmControlPlane's rollout.strategy.rollingUpdate.maxSurge")
	f.StringVarP(&o.Output, "output", "o", o.Output, "Progress format: text (spinner on a terminal, timestamped lines otherwise) or json (JSON Lines events on stdout)")
	completeOutput(cmd, requestOutputs)
	o.conn.addEtcdEndpointFlag(f)
	o.conn.addKCPVersionFlag(f)
}

// validate checks the request's own rules (rollout.Request.Validate) and
// the flags every request shares.
func (o *requestOptions) validate() error {
	if err := o.request.Validate(); err != nil {
		return err
	}
	if err := oneOf("output", o.Output, requestOutputs...); err != nil {
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
