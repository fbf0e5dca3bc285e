package readiness

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
)

// TestJudgeAlsoRolls: a machine KCP finds outdated for another reason than
// the version warns, with KCP's reason; one outdated only by its version
// does not, nor does a deleting machine. The results are KCP's own UpToDate,
// so the version message filtered out is the one KCP writes.
func TestJudgeAlsoRolls(t *testing.T) {
	now := metav1.NewTime(cpBase.Add(48 * time.Hour))
	kcp := func(version string, change func(*controlplanev1.KubeadmControlPlane)) *controlplanev1.KubeadmControlPlane {
		k := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp", Namespace: "default"}}
		k.Spec.Version = version
		if change != nil {
			change(k)
		}
		return k
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}}
	// judged runs KCP's UpToDate on the machines against k, as
	// NewControlPlane does, and the judgement on its results.
	judged := func(k *controlplanev1.KubeadmControlPlane, deleting []string, machines ...*clusterv1.Machine) Finding {
		t.Helper()
		outdated, gone := collections.New(), collections.New()
		results := map[string]kcpstate.UpToDateResult{}
		for _, m := range machines {
			// No InfraMachine or KubeadmConfig: KCP counts those as matching,
			// so the version, rollout.after and rollout.before decide.
			upToDate, res, err := kcpstate.UpToDate(t.Context(), nil, cluster, m, k, &now, nil, map[string]*bootstrapv1.KubeadmConfig{})
			if err != nil {
				t.Fatal(err)
			}
			results[m.Name] = *res
			if !upToDate {
				outdated.Insert(m)
			}
			for _, d := range deleting {
				if m.Name == d {
					m.DeletionTimestamp = ptr.To(now)
					gone.Insert(m)
				}
			}
		}
		return judgeAlsoRolls(k.Spec.Version, outdated, gone, results, "demo -n default")
	}
	expiring := func(name, node string) *clusterv1.Machine {
		m := cpm(name, node)
		m.Status.CertificatesExpiryDate = metav1.NewTime(now.Add(5 * 24 * time.Hour))
		return m
	}
	rolloutAfter := func(k *controlplanev1.KubeadmControlPlane) {
		k.Spec.Rollout.After = metav1.NewTime(now.Add(-time.Hour))
	}
	rolloutBefore := func(k *controlplanev1.KubeadmControlPlane) { k.Spec.Rollout.Before.CertificatesExpiryDays = 10 }

	for _, tc := range []struct {
		name       string
		f          Finding
		result     Result
		found, do  []string
		notInFound []string
	}{
		{name: "every machine up to date",
			f:      judged(kcp("v1.35.2", nil), nil, cpm("m1", "n1"), cpm("m22", "n2")),
			result: Pass, found: []string{"no machine outdated"}},
		{name: "outdated by its version alone: what the upgrade does anyway",
			f:      judged(kcp("v1.36.0", nil), nil, cpm("m1", "n1"), cpm("m22", "n2")),
			result: Pass, found: []string{"no machine outdated"}},
		{name: "spec.rollout.after passed: named with KCP's reason, the version's left out",
			f:      judged(kcp("v1.36.0", rolloutAfter), nil, cpm("m1", "n1"), cpm("m22", "n2")),
			result: Warn, found: []string{"2 machines", "m1: KubeadmControlPlane spec.rolloutAfter expired; m22: KubeadmControlPlane spec.rolloutAfter expired"},
			do: []string{"`kubectl cp-rollout rollout demo -n default`", "revert"}, notInFound: []string{"Version"}},
		{name: "certificates within rollout.before: only that machine",
			f:      judged(kcp("v1.35.2", rolloutBefore), nil, cpm("m1", "n1"), expiring("m22", "n2")),
			result: Warn, found: []string{"1 machines", "m22: Certificates will expire soon"}, notInFound: []string{"m1:"}},
		{name: "a deleting machine never counts",
			f:      judged(kcp("v1.35.2", rolloutAfter), []string{"m1"}, cpm("m1", "n1")),
			result: Pass, found: []string{"no machine outdated"}},
		{name: "a deleting machine is left out, the others named",
			f:      judged(kcp("v1.35.2", rolloutAfter), []string{"m1"}, cpm("m1", "n1"), cpm("m22", "n2")),
			result: Warn, found: []string{"1 machines", "m22: "}, notInFound: []string{"m1:"}},
		{name: "an outdated machine without KCP's result is said, not dropped",
			f: judgeAlsoRolls("v1.35.2", collections.FromMachines(cpm("m1", "n1")), collections.New(),
				map[string]kcpstate.UpToDateResult{}, "demo -n default"),
			result: Warn, found: []string{"m1: outdated, no reason recorded"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkFindingSays(t, tc.f, tc.result, tc.found, tc.do, tc.notInFound)
		})
	}
}

// TestAlsoRollsLeavesDeletingOut: the live check takes KCP's not-up-to-date
// machines from the snapshot and leaves out what the guard calls deleting.
func TestAlsoRollsLeavesDeletingOut(t *testing.T) {
	going, staying := cpm("m1", "n1"), cpm("m22", "n2")
	going.DeletionTimestamp = ptr.To(metav1.NewTime(cpBase))
	s := cpSnapshot([]*clusterv1.Machine{going, staying})
	s.CP.MachinesNotUpToDate = collections.FromMachines(going)
	if f := alsoRolls(t.Context(), &Cluster{Snapshot: s}); f.Result != Pass {
		t.Errorf("a deleting machine counted: %s: %s", f.Result, f.Found)
	}
	// The snapshot holds no UpToDate results (they are NewControlPlane's
	// own), so the staying machine is said without a reason.
	s.CP.MachinesNotUpToDate = collections.FromMachines(going, staying)
	f := alsoRolls(t.Context(), &Cluster{Snapshot: s})
	checkFindingSays(t, f, Warn, []string{"m22: outdated, no reason recorded"}, []string{"demo -n default"}, []string{"m1:"})
}
