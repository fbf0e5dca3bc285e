package readiness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// etcdDefaultQuota is the backend quota etcd enforces when
// quota-backend-bytes is unset or 0 (go.etcd.io/etcd/server/v3 storage
// DefaultQuotaBytes; the package is not a dependency here, and kubeadm sets no
// quota of its own, so etcd's default is the cluster's).
const etcdDefaultQuota = int64(2 << 30)

// A rollout needs headroom below the quota: every join streams a snapshot of
// the whole database to the new member, and bbolt cannot reuse pages freed
// while that long read is open, so the database file grows under the
// cluster's ordinary writes meanwhile; each replacement also restarts an API
// server whose clients re-list and rewrite (Nodes, Leases, Events), adding
// revisions until the next compaction. Reaching the quota raises NOSPACE,
// after which etcd takes no writes at all. 80 % leaves room for that; above
// 95 % a single join may be what tips it over.
const (
	etcdWarnPercent  = 80
	etcdBlockPercent = 95
)

// etcdQuotaArg is etcd's flag for the backend quota.
const etcdQuotaArg = "quota-backend-bytes"

// etcdHealth judges the etcd members the snapshot read live.
func etcdHealth(_ context.Context, c *Cluster) Finding {
	return judgeEtcd(c.Snapshot, "v"+c.Target.String())
}

// etcdProblem is one thing found wrong, with what to do about it.
type etcdProblem struct {
	result    Result
	found, do string
}

// judgeEtcd judges the members of s: alarms, learners, members no machine
// owns and unhealthy members block; the largest database against the quota
// warns or blocks; member and machine counts that differ warn. target is
// the version the upgrade asks for, for the commands Do names.
func judgeEtcd(s *rollout.Snapshot, target string) Finding {
	if !s.EtcdManaged {
		return Finding{Result: Pass, Found: "etcd is external, not judged"}
	}
	if len(s.Members) == 0 {
		// Managed etcd always has a member; none means the read got nothing.
		return notChecked("etcd members", errors.New("no member was read"))
	}
	cluster := clusterArgsOf(s)
	machineOf := map[string]string{} // node name → machine name
	for _, m := range s.CP.Machines {
		if m.Status.NodeRef.Name != "" {
			machineOf[m.Status.NodeRef.Name] = m.Name
		}
	}
	// The tool's own selection, with the holds its run applies (no member
	// counts as nobody's while a machine may still own it).
	stale := rollout.StaleMembers(s)
	isStale := func(m etcd.Member) bool {
		return slices.ContainsFunc(stale, func(o etcd.Member) bool { return o.ID == m.ID })
	}
	var problems []etcdProblem

	for _, m := range s.Members {
		if len(m.Alarms) > 0 {
			problems = append(problems, etcdAlarm(m, machineOf[m.Name], cluster))
		}
	}
	for _, m := range stale {
		why := "named after no machine's node"
		if !m.Started() {
			why = "a learner that never started, and no machine is joining"
		}
		// Every run of the tool removes such a member as its first step,
		// once the voting members left keep quorum (rollout.Next,
		// RemoveStaleMember), so it warns: it is named so that the
		// operator knows the first step is not a machine's.
		problems = append(problems, etcdProblem{Warn,
			fmt.Sprintf("member %s has no control-plane machine (%s)", m, why),
			fmt.Sprintf("the upgrade removes it as its first step if the voting members left keep quorum (`kubectl cp-rollout status %s` shows NEXT remove-stale-member); or remove it by hand: %s",
				cluster, etcdctl(fmt.Sprintf("member remove %x", m.ID)))})
	}
	for _, m := range s.Members {
		if !m.Learner || isStale(m) {
			continue
		}
		// etcd admits one learner at a time: while this one is not promoted
		// no replacement can join, and the run would wait on it.
		owner := machineOf[m.Name]
		found := fmt.Sprintf("member %s is a learner, not yet promoted", m)
		do := fmt.Sprintf("wait for its join to finish (`kubectl cp-rollout status %s`)", cluster)
		if owner != "" {
			found += " (machine " + owner + " is joining)"
			do += fmt.Sprintf("; if it stays a learner, replace the machine: `kubectl cp-rollout replace %s`", clusterArgsWithMachine(cluster, owner))
		}
		problems = append(problems, etcdProblem{Block, found, do})
	}
	for _, m := range s.Members {
		if m.Healthy || !m.Started() || m.Learner || len(m.Alarms) > 0 || isStale(m) || onlyAlarmErrors(m) {
			continue // reported above, or nothing to say
		}
		found := fmt.Sprintf("member %s is unhealthy: %s", m, strings.Join(m.Errors, "; "))
		do := fmt.Sprintf("`kubectl cp-rollout status %s` shows the member table; bring the member back", cluster)
		if owner := machineOf[m.Name]; owner != "" {
			do += fmt.Sprintf(", or replace its machine: `kubectl cp-rollout replace %s`", clusterArgsWithMachine(cluster, owner))
		}
		// A warning: an unhealthy member is a broken machine, which the
		// run's own guards refuse before anything changes — naming the
		// replace command — or replace first with --replace-unhealthy. A
		// block here would stop that replacement too.
		do += "; `upgrade --replace-unhealthy` replaces it as the run's first step"
		problems = append(problems, etcdProblem{Warn, found, do})
	}

	size, sizeProblem := etcdSize(s)
	if sizeProblem != nil {
		problems = append(problems, *sizeProblem)
	}

	owned := len(s.Members) - len(stale)
	if machines := s.CP.Machines.Len(); owned != machines {
		var without []string
		for _, m := range s.CP.Machines.SortedByCreationTimestamp() {
			if _, ok := rollout.MemberOf(s, m); !ok {
				without = append(without, m.Name)
			}
		}
		found := fmt.Sprintf("%d etcd members for %d control-plane machines", owned, machines)
		if len(without) > 0 {
			found += "; without a member: " + strings.Join(without, ", ")
		}
		problems = append(problems, etcdProblem{Warn, found,
			fmt.Sprintf("`kubectl cp-rollout status %s` shows machines and members side by side; a machine still joining settles by itself", cluster)})
	}

	if len(problems) == 0 {
		return Finding{Result: Pass, Found: fmt.Sprintf("%d members, healthy, no alarms, %s", len(s.Members), size)}
	}
	f := Finding{Result: Pass}
	var found, do []string
	for _, p := range problems {
		if p.result == Block || f.Result == Pass {
			f.Result = p.result
		}
		found = append(found, p.found)
		if !slices.Contains(do, p.do) {
			do = append(do, p.do)
		}
	}
	f.Found, f.Do = strings.Join(found, "; "), strings.Join(do, "; ")
	if strings.Contains(f.Do, "`etcdctl ") {
		f.Do += "; " + etcdctlHow(s)
	}
	return f
}

// etcdAlarm is the problem of a member with alarms. NOSPACE means the
// database reached its quota and etcd refuses every write, CORRUPT that the
// member's data differs from the others': either blocks.
func etcdAlarm(m etcd.Member, machine, cluster string) etcdProblem {
	found := fmt.Sprintf("member %s has alarm %s", m, strings.Join(m.Alarms, ", "))
	do := []string{"see them: " + etcdctl("alarm list")}
	if slices.Contains(m.Alarms, "NOSPACE") {
		do = append(do, fmt.Sprintf("for NOSPACE free space first — defragment each member in turn (%s in its pod), or raise %s in the KubeadmControlPlane's etcd.local.extraArgs — then %s",
			etcdctl("defrag"), etcdQuotaArg, etcdctl("alarm disarm")))
	}
	if slices.Contains(m.Alarms, "CORRUPT") {
		replace := "remove the corrupt member and let its machine be replaced"
		if machine != "" {
			replace = fmt.Sprintf("replace its machine (`kubectl cp-rollout replace %s`)", clusterArgsWithMachine(cluster, machine))
		}
		do = append(do, fmt.Sprintf("for CORRUPT do not disarm: find the member whose data differs (%s), %s, then disarm",
			etcdctl("endpoint hashkv --cluster"), replace))
	}
	return etcdProblem{Block, found, strings.Join(do, "; ")}
}

// etcdSize says how the largest member's database stands against the quota
// and, above etcdWarnPercent, the problem it is. etcd measures the quota
// against the database file (DBSize), free pages included; a defragment gives
// back what is not in use (DBSize - DBSizeInUse).
func etcdSize(s *rollout.Snapshot) (string, *etcdProblem) {
	quota, set, err := etcdQuota(s)
	var largest etcd.Member
	for _, m := range s.Members {
		if m.DBSize > largest.DBSize {
			largest = m
		}
	}
	if err != nil {
		return "", &etcdProblem{Warn, err.Error() + "; the database size is not judged",
			fmt.Sprintf("fix %s in the KubeadmControlPlane's etcd.local.extraArgs", etcdQuotaArg)}
	}
	if quota < 0 {
		// etcd runs without a quota when it is negative: nothing to reach.
		return fmt.Sprintf("largest db %s, no quota (%s < 0)", etcdBytes(largest.DBSize), etcdQuotaArg), nil
	}
	of := "quota"
	if set {
		of = "quota (" + etcdQuotaArg + ")"
	}
	says := fmt.Sprintf("largest db %s of %s %s", etcdBytes(largest.DBSize), etcdBytes(quota), of)
	percent := float64(largest.DBSize) * 100 / float64(quota)
	var result Result
	switch {
	case largest.DBSize*100 > quota*etcdBlockPercent:
		result = Block
	case largest.DBSize*100 > quota*etcdWarnPercent:
		result = Warn
	default:
		return says, nil
	}
	found := fmt.Sprintf("member %s: db %s is %s %% of the %s quota (%s in use); a rollout's joins grow it", largest,
		etcdBytes(largest.DBSize), strings.TrimSuffix(fmt.Sprintf("%.1f", percent), ".0"), etcdBytes(quota), etcdBytes(largest.DBSizeInUse))
	do := fmt.Sprintf("defragment each member in turn, the leader last (%s in its pod), which gives back what is not in use; or raise %s in the KubeadmControlPlane's etcd.local.extraArgs (the rollout then applies it)",
		etcdctl("defrag"), etcdQuotaArg)
	return says, &etcdProblem{result, found, do}
}

// etcdQuota is the quota the KubeadmControlPlane gives etcd: the last
// quota-backend-bytes of its etcd.local.extraArgs (v1beta2 keeps them as a
// list of name and value, and etcd's flag parsing lets the last one win), or
// etcd's default. set says it came from the KCP. The value is read as etcd's
// int64 flag reads it (Go's flag package: base prefixes allowed); 0 means
// etcd's default, a negative value no quota at all.
func etcdQuota(s *rollout.Snapshot) (quota int64, set bool, err error) {
	if s.CP.KCP == nil {
		return etcdDefaultQuota, false, nil
	}
	var value *string
	for _, arg := range s.CP.KCP.Spec.KubeadmConfigSpec.ClusterConfiguration.Etcd.Local.ExtraArgs {
		if arg.Name == etcdQuotaArg {
			value = arg.Value
		}
	}
	if value == nil {
		return etcdDefaultQuota, false, nil
	}
	q, err := strconv.ParseInt(*value, 0, 64)
	switch {
	case err != nil:
		return 0, true, fmt.Errorf("%s %q in the KubeadmControlPlane's etcd.local.extraArgs is not a number of bytes etcd accepts", etcdQuotaArg, *value)
	case q == 0:
		return etcdDefaultQuota, true, nil
	}
	return q, true, nil
}

// etcdBytes writes a size in binary units, as etcd's own logs do.
func etcdBytes(n int64) string {
	const (
		mib = 1 << 20
		gib = 1 << 30
	)
	switch {
	case n >= gib:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/gib), ".0") + " GiB"
	case n >= mib:
		return fmt.Sprintf("%d MiB", n/mib)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// etcdctl is an etcdctl command for Do; etcdctlHow says where it runs.
func etcdctl(args string) string { return "`etcdctl " + args + "`" }

// etcdctlHow says how to run etcdctl on the workload cluster: in a member's
// static pod, with the certificates kubeadm puts there, through a healthy
// voting member's when there is one.
func etcdctlHow(s *rollout.Snapshot) string {
	node := ""
	for _, m := range s.Members {
		if m.Node != "" && (node == "" || m.HealthyVoter()) {
			node = m.Node
			if m.HealthyVoter() {
				break
			}
		}
	}
	if node == "" {
		node = "NODE"
	}
	return fmt.Sprintf("etcdctl runs in a member's pod on the workload cluster: `kubectl -n kube-system exec etcd-%s -- etcdctl --cacert /etc/kubernetes/pki/etcd/ca.crt --cert /etc/kubernetes/pki/etcd/server.crt --key /etc/kubernetes/pki/etcd/server.key ...`", node)
}

// clusterArgsOf names the snapshot's cluster as the tool's commands take it:
// "NAME -n NAMESPACE".
func clusterArgsOf(s *rollout.Snapshot) string {
	var c *clusterv1.Cluster
	if s != nil && s.CP != nil {
		c = s.CP.Cluster
	}
	if c == nil {
		return "CLUSTER"
	}
	return c.Name + " -n " + c.Namespace
}

// clusterArgsWithMachine puts a machine's name after the cluster's in clusterArgsOf's
// form: "NAME MACHINE -n NAMESPACE", as `replace` takes them.
func clusterArgsWithMachine(cluster, machine string) string {
	name, ns, ok := strings.Cut(cluster, " -n ")
	if !ok {
		return cluster + " " + machine
	}
	return name + " " + machine + " -n " + ns
}

// onlyAlarmErrors is true for a member whose only errors are the alarms of
// the cluster: etcd lists every member's alarm in each member's status
// errors, so the alarmed member's neighbours read unhealthy for its alarm,
// which the alarm's own finding names.
func onlyAlarmErrors(m etcd.Member) bool {
	return len(m.Errors) > 0 && !slices.ContainsFunc(m.Errors, func(e string) bool { return !strings.Contains(e, "alarm:") })
}
