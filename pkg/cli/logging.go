package cli

import (
	"flag"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// addVerbosityFlag adds kubectl's -v/--v. kubectl hands a plugin the flags
// typed after its name as they were typed, so the plugin parses -v itself.
func addVerbosityFlag(f *pflag.FlagSet, level *int) {
	f.IntVarP(level, "v", "v", 0, "Log level, as kubectl's: 6 logs each request to an API server (method, URL, status, duration) on stderr, 8 also its body (the Secrets this tool reads among them)")
}

// setLogging sets klog's verbosity to level, so that client-go logs its
// requests as it does for kubectl (its round trippers log at 6 and above,
// and are set up when a client is made, after this). Cluster API's code that
// the tool runs (KCP's failure-domain choice, for one) logs through
// controller-runtime's logger: with -v it goes to klog too; without, it is
// discarded, as the tool reports through its own reporter. Left unset,
// controller-runtime would print a warning with a stack trace on stderr 30 s
// into a run. controller-runtime takes only the first logger it is given:
// this runs once a process, before any command's work.
func setLogging(level int) error {
	if level < 0 {
		return exitcode.Usagef("-v must not be negative, not %d", level)
	}
	if level == 0 {
		ctrllog.SetLogger(logr.Discard())
		return nil
	}
	var klogFlags flag.FlagSet
	klog.InitFlags(&klogFlags)
	if err := klogFlags.Set("v", strconv.Itoa(level)); err != nil {
		return exitcode.Usagef("-v %d: %v", level, err)
	}
	ctrllog.SetLogger(klog.Background())
	return nil
}
