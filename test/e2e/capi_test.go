package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// capiReleases are the Cluster API releases whose own controller binaries
// TestCAPIReleases runs the verbs against: the oldest and newest patch
// releases the tool is proven with (rollout.ProvenKCPMinors). The README's
// compatibility table lists the same (TestCompatibilityTableIsTheMatrix).
var capiReleases = []string{"v1.13.6", "v1.14.2"}

// capiScenarios are the rows of the compatibility table, in its order: what
// TestCAPIReleases runs on each release.
var capiScenarios = []string{
	"upgrade (--max-surge 1)",
	"scale 3→5→3",
	"replace",
	"upgrade --max-surge 0",
	"upgrade --infrastructure-template (a new image)",
	"pause, kubeadm config change, rollout",
	"restart",
	"ClusterClass upgrade --wait-workers",
}

// After each verb on a release's own controllers, that release's KCP, in
// charge again, reports every machine up to date by its own conditions and
// creates or deletes nothing for 30 s: the tool's machines are the ones this
// KCP would have made. `make test-capi`; the releases' binaries are built on
// first use (internal/sim BuildRelease) and cached.
func TestCAPIReleases(t *testing.T) {
	for _, release := range capiReleases {
		t.Run(release, func(t *testing.T) {
			t.Run("verbs", func(t *testing.T) { capiVerbs(t, release) })
			t.Run("clusterclass", func(t *testing.T) { capiClusterClass(t, release) })
		})
	}
}

func capiVerbs(t *testing.T, release string) {
	e := simtest.Start(t, sim.Options{CAPIVersion: release, Replicas: 3, FailureDomains: 3, Version: from,
		ProvisionDelay: time.Second, DeleteDelay: time.Second})
	e.AwaitKCP = true
	if got := e.Sim.CAPIVersion(); got != release {
		t.Fatalf("the simulator runs Cluster API %s, want %s", got, release)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	run := func(scenario string, peak, replicas int, version string, args ...string) {
		t.Helper()
		mon := watchInvariants(t, e, peak, 2)
		began := time.Now()
		r := e.Plugin(t, ctx, args...)
		mon.check(t)
		if r.Code != 0 {
			t.Fatalf("%s on Cluster API %s: exit %d\n%s", scenario, release, r.Code, simtest.Tail(r.Stderr, 20))
		}
		t.Logf("%s on Cluster API %s: %.1f s", scenario, release, time.Since(began).Seconds())
		assertConverged(t, e, replicas, version)
		assertKCPAgrees(t, e, replicas)
		assertKCPIdleFor(t, e, 30*time.Second)
	}
	run(capiScenarios[0], 4, 3, to, "upgrade", "demo", "--version", to)
	simtest.AssertOnePerDomain(t, e.Sim)
	run(capiScenarios[1]+" (up)", 5, 5, to, "scale", "demo", "--replicas", "5")
	run(capiScenarios[1]+" (down)", 5, 3, to, "scale", "demo", "--replicas", "3")
	machines, err := e.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run(capiScenarios[2], 4, 3, to, "replace", "demo", machines[0].Name)
	const patch = "v1.36.4"
	run(capiScenarios[3], 3, 3, patch, "upgrade", "demo", "--version", patch, "--max-surge", "0")

	const template = "demo-control-plane-image-2"
	if err := e.Sim.CreateInfraTemplate(ctx, template, "sim-image-2"); err != nil {
		t.Fatal(err)
	}
	// Each of these replaces every machine; a run that found nothing to do
	// would pass the checks above.
	replacesAll := func(scenario string, args ...string) {
		t.Helper()
		old := mustMachines(t, e)
		run(scenario, 4, 3, patch, args...)
		if now := mustMachines(t, e); slices.ContainsFunc(now, func(m string) bool { return slices.Contains(old, m) }) {
			t.Errorf("%s on Cluster API %s kept some of %v: now %v", scenario, release, old, now)
		}
	}
	replacesAll(capiScenarios[4], "upgrade", "demo", "--version", patch, "--infrastructure-template", template)
	if r := e.Plugin(t, ctx, "pause", "demo"); r.Code != 0 {
		t.Fatalf("pause on Cluster API %s: exit %d\n%s", release, r.Code, simtest.Tail(r.Stderr, 5))
	}
	setAPIServerArg(t, e, "audit-log-maxage", "30")
	replacesAll(capiScenarios[5], "rollout", "demo")
	replacesAll(capiScenarios[6], "restart", "demo")
}

func capiClusterClass(t *testing.T, release string) {
	e := simtest.Start(t, sim.Options{CAPIVersion: release, Replicas: 3, Workers: 2, Topology: true, Version: from,
		ClassVersions: []string{from, to}, ProvisionDelay: 500 * time.Millisecond, DeleteDelay: 500 * time.Millisecond})
	e.AwaitKCP = true
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	mon := watchInvariants(t, e, 4, 2)
	began := time.Now()
	r := e.Plugin(t, ctx, "upgrade", "demo", "--version", to, "--wait-workers")
	mon.check(t)
	if r.Code != 0 {
		t.Fatalf("%s on Cluster API %s: exit %d\n%s", capiScenarios[7], release, r.Code, simtest.Tail(r.Stderr, 20))
	}
	t.Logf("%s on Cluster API %s: %.1f s", capiScenarios[7], release, time.Since(began).Seconds())
	assertWorkersAt(t, ctx, e, 2, to)
	assertConverged(t, e, 3, to)
	assertKCPAgrees(t, e, 3)
	assertKCPIdleFor(t, e, 30*time.Second)
	assertTopologySettled(t, e)
}

// assertKCPAgrees checks KCP's own verdict on the machines: its
// MachinesUpToDate condition, and the UpToDate condition it sets on each.
func assertKCPAgrees(t *testing.T, e *env, replicas int) {
	t.Helper()
	simtest.Eventually(t, time.Minute, "KCP counts every machine up to date", func(ctx context.Context) (bool, string, error) {
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := e.Sim.ManagementClient().Get(ctx, e.Sim.KCPKey(), kcp); err != nil {
			return false, "", err
		}
		if c := conditions.Get(kcp, controlplanev1.KubeadmControlPlaneMachinesUpToDateCondition); c == nil || c.Status != metav1.ConditionTrue {
			return false, fmt.Sprintf("KCP MachinesUpToDate is %v", c), nil
		}
		machines, err := e.Sim.Machines(ctx)
		if err != nil {
			return false, "", err
		}
		if len(machines) != replicas {
			return false, fmt.Sprintf("%d machines, want %d", len(machines), replicas), nil
		}
		for i := range machines {
			if c := conditions.Get(&machines[i], clusterv1.MachineUpToDateCondition); c == nil || c.Status != metav1.ConditionTrue {
				return false, fmt.Sprintf("machine %s UpToDate is %v", machines[i].Name, c), nil
			}
		}
		return true, "", nil
	})
}

// TestCompatibilityTableIsTheMatrix keeps the README's compatibility table
// true: its columns are the releases TestCAPIReleases runs and its rows the
// scenarios it runs on each.
func TestCompatibilityTableIsTheMatrix(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "<!-- compatibility table: test/e2e/capi_test.go -->\n")
	if !ok {
		t.Fatal("README.md has no compatibility table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	rows := strings.Split(strings.TrimSpace(table), "\n")
	cells := func(row string) []string {
		var out []string
		for c := range strings.SplitSeq(strings.Trim(row, "|"), "|") {
			out = append(out, strings.Trim(strings.TrimSpace(c), "`"))
		}
		return out
	}
	header := cells(rows[0])
	var releases []string
	for _, h := range header[1:] {
		releases = append(releases, regexp.MustCompile(`v\d+\.\d+\.\d+`).FindString(h))
	}
	if !slices.Equal(releases, capiReleases) {
		t.Errorf("the table's releases are %v, the matrix runs %v", releases, capiReleases)
	}
	var scenarios []string
	for _, row := range rows[2:] {
		c := cells(row)
		scenarios = append(scenarios, c[0])
		for i, v := range c[1:] {
			if v != "converges, KCP idle" {
				t.Errorf("row %q, column %s says %q; the matrix proves \"converges, KCP idle\"", c[0], header[i+1], v)
			}
		}
	}
	if !slices.Equal(scenarios, capiScenarios) {
		t.Errorf("the table's scenarios are %q, the matrix runs %q", scenarios, capiScenarios)
	}
}
