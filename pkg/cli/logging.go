package cli

import (
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// bodyLevel is the first -v at which client-go logs the bodies of requests
// and responses (k8s.io/client-go rest/request.go logBody, at 8 and above:
// cut at 1 KiB at 8, at 10 KiB at 9, whole from 10; below it, its round
// trippers log URLs and timing at 6 and headers, credentials masked, at 7).
// The bodies include the Secrets the tool reads: the cluster's etcd CA with
// its key, and the workload cluster's admin kubeconfig.
const bodyLevel = 8

// addVerbosityFlag adds kubectl's -v/--v. kubectl hands a plugin the flags
// typed after its name as they were typed, so the plugin parses -v itself.
func addVerbosityFlag(f *pflag.FlagSet, level *int) {
	f.IntVarP(level, "v", "v", 0, "Log level, as kubectl's: 6 logs each request to an API server (method, URL, status, duration) on stderr, "+
		"7 also its headers (credentials masked); 8 and above also log bodies (1 KiB of each at 8, 10 KiB at 9, all from 10), "+
		"among them the Secrets this tool reads: the etcd CA key and the workload cluster's admin credentials")
}

// bodyWarning is what a run at level says on stderr before it starts, when
// its log will hold the bodies of the Secrets it reads; "" below bodyLevel.
func bodyWarning(level int) string {
	if level < bodyLevel {
		return ""
	}
	return fmt.Sprintf("warning: -v %d logs the body of each request and response, among them the Secrets this tool reads "+
		"(the etcd CA key, the workload cluster's admin credentials): keep this output private, or use -v %d or lower\n", level, bodyLevel-1)
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
//
// From bodyLevel on it warns on errOut first: the log will hold Secrets.
func setLogging(level int, errOut io.Writer) error {
	if level < 0 {
		return exitcode.Usagef("-v must not be negative, not %d", level)
	}
	if w := bodyWarning(level); w != "" {
		fmt.Fprint(errOut, w)
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
