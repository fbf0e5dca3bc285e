package cli

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
)

// CompletionOptions prints a shell completion script for the command tree.
type CompletionOptions struct {
	Shell string
	// Tree is the command tree the script completes.
	Tree    *cobra.Command
	Streams genericiooptions.IOStreams
}

// completionShells are the shells cobra writes scripts for.
var completionShells = []string{"bash", "zsh", "fish", "powershell"}

// NewCompletionOptions returns the completion verb's defaults.
func NewCompletionOptions(streams genericiooptions.IOStreams) *CompletionOptions {
	return &CompletionOptions{Streams: streams}
}

// NewCmdCompletion returns the completion verb. Completion of
// `kubectl cp-rollout <TAB>` itself goes through the kubectl_complete-cp_rollout
// helper shipped beside the binary, which kubectl 1.26+ looks for on PATH.
// runF, when set, replaces Run, so tests can see what the arguments resolve to.
func NewCmdCompletion(streams genericiooptions.IOStreams, runF func(*CompletionOptions) error) *cobra.Command {
	o := NewCompletionOptions(streams)
	return &cobra.Command{
		Use:   "completion bash|zsh|fish|powershell",
		Short: "Print a shell completion script for kubectl-cp_rollout",
		Long: `Print a shell completion script for the kubectl-cp_rollout binary.

For "kubectl cp-rollout <TAB>", put kubectl_complete-cp_rollout (shipped beside
the binary) on PATH instead; kubectl 1.26 and newer call it.

  source <(kubectl-cp_rollout completion bash)
  kubectl-cp_rollout completion powershell | Out-String | Invoke-Expression`,
		ValidArgs: completionShells,
		Args:      usageArgs(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
}

// Complete takes the shell and the tree the command belongs to.
func (o *CompletionOptions) Complete(cmd *cobra.Command, args []string) error {
	o.Shell, o.Tree = args[0], cmd.Root()
	return nil
}

// Validate has nothing left to check: cobra's argument check (OnlyValidArgs)
// has refused any other shell.
func (o *CompletionOptions) Validate() error { return nil }

// Run prints the script to stdout.
func (o *CompletionOptions) Run(context.Context) error {
	out := o.Streams.Out
	switch o.Shell {
	case "bash":
		return o.Tree.GenBashCompletionV2(out, true)
	case "zsh":
		return o.Tree.GenZshCompletion(out)
	case "fish":
		return o.Tree.GenFishCompletion(out, true)
	case "powershell":
		return o.Tree.GenPowerShellCompletionWithDesc(out)
	}
	return exitcode.Usagef("unsupported shell %q", o.Shell)
}

// What follows completes names as the verbs would read them: CLUSTER and
// replace's MACHINE from the management cluster, --context from the
// kubeconfig, -n from the namespaces that hold Clusters, -o from each verb's
// own list. cobra's hidden __complete verb calls these; a shell is waiting,
// so on any error, or past completionTimeout, they offer nothing and print
// nothing (cobra's one line on stderr, which every completion script
// discards, aside).

// completionTimeout bounds what a completion waits for the kubeconfig and
// the management cluster. A variable so that tests can shorten it.
var completionTimeout = 5 * time.Second

// completeOutput offers values, the values a verb's Validate accepts for -o.
// A value that takes a template after its "=" (status's jsonpath= …) is
// completed without the space a shell adds after a word, when it is all
// that is offered: the template follows.
func completeOutput(cmd *cobra.Command, values []string) {
	_ = cmd.RegisterFlagCompletionFunc("output", func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		directive := cobra.ShellCompDirectiveNoFileComp
		var offered []cobra.Completion
		templated := true
		for _, v := range values {
			if strings.HasPrefix(v, toComplete) {
				offered = append(offered, v)
				templated = templated && strings.HasSuffix(v, "=")
			}
		}
		if len(offered) > 0 && templated {
			directive |= cobra.ShellCompDirectiveNoSpace
		}
		return offered, directive
	})
}

// addNameCompletions completes the connection flags every verb shares.
func (r *RootOptions) addNameCompletions(cmd *cobra.Command) {
	_ = cmd.RegisterFlagCompletionFunc("context", r.completeContext)
	_ = cmd.RegisterFlagCompletionFunc("namespace", r.completeNamespace)
}

// completeCluster completes the CLUSTER argument: the Clusters of -n (or of
// the kubeconfig context's namespace) that have a KubeadmControlPlane, as
// fleet.Select finds them from the one list it makes. Nothing with -l or -A:
// the verbs take a CLUSTER name or those, not both, and a name is never
// namespace/name.
func (r *RootOptions) completeCluster(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 || selecting(cmd) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return r.fromManagement(cmd, toComplete, func(ctx context.Context, c *connection, l *fleet.Lister) ([]string, error) {
		ns, err := c.kubeconfigNamespace()
		if err != nil {
			return nil, err
		}
		clusters, _, err := fleet.Select(ctx, l, fleet.Scope{Namespace: ns})
		names := make([]string, len(clusters))
		for i, cl := range clusters {
			names[i] = cl.Name
		}
		return names, err
	})
}

// completeReplace completes replace's CLUSTER, then its MACHINE.
func (r *RootOptions) completeReplace(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) == 1 {
		return r.completeMachine(cmd, args[0], toComplete)
	}
	return r.completeCluster(cmd, args, toComplete)
}

// completePlanReplace completes plan's --replace MACHINE, once CLUSTER is given.
func (r *RootOptions) completePlanReplace(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) != 1 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return r.completeMachine(cmd, args[0], toComplete)
}

// completeMachine offers the control-plane Machines of cluster (in -n or
// the context's namespace), by the labels Cluster API gives them.
func (r *RootOptions) completeMachine(cmd *cobra.Command, cluster, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return r.fromManagement(cmd, toComplete, func(ctx context.Context, c *connection, l *fleet.Lister) ([]string, error) {
		ns, err := c.kubeconfigNamespace()
		if err != nil {
			return nil, err
		}
		return fleet.ControlPlaneMachines(ctx, l, fleet.Cluster{Namespace: ns, Name: cluster})
	})
}

// completeNamespace offers the namespaces that hold a Cluster with a
// KubeadmControlPlane, from one list of Clusters in every namespace: the only
// namespaces -n is of use in, and a list that cp-rollout-view and
// cp-rollout-operate grant, where listing Namespaces needs a grant of its own.
func (r *RootOptions) completeNamespace(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return r.fromManagement(cmd, toComplete, func(ctx context.Context, _ *connection, l *fleet.Lister) ([]string, error) {
		clusters, _, err := fleet.Select(ctx, l, fleet.Scope{})
		var names []string
		for _, cl := range clusters {
			names = append(names, cl.Namespace)
		}
		return slices.Compact(names), err // sorted by namespace already
	})
}

// completeContext offers the contexts of the kubeconfig the flags select.
func (r *RootOptions) completeContext(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return r.bounded(cmd, toComplete, func(context.Context) ([]string, error) {
		raw, err := r.ConfigFlags.ToRawKubeConfigLoader().RawConfig()
		names := make([]string, 0, len(raw.Contexts))
		for name := range raw.Contexts {
			names = append(names, name)
		}
		slices.Sort(names)
		return names, err
	})
}

// selecting reports whether -l or -A was given.
func selecting(cmd *cobra.Command) bool {
	return cmd.Flags().Changed("selector") || cmd.Flags().Changed("all-namespaces")
}

// fromManagement offers what read names on the management cluster, reached
// as the verb would reach it (connection.restConfig), with two changes for a
// shell that is waiting: an exec credential plugin may not ask at the
// terminal, and the API server's warnings are not printed.
func (r *RootOptions) fromManagement(cmd *cobra.Command, toComplete string, read func(context.Context, *connection, *fleet.Lister) ([]string, error)) ([]cobra.Completion, cobra.ShellCompDirective) {
	return r.bounded(cmd, toComplete, func(ctx context.Context) ([]string, error) {
		c := &connection{Management: r.ConfigFlags}
		cfg, err := c.restConfig()
		if err != nil {
			return nil, err
		}
		if cfg.ExecProvider != nil {
			cfg.ExecProvider.InteractiveMode = clientcmdapi.NeverExecInteractiveMode
		}
		cfg.WarningHandler = rest.NoWarnings{}
		l, err := fleet.NewLister(cfg)
		if err != nil {
			return nil, err
		}
		return read(ctx, c, l)
	})
}

// bounded runs list, once the config file and environment have set the flags
// the command line left unset (cobra runs no PersistentPreRunE for
// __complete, and the verb itself would see them), and offers the names it
// gives that start with toComplete. On any error, or past
// completionTimeout, it offers nothing: list runs apart, so that not even a
// credential plugin that ignores the context can hold the shell.
func (r *RootOptions) bounded(cmd *cobra.Command, toComplete string, list func(context.Context) ([]string, error)) ([]cobra.Completion, cobra.ShellCompDirective) {
	const none = cobra.ShellCompDirectiveNoFileComp
	if err := applyConfig(cmd, r.ConfigFile); err != nil {
		return nil, none
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	done := make(chan []string, 1)
	go func() {
		names, err := list(ctx)
		if err != nil {
			names = nil
		}
		done <- names
	}()
	var names []string
	select {
	case names = <-done:
	case <-ctx.Done():
	}
	var offered []cobra.Completion
	for _, name := range names {
		if strings.HasPrefix(name, toComplete) {
			offered = append(offered, name)
		}
	}
	return offered, none
}
