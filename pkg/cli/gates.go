package cli

import (
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// gateFlags are the gates between machines as flags (rollout/gates.go):
// the operator's --gate, how many passes in a row it needs and how long it
// may take, and the --soak after it. They bind to the run's Timeouts, which
// carry them to the engine. The DaemonSets' wait, always made, is bounded by
// --health-timeout and has no flag of its own.
type gateFlags struct{ t *rollout.Timeouts }

func (g gateFlags) addFlags(f *pflag.FlagSet) {
	gates := &g.t.Gates
	f.StringVar(&gates.Command, "gate", gates.Command, "After each new machine is healthy and its DaemonSets are Ready, run this command with sh -c before the next step; it must exit 0 (its environment names the machine: CP_ROLLOUT_CLUSTER, CP_ROLLOUT_NAMESPACE, CP_ROLLOUT_MACHINE, CP_ROLLOUT_NODE, CP_ROLLOUT_STEP; its output goes to stderr). Command line only: refused from the config file and the environment")
	f.IntVar(&gates.Count, "gate-count", gates.Count, "How many times in a row --gate must pass for each new machine, "+rollout.GateInterval.String()+" apart; a failure starts the count again")
	f.DurationVar(&gates.Timeout, "gate-timeout", gates.Timeout, "How long --gate may take to pass --gate-count times in a row for one machine (each attempt is cut at "+rollout.GateAttemptLimit.String()+") before the run stops (exit 4)")
	f.DurationVar(&g.t.Settle, "soak", g.t.Settle, "Wait this long after each new machine passed its gates, before the next step (usually deleting an old machine); the loop then reads again and the guards decide afresh")
	// --settle was the soak's name before there were gates; runbooks still
	// pass it.
	f.DurationVar(&g.t.Settle, settleFlag, g.t.Settle, "Deprecated alias of --soak")
	_ = f.MarkDeprecated(settleFlag, "use --soak")
}

// deprecationsToStderr sends what pflag says of a deprecated flag (--settle)
// to the command's standard error: cobra would copy it to standard output,
// where -o json's events go, and a runbook's parser would choke on it.
func deprecationsToStderr(cmd *cobra.Command) {
	cmd.Flags().SetOutput(commandStderr{cmd})
}

// commandStderr is cmd's standard error as it is when written to: a verb is
// given the root's streams only once it is added to the root.
type commandStderr struct{ cmd *cobra.Command }

func (w commandStderr) Write(p []byte) (int, error) { return w.cmd.ErrOrStderr().Write(p) }

// settleFlag is --soak's former name, a deprecated alias of it.
const settleFlag = "settle"

// aliasOf maps a deprecated flag to the flag it stands for, and back: a
// command line that gives either must win over the config file and the
// environment giving the other (applyConfig).
var aliasOf = map[string]string{settleFlag: "soak", "soak": settleFlag}

func (g gateFlags) validate() error {
	gates := g.t.Gates
	if gates.Count < 1 {
		return exitcode.Usagef("--gate-count must be at least 1, not %d", gates.Count)
	}
	if gates.Count > 1 && gates.Command == "" {
		return exitcode.Usagef("--gate-count %d needs --gate: it counts the passes of that command", gates.Count)
	}
	if gates.Timeout <= 0 {
		return exitcode.Usagef("--gate-timeout must be positive, not %s", gates.Timeout)
	}
	if g.t.Settle < 0 {
		return exitcode.Usagef("--soak must not be negative, not %s", g.t.Settle)
	}
	// A bound shorter than the pause between two attempts cannot see a
	// second pass: say so rather than fail every machine.
	if least := time.Duration(gates.Count-1) * rollout.GateInterval; gates.Command != "" && gates.Timeout <= least {
		return exitcode.Usagef("--gate-timeout %s is too short for --gate-count %d: passes are %s apart", gates.Timeout, gates.Count, rollout.GateInterval)
	}
	return nil
}
