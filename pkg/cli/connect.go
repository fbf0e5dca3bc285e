package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/blang/semver/v4"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"

	"github.com/cp-rollout/cp-rollout/deploy/rbac"
	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/access"
	"github.com/cp-rollout/cp-rollout/pkg/audit"
	"github.com/cp-rollout/cp-rollout/pkg/changes"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/requests"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// This file and prepare below are where the command line meets the rollout
// engine: every other file works with flags, options and printing only.

// managementConfig is how the management cluster is reached: the kubeconfig
// as kubectl's flags select it (kubeconfigFlags).
type managementConfig interface {
	ToRESTConfig() (*rest.Config, error)
	ToRawKubeConfigLoader() clientcmd.ClientConfig
}

// connection says which cluster's control plane a verb works on and how to
// reach it. Flags fill it; only connect reads the kubeconfig and dials.
type connection struct {
	// Management is kubectl's connection flags: the kubeconfig, context,
	// impersonation and so on.
	Management   managementConfig
	Cluster      string
	Namespace    string // empty: the kubeconfig context's namespace
	EtcdEndpoint string // direct etcd endpoint template; empty = port-forward
	KCPVersion   string // overrides detection of the KCP controller's version
}

// where names the one cluster the verb acts on, and its namespace once
// resolved (-n, or the kubeconfig's context when connected); empty over a
// selection.
func (c *connection) where(s *selection) (cluster, namespace string) {
	if s.fleet() {
		return "", ""
	}
	return c.Cluster, c.Namespace
}

func (c *connection) addEtcdEndpointFlag(f *pflag.FlagSet) {
	f.StringVar(&c.EtcdEndpoint, "etcd-endpoint", "", "Reach etcd members directly at this URL template, e.g. 'https://{{.NodeIP}}:2379' (default: port-forward through the workload API server)")
}

func (c *connection) addKCPVersionFlag(f *pflag.FlagSet) {
	f.StringVar(&c.KCPVersion, "kcp-version", "", "The KubeadmControlPlane controller's version, for custom installs where its Deployment cannot be found")
}

// validateEtcdEndpoint renders the template for a made-up node, so a broken
// template is bad usage before any cluster is read.
func (c *connection) validateEtcdEndpoint() error {
	if c.EtcdEndpoint == "" {
		return nil
	}
	_, err := directDialer(c.EtcdEndpoint)
	return err
}

// preflight asks the API server whether this identity has every permission
// of use.access's roles on this cluster, once the KubeadmControlPlane has said
// which infrastructure resources its machines are made of (kcp nil: not
// known, the roles' wildcard is asked). Missing permissions are a refusal
// naming each, or warnings for a verb that changes nothing. A verb that
// changes nothing is also asked whether it may read the workload cluster's
// Secrets, which cp-rollout-view does not grant: workload is false when it
// may not and the verb can do without (status); otherwise that is a refusal.
func (c *connection) preflight(ctx context.Context, mgmt client.Client, use engineUse, kcp *controlplanev1.KubeadmControlPlane) (workload bool, err error) {
	if use.access == nil {
		return true, nil
	}
	scope := access.Scope{Namespace: c.Namespace, Cluster: c.Cluster, WithoutControllerLookup: c.KCPVersion != ""}
	if kcp != nil {
		ref := kcp.Spec.MachineTemplate.Spec.InfrastructureRef
		scope.InfraMachines, scope.InfraMachineTemplates = access.InfraResources(ref.APIGroup, ref.Kind, func(gk schema.GroupKind) (string, error) {
			m, err := mgmt.RESTMapper().RESTMapping(gk)
			if err != nil {
				return "", err
			}
			return m.Resource.Resource, nil
		})
	}
	perms, err := access.Needs(*use.access, scope)
	if err != nil {
		return false, exitcode.Usagef("%v", err)
	}
	var secrets []access.Permission
	if use.warnings != nil {
		if secrets, err = access.WorkloadNeeds(scope); err != nil {
			return false, exitcode.Usagef("%v", err)
		}
	}
	// One question for both: the Secrets are in the namespace most of the
	// role's permissions are, whose rules the API server reviews at once.
	missing, err := access.Missing(ctx, mgmt, append(perms, secrets...))
	if err != nil {
		return false, err
	}
	unreadable := slices.DeleteFunc(slices.Clone(missing), func(p access.Permission) bool { return !slices.Contains(secrets, p) })
	missing = slices.DeleteFunc(missing, func(p access.Permission) bool { return slices.Contains(secrets, p) })
	identity := ""
	if len(missing) > 0 || len(unreadable) > 0 {
		identity = access.Identity(ctx, mgmt)
	}
	if len(missing) > 0 {
		operation := "this command"
		if use.loop {
			operation = "a rollout"
		}
		report := access.Describe(identity, operation, *use.access, scope, missing)
		if use.warnings == nil {
			return false, exitcode.Forbiddenf("%s", report)
		}
		for _, line := range strings.Split(report, "\n") {
			fmt.Fprintln(use.warnings, "warning: "+strings.TrimSpace(line))
		}
	}
	if len(unreadable) == 0 {
		return true, nil
	}
	return false, c.withoutWorkload(use, identity, scope, unreadable)
}

// withoutWorkload says that identity may not read the workload cluster's
// Secrets: a warning when the verb can show the management cluster's half
// (status), a refusal otherwise, as its steps depend on the workload side.
func (c *connection) withoutWorkload(use engineUse, identity string, scope access.Scope, unreadable []access.Permission) error {
	if identity == "" {
		identity = "this identity"
	}
	names := make([]string, len(unreadable))
	for i, p := range unreadable {
		names[i] = p.Name
	}
	secretsOf := fmt.Sprintf("Secrets %s in namespace %s", strings.Join(names, " and "), c.Namespace)
	grant := fmt.Sprintf("Role %s grants it; %s prints it", rbac.Operate.RoleName(c.Cluster), access.PrintRoles(scope))
	if use.managementOnly {
		fmt.Fprintf(use.warnings, "warning: showing the management cluster only: the workload cluster's nodes and etcd members need read access to %s, which %s lacks (%s)\n",
			secretsOf, identity, grant)
		return nil
	}
	return exitcode.Forbiddenf("%s may not read %s: this command decides its steps on the workload cluster's nodes and etcd health, which it reaches through them (%s)",
		identity, secretsOf, grant)
}

func directDialer(endpointTemplate string) (etcd.Dialer, error) {
	d, err := etcd.NewDirectDialer(endpointTemplate)
	if err != nil {
		return nil, exitcode.Usagef("--etcd-endpoint: %v", err)
	}
	return d, nil
}

// checkKCPVersionFlag refuses an override that is no version at all, as bad
// input, on every verb that takes it: the engine would otherwise refuse it as
// an unsafe controller (exit 3) asking for the very flag that was given.
func (c *connection) checkKCPVersionFlag() error {
	if c.KCPVersion == "" {
		return nil
	}
	if _, err := semver.ParseTolerant(c.KCPVersion); err != nil {
		last := rollout.ProvenKCPMinors[len(rollout.ProvenKCPMinors)-1]
		return exitcode.Usagef("--kcp-version %s is not a Cluster API version: want vMAJOR.MINOR.PATCH, for example v%d.%d.0", c.KCPVersion, last.Major, last.Minor)
	}
	return nil
}

// validateKCPVersion refuses an override naming an unsupported controller
// before any cluster is read; runChecks checks it again, first, so that plan
// says the run would refuse it.
func (c *connection) validateKCPVersion() error {
	if c.KCPVersion == "" {
		return nil
	}
	return rollout.CheckKCPVersion(c.KCPVersion)
}

// runChecks are the checks a run that changes the control plane makes once it
// has read it and before it locks or writes anything, the guards aside
// (Prepare applies those): an unproven --kcp-version, which the run's Validate
// refuses before any read; every permission of the operate roles (exit 6,
// each missing one named); then the KCP controller's version, as its
// Deployment says unless --kcp-version names it (exit 3 unless proven: the
// loop creates machines as that version of KCP would). connect refuses a run
// on them, and plan (and --dry-run) reports what they would refuse: one
// function, so that a plan cannot promise a run these checks would stop.
func (c *connection) runChecks(ctx context.Context, cp *controlplane.Client, kcp *controlplanev1.KubeadmControlPlane) error {
	if err := c.validateKCPVersion(); err != nil {
		return err
	}
	if _, err := c.preflight(ctx, cp.Kube(), loopUse(nil, rollout.DefaultTimeouts), kcp); err != nil {
		return err
	}
	if c.KCPVersion != "" {
		return nil // proven, above
	}
	version, err := cp.KCPControllerVersion(ctx)
	if err != nil {
		return err
	}
	return rollout.CheckKCPVersion(version)
}

// engineUse says what a verb will do with the engine. A verb that runs the
// rollout loop is refused on runChecks (the operate roles' permissions, the
// KCP controller's version) and has the watches started that the loop waits
// on; plan makes runChecks itself, to report rather than refuse, and status
// and handback need neither.
type engineUse struct {
	loop     bool
	reporter progress.Reporter
	timeouts rollout.Timeouts
	// access is the use of deploy/rbac whose roles' permissions the verb
	// needs, checked before anything is locked or changed; nil checks none.
	access *rbac.Use
	// warnings, when set, receives missing permissions as warnings, and the
	// verb goes on to show what it can; when nil they are a refusal.
	warnings io.Writer
	// managementOnly lets a verb go on without the workload cluster when this
	// identity may not read its Secrets: the engine then has no Workload and
	// no Etcd. Without it, a verb that changes nothing refuses.
	managementOnly bool
	// handback needs the workload cluster only to give back nodes an earlier
	// run left cordoned, and etcd not at all: a workload cluster it cannot
	// reach (its Secret refused or missing) is a warning, not a refusal, so
	// that handback works on the clusters that need it most.
	handback bool
}

// loopUse is for the verbs that run the rollout loop (upgrade, scale,
// replace, rollout, restart): every permission of the operate roles is
// checked first, a missing one a refusal (see runChecks).
func loopUse(reporter progress.Reporter, timeouts rollout.Timeouts) engineUse {
	return engineUse{loop: true, reporter: reporter, timeouts: timeouts, access: &rbac.Operate}
}

// noLoop is for reads that need no preflight of their own (status -A --etcd
// checks its permissions once for the fleet).
var noLoop = engineUse{timeouts: rollout.DefaultTimeouts}

// handbackUse is for handback, which needs no preflight: it takes the Lease
// and makes one write to the KubeadmControlPlane, and a refused write leaves
// nothing half-done. warnings receives why the workload cluster was not
// reached.
func handbackUse(reporter progress.Reporter, warnings io.Writer) engineUse {
	return engineUse{timeouts: rollout.DefaultTimeouts, reporter: reporter, warnings: warnings, handback: true}
}

// pauseUse is for pause, which, as handback, takes the Lease and makes one
// write to the KubeadmControlPlane; it needs neither the workload cluster
// nor etcd, so one that cannot be reached is only a warning.
func pauseUse(reporter progress.Reporter, warnings io.Writer) engineUse {
	return handbackUse(reporter, warnings)
}

// readOnly is for plan and every --dry-run, which change nothing: they warn
// of what they may not read on the management cluster, and refuse without
// the workload cluster, as their steps depend on its etcd's health. What the
// run would need beyond that, plan checks apart (runChecks), after connecting,
// as a prediction rather than its own refusal.
func readOnly(warnings io.Writer) engineUse {
	return engineUse{timeouts: rollout.DefaultTimeouts, access: &rbac.View, warnings: warnings}
}

// viewOnly is for status: readOnly, and without the cluster's Secrets it
// shows the management cluster's half.
func viewOnly(warnings io.Writer) engineUse {
	use := readOnly(warnings)
	use.managementOnly = true
	return use
}

// connected is what connect built for one cluster.
type connected struct {
	engine *rollout.Engine
	// cp is the engine's management client, for what only it answers (the
	// KCP controller's version, its identity, runChecks): the engine takes it
	// by its roles.
	cp *controlplane.Client
	// first is the control plane as connect read it, the verb's first look.
	first *kcpstate.ControlPlane
	// workload is the workload cluster's client, nil when the verb does not
	// reach it (the preflight said why): what check reads beyond the
	// engine's view.
	workload *workload.Client
	// close ends the etcd client, the watches and the audit trail, whichever
	// were started.
	close func()
}

// connect builds the rollout engine for one cluster: an uncached management
// client, the workload client from the cluster's kubeconfig Secret and an etcd
// client with credentials minted from the cluster's etcd CA, and for the
// rollout loop its audit trail and watches.
func (c *connection) connect(ctx context.Context, use engineUse) (*connected, error) {
	mc, err := c.connectManagement(ctx, use)
	if err != nil {
		return nil, err
	}
	engine := (&rollout.Engine{Reporter: use.reporter, Timeouts: use.timeouts, Requests: mc.counted.requests}).Plays(mc.cp)
	done := &connected{engine: engine, cp: mc.cp, first: mc.first, close: func() {}}
	if !mc.workload {
		// The preflight has said why; the Secrets are not even asked for, so
		// the audit log shows no refused read of them.
		return done, nil
	}
	wl, members, closeEtcd, err := c.connectWorkload(ctx, mc, use)
	switch {
	case err != nil:
		return nil, err
	case wl == nil: // handback goes on without a workload cluster it cannot reach
		return done, nil
	}
	engine.Workload, done.workload, done.close = wl, wl, closeEtcd
	if members != nil { // nil: external etcd, or handback, which needs none
		engine.Etcd = members
	}
	if !use.loop {
		return done, nil
	}
	trail, watches, closeLoop, err := c.startLoop(ctx, mc, wl)
	if err != nil {
		closeEtcd()
		return nil, err
	}
	engine.Reporter, engine.Audit = trail.Reporter(use.reporter), trail
	engine.Changes = watches
	engine.Cache = &rollout.Cache{ControlPlane: controlplane.New(watches.Client(), c.Namespace, c.Cluster), Workload: watches}
	done.close = func() { closeLoop(); closeEtcd() }
	return done, nil
}

// management is the management cluster as connect reached it.
type management struct {
	cfg   *rest.Config
	kube  client.Client
	cp    *controlplane.Client
	fence *controlplane.Fence
	// first is the control plane as read on connecting.
	first   *kcpstate.ControlPlane
	counted *roundTrips
	// workload is whether the verb goes on to the workload cluster: the
	// checks found it may read the cluster's Secrets.
	workload bool
}

// roundTrips count a run's requests to each side, for its summary.
type roundTrips struct{ management, workload, etcd requests.Counter }

func (r *roundTrips) requests() progress.Requests {
	return progress.Requests{Management: r.management.Load(), Workload: r.workload.Load(), Etcd: r.etcd.Load()}
}

// connectManagement reaches the management cluster, reads the control plane
// once, and makes the checks the verb's use asks for before anything else is
// reached: runChecks for the loop, the preflight otherwise. Nothing it
// builds needs closing.
func (c *connection) connectManagement(ctx context.Context, use engineUse) (*management, error) {
	cfg, err := c.restConfig()
	if err != nil {
		return nil, err
	}
	if c.Namespace == "" {
		if c.Namespace, err = c.kubeconfigNamespace(); err != nil {
			return nil, err
		}
	}
	// A snapshot is a dozen reads; client-go's default of 5 requests a second
	// would make every step wait on the client-side limiter.
	cfg.QPS, cfg.Burst = 50, 100
	m := &management{cfg: cfg, counted: &roundTrips{}}
	cfg.Wrap(m.counted.management.Wrap)
	// Outside the counter, so a write the fence stops is not counted.
	m.fence = &controlplane.Fence{Namespace: c.Namespace, Lease: runlock.LeaseName(c.Cluster)}
	cfg.Wrap(m.fence.Wrap)
	if m.kube, err = client.New(cfg, client.Options{Scheme: controlplane.Scheme()}); err != nil {
		return nil, fmt.Errorf("management cluster: %w", err)
	}
	m.cp = controlplane.New(m.kube, c.Namespace, c.Cluster)
	m.cp.Fence = m.fence
	if m.first, err = m.cp.Read(ctx); err != nil {
		err = c.firstContact(ctx, err)
		// A refused read is the first of the missing permissions: list them all.
		if apierrors.IsForbidden(err) {
			if _, perr := c.preflight(ctx, m.kube, use, nil); perr != nil {
				return nil, perr
			}
		}
		return nil, c.notThere(m.kube, cfg.Host, err)
	}
	// A run that passes its checks may read the workload cluster's Secrets,
	// which are among the operate roles' permissions.
	m.workload = true
	if use.loop {
		err = c.runChecks(ctx, m.cp, m.first.KCP)
	} else {
		m.workload, err = c.preflight(ctx, m.kube, use, m.first.KCP)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// connectWorkload reaches the workload cluster through its kubeconfig Secret
// and, with stacked etcd, its members with a client certificate minted from
// the cluster's etcd CA. members is nil with external etcd (the loop takes no
// etcd steps) and for handback, which needs no etcd and only warns of a
// workload cluster it cannot reach: then wl is nil too.
func (c *connection) connectWorkload(ctx context.Context, m *management, use engineUse) (wl *workload.Client, members *etcd.Client, closer func(), err error) {
	none := func() {}
	wl, err = workload.New(ctx, m.kube, c.Namespace, c.Cluster, m.counted.workload.Wrap, m.fence.Wrap)
	switch {
	case err != nil && use.handback:
		fmt.Fprintf(use.warnings, "warning: %v\n", err)
		return nil, nil, none, nil
	case err != nil:
		return nil, nil, nil, exitcode.New(exitcode.Unsafe, err)
	case use.handback:
		return wl, nil, none, nil
	}
	creds, err := etcd.LoadCredentials(ctx, m.kube, client.ObjectKeyFromObject(m.first.Cluster), m.first.KCP)
	switch {
	case errors.Is(err, etcd.ErrNotManaged):
		return wl, nil, none, nil
	case err != nil:
		return nil, nil, nil, exitcode.New(exitcode.Unsafe, err)
	}
	// The first handshake with a member needs the client certificate, and
	// an RSA key takes tens of milliseconds to generate: minting starts now,
	// beside the rest of the setup, and a handshake that comes first waits
	// for it.
	go func() { _, _ = creds.ClientCertificate() }()
	var dialer etcd.Dialer
	if c.EtcdEndpoint != "" {
		dialer, err = directDialer(c.EtcdEndpoint)
	} else {
		dialer, err = etcd.NewPortForwardDialer(wl.Config)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	ec, err := etcd.New(etcd.Config{Dialer: dialer, Credentials: creds, DialOptions: append(m.counted.etcd.DialOptions(), m.fence.DialOptions()...)})
	if err != nil {
		return nil, nil, nil, err
	}
	return wl, ec, func() { _ = ec.Close() }, nil
}

// startLoop starts what the rollout loop needs beside its live reads: the
// audit trail its steps are written to, and the watches its waits wake on,
// whose caches its reads between steps come from.
func (c *connection) startLoop(ctx context.Context, m *management, wl *workload.Client) (*audit.Trail, *changes.Watches, func(), error) {
	trail := audit.New(m.kube, m.first.KCP, record.Who())
	watchCtx, stop := context.WithCancel(ctx)
	closer := func() { stop(); trail.Close() }
	template, infraMachines, err := m.cp.InfraKinds(ctx, m.first)
	if err != nil {
		closer()
		return nil, nil, nil, err
	}
	scope := changes.Scope{Namespace: c.Namespace, Cluster: c.Cluster, KCP: m.first.KCP.Name,
		Template:      changes.Object{GVK: template, Name: m.first.KCP.Spec.MachineTemplate.Spec.InfrastructureRef.Name},
		InfraMachines: infraMachines}
	// The live client the caches fall back on shares cp's CRD metadata.
	// A watch is one long request, which the per-request bound would cut;
	// the watches end with watchCtx.
	watchCfg := rest.CopyConfig(m.cfg)
	watchCfg.Timeout = 0
	watches, err := changes.Watch(watchCtx, watchCfg, m.cp.Kube(), scope, wl.Watching)
	if err != nil {
		closer()
		return nil, nil, nil, err
	}
	return trail, watches, closer, nil
}

// notThere explains the verb's first read of the control plane failing
// because what the command line or the kubeconfig names is not there: no
// Cluster of that name in that namespace, or no Cluster API on the server
// the kubeconfig's context points at. Either is bad input (exit 2), with
// where to look: nothing was read, so nothing changed, and the fix is in the
// command line or the kubeconfig, not in the cluster. (The same Cluster gone
// later in a run stays exit 3: the run's controlplane reads say so.) Any
// other error is returned as it is.
func (c *connection) notThere(kube client.Client, server string, err error) error {
	var missing *controlplane.ClusterNotFoundError
	if !errors.As(err, &missing) && !meta.IsNoMatchError(err) {
		return err
	}
	// A server that answers 404 to discovery gives the Cluster's read a
	// NotFound too: only a server that serves Cluster API's Cluster can
	// have said that this one is missing. The mapper asks discovery again
	// only if its first answer had no Cluster API.
	cluster := clusterv1.GroupVersion.WithKind("Cluster")
	_, merr := kube.RESTMapper().RESTMapping(cluster.GroupKind(), cluster.Version)
	switch {
	case merr == nil && missing != nil:
		return exitcode.Usagef("cluster %s/%s not found (%s): name its namespace with -n NAMESPACE, or find it with -A (`kubectl cp-rollout status -A`) or `kubectl get clusters -A`",
			missing.Namespace, missing.Name, c.namespaceSource(missing.Namespace))
	case merr == nil:
		return err
	case meta.IsNoMatchError(merr):
		return exitcode.Usagef("%s serves no Cluster API (no kind Cluster in %s): the kubeconfig's context%s does not point at a Cluster API management cluster; choose one with --context or --kubeconfig",
			server, cluster.Group, c.contextName())
	}
	return exitcode.Usagef("%s does not answer as a Kubernetes API server (%v): the kubeconfig's context%s does not point at a Cluster API management cluster; choose one with --context or --kubeconfig",
		server, merr, c.contextName())
}

// namespaceSource says where namespace, the one a Cluster was looked for
// in, came from: -n, or the kubeconfig's context when -n was not given.
func (c *connection) namespaceSource(namespace string) string {
	if flags, ok := c.Management.(*kubeconfigFlags); ok && flags.Namespace() != "" {
		return namespace + " is from -n"
	}
	return namespace + " is the kubeconfig context's namespace"
}

// contextName is ` "NAME"`, the kubeconfig context in use, for a message;
// empty when there is none to name.
func (c *connection) contextName() string {
	if flags, ok := c.Management.(*kubeconfigFlags); ok && flags.overrides.CurrentContext != "" {
		return fmt.Sprintf(" %q", flags.overrides.CurrentContext)
	}
	loader := c.Management.ToRawKubeConfigLoader()
	if loader == nil {
		return ""
	}
	if raw, err := loader.RawConfig(); err == nil && raw.CurrentContext != "" {
		return fmt.Sprintf(" %q", raw.CurrentContext)
	}
	return ""
}

// kubeconfigClusterFlag explains a --cluster that names no cluster entry of
// the kubeconfig, nil for any other: kubectl's --cluster picks which of the
// kubeconfig's API servers to talk to, and is easily taken for the Cluster
// API cluster to act on, which is the CLUSTER argument. client-go's own
// words ("cluster "demo" does not exist") leave the two mixed up.
func (c *connection) kubeconfigClusterFlag() error {
	flags, ok := c.Management.(*kubeconfigFlags)
	if !ok || flags.overrides.Context.Cluster == "" {
		return nil
	}
	name := flags.overrides.Context.Cluster
	raw, err := flags.ToRawKubeConfigLoader().RawConfig()
	if err != nil {
		return nil // kubeconfigError says what is wrong with the kubeconfig
	}
	if _, ok := raw.Clusters[name]; ok || len(raw.Clusters) == 0 {
		return nil // none at all: kubeconfigError says where it looked
	}
	entries := make([]string, 0, len(raw.Clusters))
	for entry := range raw.Clusters {
		entries = append(entries, entry)
	}
	slices.Sort(entries)
	return exitcode.Usagef("--cluster %s: the kubeconfig has no cluster entry %q (it has: %s); --cluster chooses one of the kubeconfig's API servers, not the Cluster API cluster, which is the CLUSTER argument: leave --cluster out",
		name, name, strings.Join(entries, ", "))
}

// restConfig is the management cluster's connection as the flags select it.
// Having no kubeconfig at all (none in KUBECONFIG or ~/.kube/config, or a
// --kubeconfig file that does not exist) is exit 7, as an unreachable API
// server is: the environment lacks the way in, and a runbook retries or
// alerts on it alike. A kubeconfig that is there but names a missing
// context, or does not parse, is bad input (exit 2), as a bad flag is.
//
// Every request is bounded (managementRequestTimeout, unless
// --request-timeout says otherwise): what a run does on its way out after
// Ctrl-C (hand a rejected target back, delete a half-made machine, release
// the Lease) must not wait on an API server that stopped answering.
func (c *connection) restConfig() (*rest.Config, error) {
	cfg, err := c.Management.ToRESTConfig()
	if err != nil {
		if ferr := c.kubeconfigClusterFlag(); ferr != nil {
			return nil, ferr
		}
		return nil, c.kubeconfigError("management cluster", err)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = managementRequestTimeout
	}
	return cfg, nil
}

// managementRequestTimeout bounds one request to the management cluster: far
// above what an API server takes to answer one, as Cluster API's own
// clients are bounded (10 s for a workload cluster).
const managementRequestTimeout = 30 * time.Second

// kubeconfigNamespace is the namespace of the kubeconfig's context, for a
// verb given no -n.
func (c *connection) kubeconfigNamespace() (string, error) {
	ns, _, err := c.Management.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", c.kubeconfigError("namespace", err)
	}
	return ns, nil
}

// kubeconfigError marks an error of loading the kubeconfig (see restConfig).
// client-go's own words for a missing one send users to KUBERNETES_MASTER,
// which kubectl no longer reads: the reason says where the kubeconfig was
// looked for, what was found there, and how to give one.
func (c *connection) kubeconfigError(what string, err error) error {
	access := c.Management.ToRawKubeConfigLoader().ConfigAccess()
	if clientcmd.IsEmptyConfig(err) || access.IsExplicitFile() && errors.Is(err, fs.ErrNotExist) {
		return exitcode.Unreachablef("no kubeconfig: %s; point --kubeconfig or KUBECONFIG at a management cluster's kubeconfig (for example: export KUBECONFIG=~/.kube/config)",
			lookedFor(access))
	}
	return exitcode.Usagef("%s: %v", what, err)
}

// lookedFor says where the kubeconfig was looked for and why none was there:
// "KUBECONFIG names /x, which does not exist".
func lookedFor(access clientcmd.ConfigAccess) string {
	const env = clientcmd.RecommendedConfigPathEnvVar
	paths := access.GetLoadingPrecedence()
	switch {
	case access.IsExplicitFile():
		return "--kubeconfig " + access.GetExplicitFile() + " " + fileState(access.GetExplicitFile())
	case os.Getenv(env) == "":
		return env + " is not set and " + paths[0] + " " + fileState(paths[0]) // ~/.kube/config alone
	case len(paths) == 1:
		return env + " names " + paths[0] + ", which " + fileState(paths[0])
	}
	return env + " names " + strings.Join(paths, ", ") + ", none of which holds a cluster"
}

// fileState is why a kubeconfig file gave nothing: it is not there, or it
// is (a file with no cluster in it loads as empty too).
func fileState(path string) string {
	if _, err := os.Stat(path); err != nil {
		return "does not exist"
	}
	return "holds no cluster"
}

// firstContact marks the error of the first request a command makes to the
// management cluster as Unreachable (exit 7) when that request got no answer
// or was refused as unauthenticated: nothing has been read, so nothing has
// been changed. Later requests are never marked so: a connection lost in the
// middle of a run may leave a control plane mid-rollout, which is exit 1 (or
// 4 for a wait), as before. An error after the run's context ended is the
// stop's or --timeout's, and is left to them.
func (c *connection) firstContact(ctx context.Context, err error) error {
	// An error already marked keeps its code; one that only matches a
	// deadline (a dial or HTTP client timeout does) is no answer, not a
	// wait of the tool's that ran out.
	var coded *exitcode.Error
	if ctx.Err() != nil || errors.As(err, &coded) || !exitcode.IsUnreachable(err) {
		return err
	}
	server := "the management cluster"
	if cfg, cerr := c.Management.ToRESTConfig(); cerr == nil {
		server += " at " + cfg.Host
	}
	if apierrors.IsUnauthorized(err) {
		return exitcode.Unreachablef("%s did not accept the kubeconfig's credentials: %w", server, exitcode.Cause(err))
	}
	return exitcode.Unreachablef("cannot reach %s: %w", server, exitcode.Cause(err))
}
