package cli

import (
	"bytes"
	"context"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// RBACOptions prints the roles of deploy/rbac, the very text the permission
// preflight checks, ready for `kubectl apply -f -`.
type RBACOptions struct {
	// Management only names the namespace (-n, or the kubeconfig context's);
	// no cluster is read.
	Management managementConfig
	Cluster    string
	// Role is "view" or "operate"; empty prints both.
	Role string
	// Users, Groups and ServiceAccounts (NAMESPACE:NAME), when given, are
	// bound to Role's two roles for Cluster, each by bindings of its own;
	// with the operate Role, each is confined to the clusters it is granted
	// (rbac.Confine).
	Users, Groups, ServiceAccounts []string
	Streams                        genericiooptions.IOStreams
}

// rbacUses are the values of --role.
var rbacUses = map[string]rbac.Use{"view": rbac.View, "operate": rbac.Operate}

// NewRBACOptions returns the rbac verb's defaults.
func NewRBACOptions(streams genericiooptions.IOStreams) *RBACOptions {
	return &RBACOptions{Streams: streams}
}

// NewCmdRBAC returns the rbac verb. runF, when set, replaces Run, so tests can
// see what the flags resolve to.
func NewCmdRBAC(root *RootOptions, runF func(*RBACOptions) error) *cobra.Command {
	o := NewRBACOptions(root.Streams)
	o.Management = root.ConfigFlags
	cmd := &cobra.Command{
		Use:   "rbac [CLUSTER] [--role view|operate] [--user U] [--group G] [--serviceaccount NAMESPACE:NAME]",
		Short: "Print the roles this tool needs on the management cluster, for kubectl apply",
		Long: `Print, as YAML for "kubectl apply -f -", the roles of deploy/rbac: the
ClusterRoles cp-rollout-view and cp-rollout-operate (what only a cluster-wide
grant can give: CRD reads, the KCP controller's Deployment by name, the lists
of status -A) and, for CLUSTER, its Roles cp-rollout-view-CLUSTER and
cp-rollout-operate-CLUSTER in its namespace (-n, or the kubeconfig context's),
which name its two Secrets and its Lease. These are the permissions the tool's
preflight checks, from the same text. Nothing is read from the cluster.

cp-rollout-view is enough for status; it reads no Secret, so status then shows
the management cluster's half. plan, --dry-run and every change need
cp-rollout-operate. With --role and --user, --group or --serviceaccount, the
bindings for CLUSTER are printed too: for each subject, a RoleBinding of its
Role and a ClusterRoleBinding of the ClusterRole, named after the use, the
cluster and the subject, so that applying them for another subject or
cluster adds bindings and replaces none.

RBAC cannot confine a create to a name, so cp-rollout-operate-CLUSTER alone
lets its holder write the Machines, KubeadmControlPlanes, Leases and the rest
of every cluster in the namespace. With --role operate, each subject's
ValidatingAdmissionPolicy comes first: the API server then refuses that
subject's writes to the objects of any cluster whose Role it is not bound to.
It is one policy per subject, the same for each of its clusters: to take one
cluster away, delete that cluster's RoleBinding, and keep the policy while the
subject holds any other. Without a subject none can be printed, and the
namespace is the unit of isolation; "kubectl auth whoami", run with the
subject's kubeconfig, shows the user name and groups the API server sees.`,
		Example: `  kubectl cp-rollout rbac | kubectl apply -f -
  kubectl cp-rollout rbac demo -n capi-prod | kubectl apply -f -
  kubectl cp-rollout rbac demo -n capi-prod --role view --group sre-oncall | kubectl apply -f -
  kubectl cp-rollout rbac demo -n capi-prod --role operate --serviceaccount ops:runbook | kubectl apply -f -`,
		Args:              atMostOneCluster,
		ValidArgsFunction: root.completeCluster,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Role, "role", "", "Print only the roles of this use: view or operate (default both)")
	f.StringSliceVar(&o.Users, "user", nil, "With CLUSTER and --role: bind the roles to this user (repeatable)")
	f.StringSliceVar(&o.Groups, "group", nil, "With CLUSTER and --role: bind the roles to this group (repeatable)")
	f.StringSliceVar(&o.ServiceAccounts, "serviceaccount", nil, "With CLUSTER and --role: bind the roles to this ServiceAccount, NAMESPACE:NAME (repeatable)")
	_ = cmd.RegisterFlagCompletionFunc("role", cobra.FixedCompletions([]string{"view", "operate"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Complete takes the cluster's name, if given.
func (o *RBACOptions) Complete(_ *cobra.Command, args []string) error {
	if len(args) == 1 {
		o.Cluster = args[0]
	}
	return nil
}

// Validate checks the flags; it reads nothing but the options.
func (o *RBACOptions) Validate() error {
	if _, ok := rbacUses[o.Role]; !ok && o.Role != "" {
		return oneOf("role", o.Role, "view", "operate")
	}
	if len(o.Users)+len(o.Groups)+len(o.ServiceAccounts) == 0 {
		return nil
	}
	if o.Cluster == "" || o.Role == "" {
		return exitcode.Usagef("--user, --group and --serviceaccount bind the roles of one cluster for one use: give CLUSTER and --role view or --role operate")
	}
	for _, sa := range o.ServiceAccounts {
		if ns, name, ok := strings.Cut(sa, ":"); !ok || ns == "" || name == "" {
			return exitcode.Usagef("--serviceaccount must be NAMESPACE:NAME, not %q", sa)
		}
	}
	for _, s := range o.subjects() {
		if s.Name == "" || !utf8.ValidString(s.Name) {
			return exitcode.Usagef("--%s %q: not a name the API server could authenticate", strings.ToLower(s.Kind), s.Name)
		}
	}
	return nil
}

// Run prints the roles, and the bindings asked for, to stdout.
func (o *RBACOptions) Run(context.Context) error {
	uses := rbac.Uses
	if o.Role != "" {
		uses = []rbac.Use{rbacUses[o.Role]}
	}
	var docs [][]byte
	for _, u := range uses {
		docs = append(docs, u.ClusterRoleYAML())
	}
	if o.Cluster != "" {
		namespace, _, err := o.Management.ToRawKubeConfigLoader().Namespace()
		switch {
		case clientcmd.IsEmptyConfig(err):
			// No kubeconfig at all (the roles printed on a laptop for an
			// administrator): kubectl's default namespace.
			namespace = metav1.NamespaceDefault
		case err != nil:
			return exitcode.Usagef("namespace: %v", err)
		}
		for _, u := range uses {
			role, err := u.RoleYAML(namespace, o.Cluster)
			if err != nil {
				return exitcode.Usagef("%v", err)
			}
			docs = append(docs, role)
		}
		bindings, err := o.bindings(uses, namespace)
		if err != nil {
			return err
		}
		docs = append(docs, bindings...)
	}
	// Each document opens with a separator, so the outputs of several runs
	// (one per cluster) concatenate into one stream for kubectl apply.
	var out bytes.Buffer
	for _, doc := range docs {
		out.WriteString("---\n")
		out.Write(doc)
	}
	_, err := out.WriteTo(o.Streams.Out)
	return err
}

// subjects are the identities the flags name, users, then groups, then
// ServiceAccounts, each in the order given.
func (o *RBACOptions) subjects() []rbacv1.Subject {
	var subjects []rbacv1.Subject
	for _, u := range o.Users {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: u})
	}
	for _, g := range o.Groups {
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: g})
	}
	for _, sa := range o.ServiceAccounts {
		ns, name, _ := strings.Cut(sa, ":")
		subjects = append(subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name})
	}
	return subjects
}

// bindings are, for each subject given, a RoleBinding of the cluster's Role
// and a ClusterRoleBinding of the ClusterRole, each named after its use,
// cluster and subject (rbac.Use.BindingName): binding another subject, or
// the same one to another cluster, adds bindings and replaces none.
//
// With the operate use, each subject's confinement comes first: the policy
// that keeps its writes to the clusters it is granted. Without it, the
// cluster's Role lets the subject write every cluster of the namespace
// (deploy/rbac/cp-rollout-confine.yaml); printed first, it is in force
// before the bindings are, as kubectl apply creates objects in order.
func (o *RBACOptions) bindings(uses []rbac.Use, namespace string) ([][]byte, error) {
	subjects := o.subjects()
	var out [][]byte
	add := func(obj any) error {
		raw, err := yaml.Marshal(obj)
		out = append(out, raw)
		return err
	}
	for _, u := range uses {
		if u.Name != rbac.Operate.Name {
			continue
		}
		for _, s := range subjects {
			confine, err := rbac.Confine(s)
			if err != nil {
				return nil, exitcode.Usagef("%v", err)
			}
			out = append(out, confine.PolicyYAML)
			if err := add(confine.Binding); err != nil {
				return nil, err
			}
		}
	}
	labels := map[string]string{"app.kubernetes.io/name": "cp-rollout"}
	for _, u := range uses {
		for _, s := range subjects {
			for _, binding := range []any{
				&rbacv1.RoleBinding{
					TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "RoleBinding"},
					ObjectMeta: metav1.ObjectMeta{Name: u.BindingName(namespace, o.Cluster, s, false), Namespace: namespace, Labels: labels},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: u.RoleName(o.Cluster)},
					Subjects:   []rbacv1.Subject{s},
				},
				&rbacv1.ClusterRoleBinding{
					TypeMeta:   metav1.TypeMeta{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRoleBinding"},
					ObjectMeta: metav1.ObjectMeta{Name: u.BindingName(namespace, o.Cluster, s, true), Labels: labels},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: u.Name},
					Subjects:   []rbacv1.Subject{s},
				},
			} {
				if err := add(binding); err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}
