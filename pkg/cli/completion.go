package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/blang/semver/v4"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/fleet"
	"github.com/cp-rollout/cp-rollout/rollout"
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
		Args:      oneShell,
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

// oneShell is completion's Args: one of completionShells, refused in the
// words of every verb's argument errors (wrongArgs).
func oneShell(cmd *cobra.Command, args []string) error {
	takes := "needs one argument, the shell: " + strings.Join(completionShells, ", ")
	switch {
	case len(args) != 1:
		return wrongArgs(cmd, takes, len(args))
	case !slices.Contains(completionShells, args[0]):
		return exitcode.Usagef("%s %s; got %q", cmd.Name(), takes, args[0])
	}
	return nil
}

// Validate has nothing left to check: oneShell has refused any other shell.
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
	return r.fromManagement(cmd, toComplete, func(ctx context.Context, c *connection, m *managementReads) ([]string, error) {
		ns, err := c.kubeconfigNamespace()
		if err != nil {
			return nil, err
		}
		clusters, _, err := fleet.Select(ctx, m.Lister, fleet.Scope{Namespace: ns})
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
	return r.fromManagement(cmd, toComplete, func(ctx context.Context, c *connection, m *managementReads) ([]string, error) {
		ns, err := c.kubeconfigNamespace()
		if err != nil {
			return nil, err
		}
		return fleet.ControlPlaneMachines(ctx, m.Lister, fleet.Cluster{Namespace: ns, Name: cluster})
	})
}

// completeNamespace offers the namespaces that hold a Cluster with a
// KubeadmControlPlane, from one list of Clusters in every namespace: the only
// namespaces -n is of use in, and a list that cp-rollout-view and
// cp-rollout-operate grant, where listing Namespaces needs a grant of its own.
func (r *RootOptions) completeNamespace(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return r.fromManagement(cmd, toComplete, func(ctx context.Context, _ *connection, m *managementReads) ([]string, error) {
		clusters, _, err := fleet.Select(ctx, m.Lister, fleet.Scope{})
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
func (r *RootOptions) fromManagement(cmd *cobra.Command, toComplete string, read func(context.Context, *connection, *managementReads) ([]string, error)) ([]cobra.Completion, cobra.ShellCompDirective) {
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
		m, err := newManagementReads(cfg)
		if err != nil {
			return nil, err
		}
		return read(ctx, c, m)
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

// completeFlagValues completes the values of the verbs' flags that take no
// file name, where a shell would otherwise offer the files of the current
// directory: enumerated values, the versions and templates of the named
// cluster, status's fields. The flags are declared by the verbs; this
// registers for each verb that has one, and leaves alone a flag that its
// verb completes itself.
func (r *RootOptions) completeFlagValues(root *cobra.Command) {
	for _, verb := range root.Commands() {
		register := func(name string, complete cobra.CompletionFunc) {
			if verb.Flags().Lookup(name) == nil {
				return
			}
			if _, done := verb.GetFlagCompletionFunc(name); done {
				return
			}
			_ = verb.RegisterFlagCompletionFunc(name, complete)
		}
		register("on-failure", fixedValues(
			onFailureStay+"\tleave the control plane paused with the run's record; re-run to resume",
			onFailureHandback+"\tgive the control plane back to KCP"))
		register("max-surge", fixedValues(
			"1\tcreate the replacement first",
			"0\tdelete first (no spare capacity; at least 3 replicas)",
			"-1\tthe KubeadmControlPlane's own rollout.strategy.rollingUpdate.maxSurge"))
		register("version", r.completeVersion)
		register("via", r.completeVia)
		register("infrastructure-template", r.completeInfrastructureTemplate)
		register("sort-by", completeSortBy)
		// A label selector: nothing to offer but no file names either.
		register("selector", cobra.NoFileCompletions)
	}
}

// fixedValues offers those of values (each "value\tdescription") that start
// with what is typed.
func fixedValues(values ...cobra.Completion) cobra.CompletionFunc {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		var offered []cobra.Completion
		for _, v := range values {
			if strings.HasPrefix(v, toComplete) {
				offered = append(offered, v)
			}
		}
		return offered, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeVersion offers, for --version, the versions worth proposing for
// the named cluster: its KubeadmControlPlane's own and, on a ClusterClass
// cluster, the versions its class declares (Cluster API's chained upgrades
// go through those alone). Nothing over -l/-A: there is no one cluster.
func (r *RootOptions) completeVersion(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) != 1 || selecting(cmd) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return r.fromManagement(cmd, toComplete, func(ctx context.Context, c *connection, m *managementReads) ([]string, error) {
		return m.versions(ctx, c, args[0])
	})
}

// completeVia offers the same versions for --via, which takes a list: after
// "v1.34.4," it offers the next one, keeping what is typed and leaving out
// what is already listed.
func (r *RootOptions) completeVia(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) != 1 || selecting(cmd) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	typed, last := "", toComplete
	if i := strings.LastIndex(toComplete, ","); i >= 0 {
		typed, last = toComplete[:i+1], toComplete[i+1:]
	}
	listed := strings.Split(typed, ",")
	offered, directive := r.fromManagement(cmd, last, func(ctx context.Context, c *connection, m *managementReads) ([]string, error) {
		versions, err := m.versions(ctx, c, args[0])
		return slices.DeleteFunc(versions, func(v string) bool { return slices.Contains(listed, v) }), err
	})
	for i := range offered {
		offered[i] = typed + offered[i]
	}
	return offered, directive
}

// completeInfrastructureTemplate offers, for --infrastructure-template, the
// InfraMachineTemplates the upgrade accepts: those of the kind the named
// cluster's KubeadmControlPlane is made from, in its namespace.
func (r *RootOptions) completeInfrastructureTemplate(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) != 1 || selecting(cmd) {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return r.fromManagement(cmd, toComplete, func(ctx context.Context, c *connection, m *managementReads) ([]string, error) {
		ns, err := c.kubeconfigNamespace()
		if err != nil {
			return nil, err
		}
		_, kcp, err := m.controlPlane(ctx, ns, args[0])
		if err != nil {
			return nil, err
		}
		return m.templates(ctx, ns, kcp.Spec.MachineTemplate.Spec.InfrastructureRef.APIGroup, kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Kind)
	})
}

// completeSortBy offers, for status's --sort-by, the fields of the rows it
// sorts, as their JSON names them: a machine's, or with -l/-A a cluster's.
// Read from the row types, so that a field added to them is offered too.
// Fields that hold an object or a list are left out: a row sorts by a value.
func completeSortBy(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	row := reflect.TypeFor[rollout.MachineStatus]()
	if selecting(cmd) {
		row = reflect.TypeFor[fleet.Row]()
	}
	var offered []cobra.Completion
	for _, field := range scalarJSONFields(row) {
		if strings.HasPrefix("."+field, toComplete) {
			offered = append(offered, "."+field)
		}
	}
	return offered, cobra.ShellCompDirectiveNoFileComp
}

// scalarJSONFields names the fields of struct type t that encoding/json
// writes as a string, number or boolean, embedded structs' fields inline.
func scalarJSONFields(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case !f.IsExported() || name == "-":
		case f.Anonymous && name == "" && ft.Kind() == reflect.Struct:
			names = append(names, scalarJSONFields(ft)...)
		case ft == reflect.TypeFor[time.Time]():
			names = append(names, cmp.Or(name, f.Name))
		case ft.Kind() == reflect.String || ft.Kind() == reflect.Bool || ft.Kind() >= reflect.Int && ft.Kind() <= reflect.Float64:
			names = append(names, cmp.Or(name, f.Name))
		}
	}
	return names
}

// managementReads is what completion reads from the management cluster:
// whole lists through fleet's Lister, and single objects and API discovery
// through a plain REST client, decoded into Cluster API's types. A shell is
// waiting: each completion makes the few requests it needs, no RESTMapper
// discovery of every group and no client cache.
type managementReads struct {
	*fleet.Lister
	rest rest.Interface
}

func newManagementReads(cfg *rest.Config) (*managementReads, error) {
	l, err := fleet.NewLister(cfg)
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.NegotiatedSerializer = serializer.WithoutConversionCodecFactory{CodecFactory: clientgoscheme.Codecs}
	rc, err := rest.UnversionedRESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return &managementReads{Lister: l, rest: rc}, nil
}

// get decodes the JSON the API server serves at path into v.
func (m *managementReads) get(ctx context.Context, path string, v any) error {
	body, err := m.rest.Get().AbsPath(path).DoRaw(ctx)
	if err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}

// controlPlane reads Cluster namespace/name and its KubeadmControlPlane.
func (m *managementReads) controlPlane(ctx context.Context, namespace, name string) (*clusterv1.Cluster, *controlplanev1.KubeadmControlPlane, error) {
	cluster := &clusterv1.Cluster{}
	if err := m.get(ctx, "/apis/"+clusterv1.GroupVersion.String()+"/namespaces/"+namespace+"/clusters/"+name, cluster); err != nil {
		return nil, nil, err
	}
	ref := cluster.Spec.ControlPlaneRef
	if ref.Kind != "KubeadmControlPlane" || ref.APIGroup != controlplanev1.GroupVersion.Group {
		return nil, nil, fmt.Errorf("cluster %s/%s has no KubeadmControlPlane", namespace, name)
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	err := m.get(ctx, "/apis/"+controlplanev1.GroupVersion.String()+"/namespaces/"+namespace+"/kubeadmcontrolplanes/"+ref.Name, kcp)
	return cluster, kcp, err
}

// versions are the versions worth proposing for cluster (in the context's
// namespace, or -n's), oldest first: its KubeadmControlPlane's and, with a
// topology, its ClusterClass's declared ones. A class that cannot be read
// leaves the KubeadmControlPlane's alone.
func (m *managementReads) versions(ctx context.Context, c *connection, name string) ([]string, error) {
	ns, err := c.kubeconfigNamespace()
	if err != nil {
		return nil, err
	}
	cluster, kcp, err := m.controlPlane(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	versions := []string{kcp.Spec.Version}
	if t := cluster.Spec.Topology; t.IsDefined() {
		classNS := cmp.Or(t.ClassRef.Namespace, ns)
		class := &clusterv1.ClusterClass{}
		if m.get(ctx, "/apis/"+clusterv1.GroupVersion.String()+"/namespaces/"+classNS+"/clusterclasses/"+t.ClassRef.Name, class) == nil {
			versions = append(versions, class.Spec.KubernetesVersions...)
		}
	}
	versions = slices.DeleteFunc(versions, func(v string) bool { return v == "" })
	slices.SortFunc(versions, func(a, b string) int {
		va, errA := semver.ParseTolerant(a)
		vb, errB := semver.ParseTolerant(b)
		if errA != nil || errB != nil {
			return strings.Compare(a, b)
		}
		return va.Compare(vb)
	})
	return slices.Compact(versions), nil
}

// templates names the objects of kind (of API group) in namespace: the
// group's preferred version and the kind's resource come from discovery of
// that one group.
func (m *managementReads) templates(ctx context.Context, namespace, group, kind string) ([]string, error) {
	var g metav1.APIGroup
	if err := m.get(ctx, "/apis/"+group, &g); err != nil {
		return nil, err
	}
	var resources metav1.APIResourceList
	if err := m.get(ctx, "/apis/"+g.PreferredVersion.GroupVersion, &resources); err != nil {
		return nil, err
	}
	i := slices.IndexFunc(resources.APIResources, func(r metav1.APIResource) bool {
		return r.Kind == kind && !strings.Contains(r.Name, "/")
	})
	if i < 0 {
		return nil, fmt.Errorf("%s serves no %s", g.PreferredVersion.GroupVersion, kind)
	}
	var list metav1.PartialObjectMetadataList
	if err := m.get(ctx, "/apis/"+g.PreferredVersion.GroupVersion+"/namespaces/"+namespace+"/"+resources.APIResources[i].Name, &list); err != nil {
		return nil, err
	}
	names := make([]string, len(list.Items))
	for i, item := range list.Items {
		names[i] = item.Name
	}
	slices.Sort(names)
	return names, nil
}
