// Command kubectl-cp_rollout is the kubectl plugin binary: kubectl runs it for
// `kubectl cp-rollout …`. main alone turns errors into exit codes and exits.
package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"
	// Client auth plugins (exec, OIDC …) so any kubeconfig kubectl accepts works here.
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	"github.com/cp-rollout/cp-rollout/pkg/cli"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

func main() {
	os.Exit(run())
}

func run() int {
	ctx, stop := stopOnSignal()
	defer stop()
	// The loggers (klog's verbosity, controller-runtime's) are set by the
	// command once it has parsed -v.
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	res, err := cli.Run(ctx, streams, os.Args[1:])
	if err == nil {
		return exitcode.OK
	}
	code := exitcode.Of(err)
	if cause := context.Cause(ctx); cause != nil {
		// Whatever the run's last error, a signal stopped it.
		code = exitcode.Of(cause)
	}
	if code == cli.PendingExitCode {
		return code // `plan --exit-code`: the plan on stdout says it all
	}
	if res.JSON {
		_ = progress.WriteFailure(os.Stdout, progress.Failure{Time: time.Now(), Cluster: res.Cluster, Namespace: res.Namespace,
			ExitCode: code, Class: exitcode.Class(code), Message: err.Error()})
	}
	fmt.Fprintf(os.Stderr, "error: %v\n", err)
	if code == exitcode.Usage {
		// The help of the command that refused: it lists that verb's flags.
		fmt.Fprintf(os.Stderr, "Run '%s --help' for usage.\n", cmp.Or(res.Command, "kubectl cp-rollout"))
	}
	return code
}

// stopOnSignal returns a context that the first SIGINT or SIGTERM cancels,
// with exitcode.Stopped as its cause: commands stop at once in a resumable
// state, and main exits 130 or 143 as the signal says (signal.NotifyContext
// would not say which). The first signal also restores the default, so a
// second one kills the process.
func stopOnSignal() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-signals:
			signal.Stop(signals)
			cancel(exitcode.Stopped(sig))
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(signals)
		close(done)
		cancel(nil)
	}
}
