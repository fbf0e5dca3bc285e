package readiness

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// cpBase is the test clock's start.
var cpBase = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

// cpm is a control-plane machine, its node named differently from it (as
// the simulator does) so that code mixing the two up fails.
func cpm(name, node string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
		CreationTimestamp: metav1.NewTime(cpBase.Add(time.Duration(len(name)) * time.Minute))}}
	m.Spec.Version = "v1.35.2"
	m.Status.NodeRef.Name = node
	return m
}

// cpSnapshot is a stacked-etcd control plane of the machines with the
// members, for cluster default/demo.
func cpSnapshot(machines []*clusterv1.Machine, members ...etcd.Member) *rollout.Snapshot {
	return &rollout.Snapshot{
		Now:         cpBase.Add(time.Hour),
		EtcdManaged: true,
		Members:     members,
		CP: &kcpstate.ControlPlane{
			Cluster:  &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}},
			KCP:      &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "demo-cp", Namespace: "default"}, Spec: controlplanev1.KubeadmControlPlaneSpec{Version: "v1.35.2"}},
			Machines: collections.FromMachines(machines...),
		},
	}
}

const etcdMiB = int64(1 << 20)

// healthyMember is the started, voting, healthy member of node.
func healthyMember(node string, id uint64) etcd.Member {
	return etcd.Member{ID: id, Name: node, Node: node, Healthy: true, DBSize: 12 * etcdMiB, DBSizeInUse: 10 * etcdMiB}
}

// TestJudgeEtcd: alarms, learners, members no machine owns and unhealthy
// members block; the largest database warns above 80 % of the quota and
// blocks above 95 % (strictly: 80 % itself passes); the quota is etcd's 2 GiB
// default unless the KubeadmControlPlane's etcd.local.extraArgs sets
// quota-backend-bytes; member and machine counts that differ warn.
func TestJudgeEtcd(t *testing.T) {
	three := []*clusterv1.Machine{cpm("m1", "n1"), cpm("m22", "n2"), cpm("m333", "n3")}
	members := func(change func(ms []etcd.Member) []etcd.Member) []etcd.Member {
		ms := []etcd.Member{healthyMember("n1", 0x11), healthyMember("n2", 0x22), healthyMember("n3", 0x33)}
		if change != nil {
			ms = change(ms)
		}
		return ms
	}
	withQuota := func(s *rollout.Snapshot, values ...string) *rollout.Snapshot {
		for _, v := range values {
			s.CP.KCP.Spec.KubeadmConfigSpec.ClusterConfiguration.Etcd.Local.ExtraArgs = append(
				s.CP.KCP.Spec.KubeadmConfigSpec.ClusterConfiguration.Etcd.Local.ExtraArgs, bootstrapv1.Arg{Name: "quota-backend-bytes", Value: ptr.To(v)})
		}
		return s
	}
	sized := func(size int64) []etcd.Member {
		// n2's is the largest: the one judged.
		return members(func(ms []etcd.Member) []etcd.Member {
			for i := range ms {
				ms[i].DBSize = size / 2
			}
			ms[1].DBSize = size
			return ms
		})
	}
	for _, tc := range []struct {
		name       string
		s          *rollout.Snapshot
		result     Result
		found, do  []string
		notInFound []string
	}{
		{name: "external etcd is not judged",
			s:      func() *rollout.Snapshot { s := cpSnapshot(three); s.EtcdManaged = false; return s }(),
			result: Pass, found: []string{"etcd is external, not judged"}},
		{name: "healthy",
			s:      cpSnapshot(three, members(nil)...),
			result: Pass, found: []string{"3 members, healthy, no alarms, largest db 12 MiB of 2 GiB quota"}},
		{name: "no member read is not a pass",
			s:      cpSnapshot(three),
			result: Warn, found: []string{"not checked: etcd members"}},
		{name: "NOSPACE blocks, with defrag and disarm",
			s: cpSnapshot(three, members(func(ms []etcd.Member) []etcd.Member {
				ms[1].Alarms, ms[1].Healthy = []string{"NOSPACE"}, false
				return ms
			})...),
			result: Block, found: []string{"member n2 [22] has alarm NOSPACE"},
			do:         []string{"`etcdctl alarm list`", "`etcdctl defrag`", "`etcdctl alarm disarm`", "exec etcd-n1 -- etcdctl --cacert"},
			notInFound: []string{"unhealthy"}},
		{name: "CORRUPT blocks: never disarm, replace its machine",
			s: cpSnapshot(three, members(func(ms []etcd.Member) []etcd.Member {
				ms[2].Alarms, ms[2].Healthy = []string{"CORRUPT"}, false
				return ms
			})...),
			result: Block, found: []string{"member n3 [33] has alarm CORRUPT"},
			do: []string{"do not disarm", "endpoint hashkv --cluster", "`kubectl cp-rollout replace demo m333 -n default`"}},
		{name: "a machine's learner blocks",
			s:      cpSnapshot(three, members(func(ms []etcd.Member) []etcd.Member { ms[2].Learner = true; return ms })...),
			result: Block, found: []string{"member n3 [33] is a learner, not yet promoted (machine m333 is joining)"},
			do: []string{"`kubectl cp-rollout status demo -n default`", "`kubectl cp-rollout replace demo m333 -n default`"}},
		{name: "a member named after no machine's node warns, named: the run removes it first",
			s: cpSnapshot(three, members(func(ms []etcd.Member) []etcd.Member {
				// Listed, but no node carries its name to reach it on.
				gone := healthyMember("gone-node", 0x44)
				gone.Node, gone.Healthy, gone.Errors = "", false, []string{"no control-plane node named gone-node to reach it on"}
				return append(ms, gone)
			})...),
			result: Warn, found: []string{"member gone-node [44] has no control-plane machine (named after no machine's node)"},
			do:         []string{"removes it as its first step", "remove-stale-member", "`etcdctl member remove 44`", "exec etcd-n1 -- etcdctl"},
			notInFound: []string{"etcd members for"}}, // its own block says it; no second count warning
		{name: "an unnamed learner no machine waits for is reported once, as nobody's",
			s: cpSnapshot(three, members(func(ms []etcd.Member) []etcd.Member {
				return append(ms, etcd.Member{ID: 0x55, Learner: true})
			})...),
			result: Warn, found: []string{"member (not started) [55] has no control-plane machine (a learner that never started"},
			notInFound: []string{"is a learner, not yet promoted"}},
		{name: "an unhealthy member warns, naming its machine: the run's guards refuse it or replace it first",
			s: cpSnapshot(three, members(func(ms []etcd.Member) []etcd.Member {
				ms[0].Healthy, ms[0].Errors = false, []string{"context deadline exceeded"}
				return ms
			})...),
			result: Warn, found: []string{"member n1 [11] is unhealthy: context deadline exceeded"},
			do: []string{"`kubectl cp-rollout replace demo m1 -n default`"}},
		{name: "an alarm is named once, not as each neighbour's error",
			s: cpSnapshot(three, members(func(ms []etcd.Member) []etcd.Member {
				ms[0].Healthy, ms[0].Alarms = false, []string{"NOSPACE"}
				for i := 1; i < 3; i++ { // etcd 3.6 lists the cluster's alarms in every member's status errors
					ms[i].Healthy, ms[i].Errors = false, []string{"memberID:17 alarm:NOSPACE "}
				}
				return ms
			})...),
			result: Block, found: []string{"NOSPACE"}, notInFound: []string{"is unhealthy"}},
		{name: "a machine without a member warns on the count",
			s:      cpSnapshot(three, members(func(ms []etcd.Member) []etcd.Member { return ms[:2] })...),
			result: Warn, found: []string{"2 etcd members for 3 control-plane machines; without a member: m333"}},

		// The quota's boundaries, with a quota of 1000 bytes to make them exact.
		{name: "at 80 % exactly passes",
			s:      withQuota(cpSnapshot(three, sized(800)...), "1000"),
			result: Pass, found: []string{"largest db 800 B of 1000 B quota (quota-backend-bytes)"}},
		{name: "above 80 % warns",
			s:      withQuota(cpSnapshot(three, sized(801)...), "1000"),
			result: Warn, found: []string{"member n2 [22]: db 801 B is 80.1 % of the 1000 B quota"}, do: []string{"defrag", "quota-backend-bytes"}},
		{name: "at 95 % exactly still warns",
			s:      withQuota(cpSnapshot(three, sized(950)...), "1000"),
			result: Warn, found: []string{"is 95 % of"}},
		{name: "above 95 % blocks",
			s:      withQuota(cpSnapshot(three, sized(951)...), "1000"),
			result: Block, found: []string{"is 95.1 % of"}},
		{name: "etcd's default quota: 1.7 GiB of 2 GiB warns",
			s:      cpSnapshot(three, sized(1740*etcdMiB)...),
			result: Warn, found: []string{"db 1.7 GiB is 85 % of the 2 GiB quota (10 MiB in use)"}},
		{name: "quota-backend-bytes read as etcd's flag reads it (hex), the last one winning",
			s:      withQuota(cpSnapshot(three, sized(900*etcdMiB)...), "8589934592", "0x40000000"),
			result: Warn, found: []string{"is 87.9 % of the 1 GiB quota"}},
		{name: "quota-backend-bytes 0 is etcd's default",
			s:      withQuota(cpSnapshot(three, members(nil)...), "0"),
			result: Pass, found: []string{"of 2 GiB quota (quota-backend-bytes)"}},
		{name: "a negative quota-backend-bytes is no quota",
			s:      withQuota(cpSnapshot(three, sized(100<<30)...), "-1"),
			result: Pass, found: []string{"largest db 100 GiB, no quota"}},
		{name: "a quota etcd cannot parse warns",
			s:      withQuota(cpSnapshot(three, members(nil)...), "8Gi"),
			result: Warn, found: []string{`quota-backend-bytes "8Gi"`, "not judged"}},

		{name: "every problem at once: the worst result, each said",
			s: withQuota(cpSnapshot(three, func() []etcd.Member {
				ms := sized(850)
				ms[0].Alarms = []string{"NOSPACE"}
				return ms[:2]
			}()...), "1000"),
			result: Block, found: []string{"has alarm NOSPACE", "is 85 %", "without a member: m333"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := judgeEtcd(tc.s, "v1.36.3")
			checkFindingSays(t, f, tc.result, tc.found, tc.do, tc.notInFound)
		})
	}
}

// checkFindingSays fails t unless f has result, says each of found in Found and
// each of do in Do, none of notInFound in Found, and a Do whenever it is not
// a pass.
func checkFindingSays(t *testing.T, f Finding, result Result, found, do, notInFound []string) {
	t.Helper()
	if f.Result != result {
		t.Errorf("result %s, want %s\nfound: %s\ndo: %s", f.Result, result, f.Found, f.Do)
	}
	for _, want := range found {
		if !strings.Contains(f.Found, want) {
			t.Errorf("found %q\nwant it to say %q", f.Found, want)
		}
	}
	for _, unwanted := range notInFound {
		if strings.Contains(f.Found, unwanted) {
			t.Errorf("found %q\nwant it not to say %q", f.Found, unwanted)
		}
	}
	for _, want := range do {
		if !strings.Contains(f.Do, want) {
			t.Errorf("do %q\nwant it to say %q", f.Do, want)
		}
	}
	if f.Result != Pass && f.Do == "" {
		t.Errorf("a %s without a Do: %s", f.Result, f.Found)
	}
	if f.Result == Pass && f.Do != "" {
		t.Errorf("a pass with a Do: %s", f.Do)
	}
}
