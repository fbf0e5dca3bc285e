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
	"github.com/cp-rollout/cp-rollout/rollout"
)

// This file is what the tool asks a person at the terminal, all through one
// question ([y/N], ask): the confirmation that a command acting on more
// clusters than one person would name asks for (-A without -l on a verb that
// changes clusters, and a handback of more than one cluster), which --yes
// gives on the command line and a script is refused without; and
// --interactive's question between two machines of a run (betweenMachines).

// confirmation is --yes, and whether a person could be asked instead.
type confirmation struct {
	Yes bool
	// CanAsk is true when stdin and stderr are both terminals: someone can
	// read the question and answer. Decided once, when the options are made.
	CanAsk bool
}

func newConfirmation(streams genericiooptions.IOStreams) confirmation {
	return confirmation{CanAsk: canAsk(streams)}
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
	if s.everyCluster() && !c.Yes && !c.CanAsk {
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
	if !c.CanAsk {
		return exitcode.Usagef("%s would act on %d clusters (%s): pass --yes to confirm; nothing was changed", what, len(clusters), clusterList(clusters))
	}
	fmt.Fprintf(streams.ErrOut, "%s would act on these %d clusters:\n", what, len(clusters))
	for _, cl := range clusters {
		fmt.Fprintf(streams.ErrOut, "  %s\n", cl)
	}
	yes, err := ask(ctx, streams, "Proceed?")
	if err != nil || yes {
		return err
	}
	return exitcode.Usagef("%s not confirmed; nothing was changed", what)
}

// ask puts question, followed by [y/N], on stderr and reports whether the
// person answered y or yes; anything else, the end of input included, is no.
// ctx ends the question as it ends a run: its error is then ctx's.
func ask(ctx context.Context, streams genericiooptions.IOStreams, question string) (bool, error) {
	fmt.Fprint(streams.ErrOut, question+" [y/N] ")
	answer, err := readAnswer(ctx, streams.In)
	if err != nil {
		fmt.Fprintln(streams.ErrOut) // the next line does not start after the question
		return false, err
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}

// validateInteractive refuses, before any cluster is read, an --interactive
// run nobody could answer: many clusters at once (whose runs go on side by
// side, each at its own boundary), events for a program (-o json), or no
// terminal to ask on. The command line's conflicts come first: they hold
// wherever the command runs.
func (c *confirmation) validateInteractive(fleet bool, output string) error {
	switch {
	case fleet:
		return exitcode.Usagef("--interactive asks between the machines of one cluster's run and cannot go with -l/-A (many clusters at once): name one cluster; nothing was changed")
	case output == "json":
		return exitcode.Usagef("--interactive cannot go with -o json: the events are for a program, the question for a person; nothing was changed")
	case !c.CanAsk:
		return exitcode.Usagef("--interactive needs a terminal on stdin and stderr to ask between machines, and a script cannot answer: run it from a terminal, or without --interactive; nothing was changed")
	}
	return nil
}

// betweenMachines is --interactive's question, as the engine's
// BetweenMachines: asked when a machine step is done and nothing is in
// flight, before the next begins. y goes on; any other answer stops the run
// as Ctrl-C does (exit 130, its pause and record left for a re-run, no
// failure recorded: the operator chose it), saying how to go on. hold
// releases the terminal from the progress (a spinner) before the question.
func betweenMachines(streams genericiooptions.IOStreams, hold func(), cluster, namespace string) func(context.Context, rollout.Boundary) error {
	return func(ctx context.Context, b rollout.Boundary) error {
		hold()
		yes, err := ask(ctx, streams, fmt.Sprintf("%s; continue with %d/%d?", b, b.Next(), b.Total))
		if err != nil || yes {
			return err
		}
		return exitcode.New(exitcode.Interrupted, fmt.Errorf("stopped before machine %d/%d, as answered at --interactive's question (%s); nothing is in flight: "+
			"re-run the same command to go on, or `kubectl cp-rollout handback %s -n %s` to give the control plane back to KCP", b.Next(), b.Total, b, cluster, namespace))
	}
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
