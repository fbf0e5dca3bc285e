package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
)

// ciWait is a CI job as a person would write it: change the control plane's
// version and let KCP roll it by itself, block on `kubectl cp-rollout wait`,
// then, the moment it returns, check with kubectl that KCP is at the new
// version with every machine up to date, and keep what it read for the test.
const ciWait = `set -euo pipefail
cluster=demo
kcp=$(kubectl get cluster "$cluster" -o jsonpath='{.spec.controlPlaneRef.name}')
kubectl patch kubeadmcontrolplane "$kcp" --type merge -p "{\"spec\":{\"version\":\"$TO\"}}"
kubectl cp-rollout wait "$cluster" --for done --timeout 10m -o json > "$OUT/wait.json"
kubectl get kubeadmcontrolplane "$kcp" -o json > "$OUT/kcp.json"
kubectl get machines -l "cluster.x-k8s.io/control-plane,cluster.x-k8s.io/cluster-name=$cluster" -o json > "$OUT/machines.json"
got=$(kubectl get kubeadmcontrolplane "$kcp" -o jsonpath='{.status.version} {.status.upToDateReplicas}/{.status.replicas}')
if [ "$got" != "$TO 3/3" ]; then
  echo "after wait: KCP reports $got, want $TO 3/3" >&2
  exit 1
fi
`

// A CI script waits for KCP's own rollout of a new version with `wait --for
// done`: exit 0, and not before KCP reports every machine at the new
// version and up to date, with the machines that stood before all replaced
// and none left deleting.
func TestWaitForKCPsOwnRollout(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	before := mustMachines(t, e)

	dir := t.TempDir()
	script := exec.CommandContext(ctx, "bash", "-c", ciWait)
	script.Env = append(e.Command(t, ctx).Env, "TO="+to, "OUT="+dir)
	var output bytes.Buffer
	script.Stdout, script.Stderr = &output, &output
	began := time.Now()
	err := script.Run()
	took := time.Since(began)
	t.Logf("the CI script took %s:\n%s", took.Round(100*time.Millisecond), output.String())
	if err != nil {
		t.Fatalf("the CI script failed: %v", err)
	}

	var done map[string]any
	if err := json.Unmarshal(readFile(t, dir, "wait.json"), &done); err != nil {
		t.Fatalf("wait -o json: %v", err)
	}
	if done["cluster"] != "demo" || done["namespace"] != e.Sim.ClusterKey().Namespace || done["done"] != true || done["version"] != to {
		t.Errorf("wait -o json: %v", done)
	}
	if !strings.Contains(output.String(), "waiting: ") {
		t.Errorf("wait said nothing of what it waited for; it should have waited for KCP's rollout")
	}

	// What kubectl read the moment wait returned.
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := json.Unmarshal(readFile(t, dir, "kcp.json"), kcp); err != nil {
		t.Fatal(err)
	}
	if v := kcp.Status.Versions; kcp.Spec.Version != to || kcp.Status.ObservedGeneration != kcp.Generation || len(v) != 1 || v[0].Version != to || v[0].Replicas != 3 {
		t.Errorf("KCP when wait returned: spec.version %s, generation %d observed %d, status.versions %v; want all 3 at %s",
			kcp.Spec.Version, kcp.Generation, kcp.Status.ObservedGeneration, v, to)
	}
	machines := &clusterv1.MachineList{}
	if err := json.Unmarshal(readFile(t, dir, "machines.json"), machines); err != nil {
		t.Fatal(err)
	}
	if len(machines.Items) != 3 {
		t.Errorf("%d control-plane machines when wait returned, want 3", len(machines.Items))
	}
	for i := range machines.Items {
		m := &machines.Items[i]
		switch {
		case slices.Contains(before, m.Name):
			t.Errorf("machine %s stood before the rollout: KCP had not replaced it when wait returned", m.Name)
		case m.Spec.Version != to || !m.DeletionTimestamp.IsZero():
			t.Errorf("machine %s at %s, deleting %v, when wait returned", m.Name, m.Spec.Version, !m.DeletionTimestamp.IsZero())
		case !conditions.IsTrue(m, clusterv1.MachineUpToDateCondition) || !conditions.IsTrue(m, clusterv1.MachineReadyCondition):
			t.Errorf("machine %s when wait returned: UpToDate %v, Ready %v", m.Name,
				conditions.Get(m, clusterv1.MachineUpToDateCondition), conditions.Get(m, clusterv1.MachineReadyCondition))
		}
	}
	// wait promises KCP's view (every machine Ready, up to date, none
	// deleting); the MachineHealthCheck judges a new machine on its own
	// schedule, and may not have judged the last one yet.
	var why string
	deadline := time.Now().Add(time.Minute)
	for {
		ok, w, err := e.Sim.Ready(ctx)
		if err == nil && ok {
			break
		}
		why = fmt.Sprint(w, " ", err)
		if time.Now().After(deadline) {
			t.Errorf("the control plane a minute after wait: %s", why)
			break
		}
		time.Sleep(2 * time.Second)
	}
}

func readFile(t *testing.T, dir, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
