// Command kubectl-cp_rollout is the kubectl plugin binary: kubectl runs it for
// `kubectl cp-rollout …`. main alone turns errors into exit codes and exits.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	// Client auth plugins (exec, OIDC …) so any kubeconfig kubectl accepts works here.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/cp-rollout/cp-rollout/cmd/kubectl-cp_rollout/internal/initgc"
	"github.com/cp-rollout/cp-rollout/pkg/cli"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// The collector was off while the packages this one imports initialised;
// this package's init runs after all of theirs, in tests as well.
func init() { initgc.Restore() }

func main() {
	os.Exit(run())
}

func run() int {
	// The first SIGINT or SIGTERM cancels the context: commands stop at once in a
	// resumable state. A second signal falls through to the default and kills us.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Cluster API's code that the tool runs (KCP's failure-domain choice,
	// for one) logs through controller-runtime's logger. The tool reports
	// through its own reporter; left unset, controller-runtime prints a
	// warning with a stack trace on stderr 30 s into a run.
	ctrllog.SetLogger(logr.Discard())

	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	err := cli.Run(ctx, streams, os.Args[1:])
	if err == nil {
		return exitcode.OK
	}
	code := exitcode.Of(err)
	if ctx.Err() != nil {
		code = exitcode.Interrupted
	}
	if code == cli.PendingExitCode {
		return code // `plan --exit-code`: the plan on stdout says it all
	}
	fmt.Fprintf(os.Stderr, "error: %v\n", err)
	if code == exitcode.Usage {
		fmt.Fprintln(os.Stderr, "Run 'kubectl cp-rollout --help' for usage.")
	}
	return code
}
