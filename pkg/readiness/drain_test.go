package readiness

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// cpMachine is a control-plane machine on node, labelled as KCP labels its
// machines.
func drMachine(name, node string) *clusterv1.Machine {
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
		Labels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}}}
	m.Status.NodeRef.Name = node
	return m
}

type drPodOpt func(*corev1.Pod)

// drainPod is a running, Ready pod of a ReplicaSet in namespace apps,
// labelled app=web, unless opts say otherwise.
func drPod(name string, opts ...drPodOpt) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps", Labels: map[string]string{"app": "web"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-1", Controller: ptr.To(true)}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func drBare(p *corev1.Pod) { p.OwnerReferences = nil }
func drDaemonSet(p *corev1.Pod) {
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "agent", Controller: ptr.To(true)}}
}
func drMirror(p *corev1.Pod) {
	p.OwnerReferences = nil
	p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"}
}
func drNotReady(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
}
func drPhase(ph corev1.PodPhase) drPodOpt { return func(p *corev1.Pod) { p.Status.Phase = ph } }
func drLabel(k, v string) drPodOpt        { return func(p *corev1.Pod) { p.Labels[k] = v } }
func drEmptyDir(name string, medium corev1.StorageMedium) drPodOpt {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: medium}}})
	}
}

// budget is a PodDisruptionBudget in apps selecting app=web.
func drBudget(name string, allowed, desired, current int32) policyv1.PodDisruptionBudget {
	return policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, DesiredHealthy: desired, CurrentHealthy: current},
	}
}

func drRule(name string, behavior clusterv1.MachineDrainRuleDrainBehavior) clusterv1.MachineDrainRule {
	return clusterv1.MachineDrainRule{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: clusterv1.MachineDrainRuleSpec{Drain: clusterv1.MachineDrainRuleDrainConfig{Behavior: behavior}}}
}

func drWithMachines(r clusterv1.MachineDrainRule, sel, clusterSel map[string]string) clusterv1.MachineDrainRule {
	s := clusterv1.MachineDrainRuleMachineSelector{}
	if sel != nil {
		s.Selector = &metav1.LabelSelector{MatchLabels: sel}
	}
	if clusterSel != nil {
		s.ClusterSelector = &metav1.LabelSelector{MatchLabels: clusterSel}
	}
	r.Spec.Machines = append(r.Spec.Machines, s)
	return r
}

func drWithPods(r clusterv1.MachineDrainRule, sel, nsSel map[string]string) clusterv1.MachineDrainRule {
	s := clusterv1.MachineDrainRulePodSelector{}
	if sel != nil {
		s.Selector = &metav1.LabelSelector{MatchLabels: sel}
	}
	if nsSel != nil {
		s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: nsSel}
	}
	r.Spec.Pods = append(r.Spec.Pods, s)
	return r
}

func TestJudgeDrain(t *testing.T) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "default", Labels: map[string]string{"env": "prod"}}}
	namespaces := map[string]*corev1.Namespace{
		"apps": {ObjectMeta: metav1.ObjectMeta{Name: "apps", Labels: map[string]string{"team": "web"}}},
	}
	nilSelector := drBudget("all-or-nothing", 0, 1, 1)
	nilSelector.Spec.Selector = nil
	emptySelector := drBudget("everything", 0, 1, 1)
	emptySelector.Spec.Selector = &metav1.LabelSelector{}
	alwaysAllow := drBudget("web", 0, 2, 1)
	alwaysAllow.Spec.UnhealthyPodEvictionPolicy = ptr.To(policyv1.AlwaysAllow)
	otherNS := drBudget("web", 0, 1, 1)
	otherNS.Namespace = "other"
	invalid := drWithPods(drRule("broken", clusterv1.MachineDrainRuleDrainBehaviorDrain), nil, nil)
	invalid.Spec.Pods[0].Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}
	excluded := drMachine("cp-x", "n1")
	excluded.Annotations = map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: ""}
	timed := drMachine("cp-1", "n1")
	timed.Spec.Deletion.NodeDrainTimeoutSeconds = ptr.To[int32](600)

	cases := []struct {
		name     string
		machines []*clusterv1.Machine
		pods     []corev1.Pod // on n1
		pdbs     []policyv1.PodDisruptionBudget
		rules    []clusterv1.MachineDrainRule
		want     Result
		// found must all appear in Found; absent must not.
		found, absent []string
	}{
		{name: "a plain replicated pod passes", pods: []corev1.Pod{drPod("web-a")}, want: Pass,
			found: []string{"1 pods to evict on 1 control-plane nodes"}},
		// The eviction of a Ready pod under a budget that allows nothing is
		// refused (429) and retried until the drain timeout: it blocks.
		{name: "budget allowing no disruption blocks", pods: []corev1.Pod{drPod("web-a")},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)}, want: Block,
			found: []string{"PodDisruptionBudget apps/web", "apps/web-a (node n1)", "needs 2 healthy pods, has 2", "without end"}},
		{name: "budget allowing one passes", pods: []corev1.Pod{drPod("web-a")},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 1, 1, 2)}, want: Pass},
		{name: "the machine's drain timeout is named", machines: []*clusterv1.Machine{timed}, pods: []corev1.Pod{drPod("web-a")},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)}, want: Block, found: []string{"for up to 10m0s"}},
		{name: "budget of another namespace does not guard the pod", pods: []corev1.Pod{drPod("web-a")},
			pdbs: []policyv1.PodDisruptionBudget{otherNS}, want: Pass},
		{name: "budget whose selector misses the pod", pods: []corev1.Pod{drPod("web-a", drLabel("app", "db"))},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)}, want: Pass},
		// policy/v1: a nil selector selects nothing, an empty one every pod
		// of its namespace.
		{name: "nil budget selector guards nothing", pods: []corev1.Pod{drPod("web-a")},
			pdbs: []policyv1.PodDisruptionBudget{nilSelector}, want: Pass},
		{name: "empty budget selector guards every pod", pods: []corev1.Pod{drPod("web-a")},
			pdbs: []policyv1.PodDisruptionBudget{emptySelector}, want: Block, found: []string{"apps/everything"}},
		// The Eviction API deletes a pending pod without asking budgets.
		{name: "pending pod under a full budget passes", pods: []corev1.Pod{drPod("web-a", drPhase(corev1.PodPending))},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)}, want: Pass},
		// An unready pod: AlwaysAllow lets it go; by default it goes when the
		// budget is met without it, and is refused when it is not.
		{name: "unready pod, AlwaysAllow", pods: []corev1.Pod{drPod("web-a", drNotReady)},
			pdbs: []policyv1.PodDisruptionBudget{alwaysAllow}, want: Pass},
		{name: "unready pod, budget met", pods: []corev1.Pod{drPod("web-a", drNotReady)},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)}, want: Pass},
		{name: "unready pod, budget not met", pods: []corev1.Pod{drPod("web-a", drNotReady)},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 1)}, want: Block},
		// Two budgets on one pod: the Eviction API answers 500 every time,
		// even though each allows a disruption.
		{name: "two budgets on one pod block", pods: []corev1.Pod{drPod("web-a")},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 1, 1, 2), drBudget("web2", 1, 1, 2)}, want: Block,
			found: []string{"apps/web and apps/web2", "more than one"}},
		// Cluster API's drain never evicts these: neither a budget nor a
		// missing controller nor an emptyDir matters.
		{name: "drMirror pod ignored", pods: []corev1.Pod{drPod("kube-apiserver-n1", drMirror, drEmptyDir("x", ""))},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)}, want: Pass, found: []string{"0 pods to evict"}},
		{name: "DaemonSet pod ignored", pods: []corev1.Pod{drPod("agent-x", drDaemonSet, drEmptyDir("x", ""))},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)}, want: Pass},
		{name: "finished bare pod ignored", pods: []corev1.Pod{drPod("job-x", drBare, drPhase(corev1.PodSucceeded))}, want: Pass},
		// Evicted and nothing recreates it: Cluster API only warns, so do we.
		{name: "bare pod warns", pods: []corev1.Pod{drPod("debug", drBare)}, want: Warn,
			found: []string{"without a controller", "apps/debug (node n1)"}},
		{name: "disk emptyDir warns", pods: []corev1.Pod{drPod("web-a", drEmptyDir("cache", ""), drEmptyDir("tmp", corev1.StorageMediumMemory))},
			want: Warn, found: []string{"apps/web-a (node n1: cache)"}, absent: []string{"tmp"}},
		{name: "memory emptyDir passes", pods: []corev1.Pod{drPod("web-a", drEmptyDir("tmp", corev1.StorageMediumMemory))}, want: Pass},
		{name: "Skip rule warns, naming it", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{drRule("keep", clusterv1.MachineDrainRuleDrainBehaviorSkip)}, want: Warn,
			found: []string{"MachineDrainRule keep (Skip) applies to apps/web-a (node n1)", "kubectl -n default get machinedrainrule keep"}},
		{name: "WaitCompleted rule warns that the drain waits", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{drRule("batch", clusterv1.MachineDrainRuleDrainBehaviorWaitCompleted)}, want: Warn,
			found: []string{"MachineDrainRule batch (WaitCompleted)", "waits for it to complete", "without end"}},
		// A skipped pod is not evicted, so its budget is never asked.
		{name: "Skip rule takes the pod out of its budget's way", pods: []corev1.Pod{drPod("web-a")},
			pdbs:  []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)},
			rules: []clusterv1.MachineDrainRule{drRule("keep", clusterv1.MachineDrainRuleDrainBehaviorSkip)}, want: Warn},
		{name: "rule for worker machines does not apply", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{drWithMachines(drRule("workers", clusterv1.MachineDrainRuleDrainBehaviorSkip), map[string]string{"pool": "workers"}, nil)},
			want:  Pass},
		{name: "rule selecting control-plane machines applies", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{drWithMachines(drRule("cp", clusterv1.MachineDrainRuleDrainBehaviorSkip), map[string]string{clusterv1.MachineControlPlaneLabel: ""}, map[string]string{"env": "prod"})},
			want:  Warn, found: []string{"MachineDrainRule cp (Skip)"}},
		{name: "rule for another cluster does not apply", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{drWithMachines(drRule("dev", clusterv1.MachineDrainRuleDrainBehaviorSkip), nil, map[string]string{"env": "dev"})},
			want:  Pass},
		{name: "rule for other pods does not apply", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{drWithPods(drRule("db", clusterv1.MachineDrainRuleDrainBehaviorSkip), map[string]string{"app": "db"}, nil)},
			want:  Pass},
		{name: "rule matching the pod's namespace labels applies", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{drWithPods(drRule("team", clusterv1.MachineDrainRuleDrainBehaviorSkip), nil, map[string]string{"team": "web"})},
			want:  Warn, found: []string{"MachineDrainRule team (Skip)"}},
		{name: "rule for other namespaces does not apply", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{drWithPods(drRule("team", clusterv1.MachineDrainRuleDrainBehaviorSkip), nil, map[string]string{"team": "db"})},
			want:  Pass},
		// The first rule by name wins: a Drain rule named before a Skip one
		// leaves the pod to be evicted, and its budget blocks.
		{name: "first rule by name wins", pods: []corev1.Pod{drPod("web-a")},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)},
			rules: []clusterv1.MachineDrainRule{drRule("z-skip", clusterv1.MachineDrainRuleDrainBehaviorSkip),
				drRule("a-drain", clusterv1.MachineDrainRuleDrainBehaviorDrain)},
			want: Block, absent: []string{"z-skip"}},
		// The pod's label comes before every rule.
		{name: "drain label skip warns", pods: []corev1.Pod{drPod("web-a", drLabel(clusterv1.PodDrainLabel, "Skip"))},
			rules: []clusterv1.MachineDrainRule{drRule("a-drain", clusterv1.MachineDrainRuleDrainBehaviorDrain)},
			want:  Warn, found: []string{"label cluster.x-k8s.io/drain=Skip (Skip)"}},
		{name: "drain label wait-completed warns", pods: []corev1.Pod{drPod("web-a", drLabel(clusterv1.PodDrainLabel, "wait-completed"))},
			want: Warn, found: []string{"(WaitCompleted)"}},
		{name: "unknown drain label value drains", pods: []corev1.Pod{drPod("web-a", drLabel(clusterv1.PodDrainLabel, "later"))},
			pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)}, want: Block},
		{name: "machine that opts out of draining is not judged", machines: []*clusterv1.Machine{excluded},
			pods: []corev1.Pod{drPod("web-a", drBare)}, pdbs: []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)},
			want: Pass, found: []string{"machine cp-x opts out of draining"}},
		// Cluster API refuses to drain while any rule of the namespace has
		// a selector that does not parse, even one that applies nowhere.
		{name: "invalid rule blocks", pods: []corev1.Pod{drPod("web-a")},
			rules: []clusterv1.MachineDrainRule{invalid}, want: Block, found: []string{"MachineDrainRule broken has an invalid selector"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			machines := tc.machines
			if machines == nil {
				machines = []*clusterv1.Machine{drMachine("cp-1", "n1")}
			}
			f := judgeDrain(drainInput{Cluster: cluster, Machines: machines, Pods: map[string][]corev1.Pod{"n1": tc.pods},
				PDBs: tc.pdbs, Rules: tc.rules, Namespaces: namespaces})
			if f.Result != tc.want {
				t.Fatalf("result %s, want %s: %s", f.Result, tc.want, f.Found)
			}
			for _, s := range tc.found {
				if !strings.Contains(f.Found, s) && !strings.Contains(f.Do, s) {
					t.Errorf("%q not in finding:\nfound: %s\ndo: %s", s, f.Found, f.Do)
				}
			}
			for _, s := range tc.absent {
				if strings.Contains(f.Found, s) {
					t.Errorf("%q in found: %s", s, f.Found)
				}
			}
			if (f.Do == "") != (f.Result == Pass) {
				t.Errorf("do %q on a %s", f.Do, f.Result)
			}
		})
	}
}

// Pods on a node that no control-plane machine has are not looked at: the
// upgrade drains only control-plane nodes.
func TestJudgeDrainOnlyControlPlaneNodes(t *testing.T) {
	f := judgeDrain(drainInput{
		Machines: []*clusterv1.Machine{drMachine("cp-1", "n1")},
		Pods:     map[string][]corev1.Pod{"worker-1": {drPod("web-a")}},
		PDBs:     []policyv1.PodDisruptionBudget{drBudget("web", 0, 2, 2)},
	})
	if f.Result != Pass {
		t.Fatalf("a worker's pod judged: %+v", f)
	}
}

func TestDrainedMachines(t *testing.T) {
	noNode := drMachine("cp-0", "")
	got := drainedMachines([]*clusterv1.Machine{drMachine("cp-2", "n2"), noNode, nil, drMachine("cp-1", "n1")})
	if len(got) != 2 || got[0].Name != "cp-1" || got[1].Name != "cp-2" {
		t.Fatalf("got %v", got)
	}
}

func TestNamedUpTo(t *testing.T) {
	if got := namedUpTo([]string{"a", "b", "c"}, 2); got != "a, b and 1 more" {
		t.Fatalf("got %q", got)
	}
	if got := namedUpTo([]string{"a", "b"}, 2); got != "a, b" {
		t.Fatalf("got %q", got)
	}
}
