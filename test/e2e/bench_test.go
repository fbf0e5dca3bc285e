package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/sim"
	"github.com/cp-rollout/cp-rollout/pkg/sim/simtest"
)

// BenchmarkUpgradeThreeReplicas times the same 3-replica upgrade
// (v1.35.2 → v1.36.3, 2 s provisioning, 1 s deletion per machine) done by the
// tool and by the real KCP controller on fresh simulators, next to the sum of
// the simulated delays — the floor no rollout can beat. `make bench` runs it
// and writes the figures to the file named by CP_ROLLOUT_BENCH_OUT.
func BenchmarkUpgradeThreeReplicas(b *testing.B) {
	const provision, deletion = 2 * time.Second, time.Second
	opts := sim.Options{Replicas: 3, Version: from, ProvisionDelay: provision, DeleteDelay: deletion}
	var tool, kcp time.Duration
	for i := 0; i < b.N; i++ {
		tool += timeToolUpgrade(b, opts)
		kcp += timeKCPUpgrade(b, opts)
	}
	floor := 3 * (provision + deletion)
	toolS, kcpS := tool.Seconds()/float64(b.N), kcp.Seconds()/float64(b.N)
	b.ReportMetric(toolS, "tool-s/op")
	b.ReportMetric(kcpS, "kcp-s/op")
	b.ReportMetric(floor.Seconds(), "delays-s/op")
	if out := os.Getenv("CP_ROLLOUT_BENCH_OUT"); out != "" {
		raw, _ := json.MarshalIndent(map[string]any{
			"benchmark":   "upgrade 3 replicas v1.35.2 -> v1.36.3, surge 1",
			"date":        time.Now().UTC().Format(time.RFC3339),
			"toolSeconds": toolS, "kcpSeconds": kcpS, "simulatedDelaySeconds": floor.Seconds(),
			"runs": b.N,
		}, "", "  ")
		if err := os.WriteFile(out, append(raw, '\n'), 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

func timeToolUpgrade(b *testing.B, opts sim.Options) time.Duration {
	e := simtest.Start(b, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := e.Plugin(b, ctx, "upgrade", "demo", "--version", to)
	if r.Code != 0 {
		b.Fatalf("upgrade: exit %d\n%s", r.Code, r.Stderr)
	}
	return r.Took
}

// timeKCPUpgrade sets the version on the KubeadmControlPlane, as a user
// would without the tool, and times the real KCP controller until every
// machine runs it and the control plane is settled.
func timeKCPUpgrade(b *testing.B, opts sim.Options) time.Duration {
	s := simtest.Start(b, opts).Sim
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := s.ManagementClient().Get(ctx, s.KCPKey(), kcp); err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	patch := client.MergeFrom(kcp.DeepCopy())
	kcp.Spec.Version = to
	if err := s.ManagementClient().Patch(ctx, kcp, patch); err != nil {
		b.Fatal(err)
	}
	simtest.Eventually(b, 15*time.Minute, "KCP upgrading every machine to "+to, func(ctx context.Context) (bool, string, error) {
		machines, err := s.Machines(ctx)
		if err != nil {
			return false, "", err
		}
		for _, m := range machines {
			if m.Spec.Version != to {
				return false, "machine " + m.Name + " at " + m.Spec.Version, nil
			}
		}
		if len(machines) != 3 {
			return false, fmt.Sprintf("%d machines", len(machines)), nil
		}
		return s.Ready(ctx)
	})
	return time.Since(began)
}
