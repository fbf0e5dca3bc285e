package cli

import (
	"context"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// RolloutOptions replaces the machines that KCP finds outdated against the
// KubeadmControlPlane's spec as it stands: a change applied under pause.
type RolloutOptions struct {
	change   changeOptions
	expiring string // what --certificates-expiring-within holds
}

// NewRolloutOptions returns the rollout verb's defaults.
func NewRolloutOptions(streams genericiooptions.IOStreams) *RolloutOptions {
	return &RolloutOptions{change: newChangeOptions(streams, rollout.RolloutOperation)}
}

// NewCmdRollout returns the rollout verb. runF, when set, replaces Run, so
// tests can see what the flags resolve to.
func NewCmdRollout(root *RootOptions, runF func(*RolloutOptions) error) *cobra.Command {
	o := NewRolloutOptions(root.Streams)
	o.change.req.conn.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "rollout (CLUSTER | -l SELECTOR | -A) [--certificates-expiring-within DURATION]",
		Short: "Roll out a change of the control plane's spec, one machine at a time",
		Long: `Replace, one machine at a time, every control-plane machine of CLUSTER that
KCP's own check finds outdated against the KubeadmControlPlane's spec as it
stands — a new infrastructure template, kubeadm configuration, version — then
hand the control plane back; KCP then finds nothing to do.

Change the spec under "kubectl cp-rollout pause CLUSTER": the pause keeps KCP
from rolling the change out by itself, and this verb takes it over. A control
plane that is not paused while KCP already finds machines outdated is in
KCP's own rollout, and is refused (exit 3).

--certificates-expiring-within also replaces the machines whose certificates
expire within that time (whole days: 30d, or 720h), as KCP's
spec.rollout.before.certificatesExpiryDays would, without writing that field.`,
		Example: `  kubectl cp-rollout pause prod-eu1 --reason "apiServer audit flags"
  kubectl patch kcp prod-eu1-control-plane --type merge -p '...'   # or let GitOps apply it
  kubectl cp-rollout rollout prod-eu1
  kubectl cp-rollout rollout prod-eu1 --certificates-expiring-within 30d`,
		Args:              clusterOrSelection,
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	o.change.addFlags(cmd)
	o.change.addFleetFlags(cmd.Flags())
	cmd.Flags().StringVar(&o.expiring, "certificates-expiring-within", "", "Also replace the machines whose certificates expire within this time, in whole days: 30d or 720h")
	return cmd
}

// Complete takes the cluster's name, if given, and puts the expiry window
// in the request.
func (o *RolloutOptions) Complete(cmd *cobra.Command, args []string) error {
	o.change.complete(cmd, args)
	// A bad value is Validate's to refuse.
	o.change.req.request.CertificatesExpiryDays, _ = expiryDays(o.expiring)
	return nil
}

// Validate checks the flags; it changes nothing.
func (o *RolloutOptions) Validate() error {
	if _, err := expiryDays(o.expiring); err != nil {
		return err
	}
	return o.change.validate()
}

// Run performs the rollout, or with --dry-run prints its plan.
func (o *RolloutOptions) Run(ctx context.Context) error { return o.change.run(ctx) }

func (o *RolloutOptions) where() (cluster, namespace string) { return o.change.req.where() }

// minExpiryDays is the least KCP's spec.rollout.before.certificatesExpiryDays
// takes (its CRD's minimum, CAPI v1.14.2): a window the tool rolls by must be
// one KCP could hold the machines to after the hand-back.
const minExpiryDays = 7

// expiryDays is --certificates-expiring-within in days; 0 when not given.
func expiryDays(value string) (int32, error) {
	if value == "" {
		return 0, nil
	}
	return parseDays("certificates-expiring-within", value, minExpiryDays)
}

// parseDays reads a time in whole days, as KCP's certificatesExpiryDays
// counts it: "30d", or a Go duration that is a whole number of days ("720h"),
// of at least least days. A time that is not whole days is told the whole
// days either side of it (36h: 1d or 2d), of those KCP would take; one under
// least is told least, whether whole or not.
func parseDays(flag, value string, least int32) (int32, error) {
	bad := func(why string) error {
		return exitcode.Usagef("--%s %q: %s, like 30d or 720h", flag, value, why)
	}
	var days float64
	if n, ok := strings.CutSuffix(value, "d"); ok {
		d, err := strconv.ParseFloat(n, 64)
		if err != nil {
			return 0, bad("not a number of days")
		}
		days = d
	} else {
		d, err := time.ParseDuration(value)
		if err != nil {
			return 0, bad("not a duration")
		}
		days = d.Hours() / 24
	}
	switch {
	case days <= 0:
		return 0, bad("must be positive")
	case days < float64(least):
		return 0, exitcode.Usagef("--%s %s: at least %d days, as KCP's spec.rollout.before.certificatesExpiryDays: use %dd or more", flag, value, least, least)
	case days > math.MaxInt32:
		return 0, bad("too long")
	case days != math.Trunc(days):
		return 0, exitcode.Usagef("--%s %s is not whole days: use %.0fd or %.0fd (KCP's certificatesExpiryDays is whole days)",
			flag, value, math.Floor(days), math.Ceil(days))
	}
	return int32(days), nil
}
