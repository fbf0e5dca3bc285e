// Package readiness answers "will the cluster survive the new version?": the
// checks a managed Kubernetes service makes before it upgrades a control
// plane (removed APIs still in use, version skew, what blocks a drain,
// webhooks that fail closed, etcd's health, CoreDNS's migration, what else
// KCP will roll, certificates), made against one Cluster API cluster before
// a run takes it over. The rollout itself is safe by its guards (package
// rollout); these checks are about what lies outside it.
//
// Each check reads what it needs live and judges it with a pure function of
// what it read, so every judgement is tested without a cluster. A check that
// cannot read what it needs says so as a warning: it never passes unseen.
package readiness

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/blang/semver/v4"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/pkg/workload"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// Result is a check's verdict.
type Result string

const (
	// Pass: nothing found.
	Pass Result = "pass"
	// Warn: found something the operator should know; the run may go on.
	Warn Result = "warn"
	// Block: the upgrade would break something; upgrade refuses (exit 3)
	// unless the check is skipped by name (--skip-check).
	Block Result = "block"
)

// Finding is one check's verdict on one cluster: one row of `check`.
type Finding struct {
	Check  string `json:"check"`
	Result Result `json:"result"`
	// Found says what was found, or what was looked at when nothing was.
	Found string `json:"found"`
	// Do says what to do about it; empty on a pass.
	Do string `json:"do,omitempty"`
	// Skipped is set when the operator accepted a block or warning by
	// name (--skip-check): it is still reported, and blocks nothing.
	Skipped bool `json:"skipped,omitempty"`
	// Took is how long the check took, reads included.
	Took time.Duration `json:"tookNanoseconds"`
}

// Cluster is what the checks read: the control plane as the engine read it
// live, the target, and clients to read the rest.
type Cluster struct {
	// Snapshot is a live read of the control plane: the Cluster, its KCP and
	// machines (with KCP's up-to-date judgement of each), their nodes'
	// health, and the etcd members with their status and alarms.
	Snapshot *rollout.Snapshot
	// From is the KCP's spec.version, Target the version asked for.
	From, Target semver.Version
	// Management reads the management cluster (MachineDeployments,
	// MachinePools, MachineDrainRules, the cluster's certificate Secrets).
	Management client.Reader
	// Workload reads the workload cluster; its Config builds the clients
	// of API groups that Workload.Kube does not hold.
	Workload *workload.Client
	// CAPIVersion is the KCP controller's version (vX.Y.Z), "" when unknown.
	CAPIVersion string
	// RunLimit is how long the run may take at most: what a certificate
	// must outlive.
	RunLimit time.Duration
}

// Check is one named check.
type Check struct {
	Name string
	// What is a short line for --help and docs.
	What string
	run  func(ctx context.Context, c *Cluster) Finding
}

// Checks are every check, in the order `check` prints them.
var Checks = []Check{
	{Name: "removed-apis", What: "APIs the target version removes that clients still call, or that the cluster still serves", run: removedAPIs},
	{Name: "version-skew", What: "kubelets, kube-proxies and worker machines against the target by Kubernetes' skew policy; the target against Cluster API's supported versions", run: versionSkew},
	{Name: "drain-blockers", What: "what keeps a control-plane node from draining: PodDisruptionBudgets, bare pods, local storage, MachineDrainRules", run: drainBlockers},
	{Name: "fail-closed-webhooks", What: "webhooks with failurePolicy Fail whose service has no ready endpoint off the control-plane nodes", run: failClosedWebhooks},
	{Name: "etcd", What: "alarms, database size against the quota, learners, members no machine owns, member count against machines", run: etcdHealth},
	{Name: "coredns", What: "the Corefile migrates to the CoreDNS version KCP will set", run: coreDNS},
	{Name: "also-rolls", What: "machines KCP already finds outdated for another reason, with KCP's reason", run: alsoRolls},
	{Name: "certificates", What: "machine certificates and the cluster CA that expire before the run can finish", run: certificates},
}

// Names are the checks' names, for --skip-check.
func Names() []string {
	names := make([]string, len(Checks))
	for i, ch := range Checks {
		names[i] = ch.Name
	}
	return names
}

// ValidateSkip refuses a --skip-check name that is no check's.
func ValidateSkip(skip []string) error {
	for _, name := range skip {
		if !slices.Contains(Names(), name) {
			return fmt.Errorf("--skip-check %q is not a check; the checks are %s", name, strings.Join(Names(), ", "))
		}
	}
	return nil
}

// Run makes every check on c, in order, and marks those named in skip.
func Run(ctx context.Context, c *Cluster, skip []string) []Finding {
	findings := make([]Finding, 0, len(Checks))
	for _, ch := range Checks {
		start := time.Now()
		f := ch.run(ctx, c)
		f.Check, f.Took = ch.Name, time.Since(start)
		f.Skipped = f.Result != Pass && slices.Contains(skip, ch.Name)
		findings = append(findings, f)
	}
	return findings
}

// Blockers are the findings that block and are not skipped.
func Blockers(findings []Finding) []Finding {
	var out []Finding
	for _, f := range findings {
		if f.Result == Block && !f.Skipped {
			out = append(out, f)
		}
	}
	return out
}

// notChecked is the finding of a check that could not read what it needs:
// a warning, never a pass, naming what failed.
func notChecked(what string, err error) Finding {
	return Finding{Result: Warn, Found: fmt.Sprintf("not checked: %s: %v", what, err), Do: "fix the read and run `kubectl cp-rollout check` again"}
}
