package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
)

// This file is the confirmation that a command acting on more clusters than
// one person would name asks for: -A without -l on a verb that changes
// clusters, and a handback of more than one cluster. --yes gives it on the
// command line; otherwise a person at a terminal is shown the clusters and
// asked, and a script is refused before anything changes.

// confirmation is --yes, and whether a person could be asked instead.
type confirmation struct {
	Yes bool
	// Interactive is true when stdin and stderr are both terminals: someone
	// can read the list and answer. Decided once, when the options are made.
	Interactive bool
}

func newConfirmation(streams genericiooptions.IOStreams) confirmation {
	return confirmation{Interactive: canAsk(streams)}
}

// canAsk reports whether stdin and stderr are both terminals. The question
// goes to stderr, so that stdout stays data (-o json) even when piped.
func canAsk(streams genericiooptions.IOStreams) bool {
	in, ok := streams.In.(*os.File)
	return ok && term.IsTerminal(int(in.Fd())) && progress.IsTerminal(streams.ErrOut)
}

func (c *confirmation) addYesFlag(f *pflag.FlagSet) {
	f.BoolVar(&c.Yes, "yes", false, "Go ahead without asking where a confirmation is needed (-A without -l; a handback of more than one cluster); without it, only a terminal can confirm")
}

// everyCluster is -A without -l: every Cluster of the management cluster.
func (s *selection) everyCluster() bool { return s.AllNamespaces && s.Selector == "" }

// validateEveryCluster refuses, before any cluster is read, a change of every
// cluster that nobody confirmed and nobody can be asked to.
func (c *confirmation) validateEveryCluster(verb string, s *selection) error {
	if s.everyCluster() && !c.Yes && !c.Interactive {
		return exitcode.Usagef("%s -A without -l acts on every cluster in every namespace: pass --yes to confirm, or select clusters with -l; nothing was changed", verb)
	}
	return nil
}

// confirm lets what (e.g. "upgrade to v1.36.3") go ahead on clusters when
// --yes was given or a person at the terminal says so; otherwise it is
// refused, with nothing changed. ctx ends the question as it ends a run.
func (c *confirmation) confirm(ctx context.Context, streams genericiooptions.IOStreams, what string, clusters []fleet.Cluster) error {
	if c.Yes {
		return nil
	}
	if !c.Interactive {
		return exitcode.Usagef("%s would act on %d clusters (%s): pass --yes to confirm; nothing was changed", what, len(clusters), clusterList(clusters))
	}
	fmt.Fprintf(streams.ErrOut, "%s would act on these %d clusters:\n", what, len(clusters))
	for _, cl := range clusters {
		fmt.Fprintf(streams.ErrOut, "  %s\n", cl)
	}
	fmt.Fprint(streams.ErrOut, "Proceed? [y/N] ")
	answer, err := readAnswer(ctx, streams.In)
	if err != nil {
		fmt.Fprintln(streams.ErrOut)
		return err
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return exitcode.Usagef("%s not confirmed; nothing was changed", what)
}

// readAnswer reads one line; the end of input is "no". A read of a terminal
// cannot be cancelled, so it waits apart and an interrupt does not wait for
// it.
func readAnswer(ctx context.Context, in io.Reader) (string, error) {
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(in).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		return s, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func clusterList(clusters []fleet.Cluster) string {
	names := make([]string, len(clusters))
	for i, cl := range clusters {
		names[i] = cl.String()
	}
	return strings.Join(names, ", ")
}
