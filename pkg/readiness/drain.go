package readiness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	policyv1client "k8s.io/client-go/kubernetes/typed/policy/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// drainBlockers looks at what a control-plane node's drain will meet: the
// pods on every control-plane machine's node (each is drained in turn when
// the upgrade replaces its machine), the PodDisruptionBudgets of the
// workload cluster, and the MachineDrainRules of the cluster's namespace on
// the management cluster. What the drain does with each pod is judged as
// Cluster API v1.14's drain decides it (core/reconcilers/machine/drain):
//
//   - mirror pods and running DaemonSet pods are never evicted: ignored here;
//   - finished pods (Succeeded, Failed) are deleted whatever else holds:
//     nothing is lost and no budget is asked, so ignored too, as are pods
//     already being deleted;
//   - the label cluster.x-k8s.io/drain (skip, wait-completed), then the first
//     MachineDrainRule by name that applies to the machine and the pod,
//     decide Skip or WaitCompleted; anything else is evicted;
//   - an evicted pod that has no controller or has local storage is only a
//     warning to Cluster API: it evicts it and goes on.
//
// So the one thing here that stops the drain is the Eviction API refusing a
// pod: a PodDisruptionBudget that allows no disruption (429), or two budgets
// on one pod (500). Cluster API retries the eviction every 20 s until the
// machine's nodeDrainTimeoutSeconds passes — without end when it is unset,
// KCP's default — and the run waits with it: that blocks. Everything else
// lets the drain finish and loses something, or may stall it only for as
// long as a pod takes to complete: that warns.
func drainBlockers(ctx context.Context, c *Cluster) Finding {
	if c.Snapshot == nil || c.Snapshot.CP == nil || c.Snapshot.CP.KCP == nil {
		return notChecked("the control plane", errors.New("not read"))
	}
	if c.Workload == nil {
		return notChecked("the workload cluster", errors.New("not reached"))
	}
	if c.Management == nil {
		return notChecked("MachineDrainRules", errors.New("the management cluster was not reached"))
	}
	machines := drainedMachines(c.Snapshot.CP.Machines.UnsortedList())
	if len(machines) == 0 {
		return Finding{Result: Pass, Found: "no control-plane machine has a node yet: no drain to look at"}
	}
	policy, err := policyv1client.NewForConfig(c.Workload.Config)
	if err != nil {
		return notChecked("a policy/v1 client for the workload cluster", err)
	}
	in := drainInput{
		Cluster:  c.Snapshot.CP.Cluster,
		Machines: machines,
		Pods:     make(map[string][]corev1.Pod, len(machines)),
	}
	var (
		mu sync.Mutex
		g  errgroup.Group
	)
	g.SetLimit(4)
	// One list per node, by field selector: the pods of the control-plane
	// nodes only, however large the cluster.
	for _, m := range machines {
		node := m.Status.NodeRef.Name
		g.Go(func() error {
			pods, err := c.Workload.Kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
			if err != nil {
				return fmt.Errorf("listing the pods of node %s: %w", node, err)
			}
			mu.Lock()
			in.Pods[node] = pods.Items
			mu.Unlock()
			return nil
		})
	}
	g.Go(func() error {
		pdbs, err := policy.PodDisruptionBudgets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing PodDisruptionBudgets: %w", err)
		}
		in.PDBs = pdbs.Items
		return nil
	})
	g.Go(func() error {
		// Cluster API's drain looks for rules in the machine's namespace
		// only, as DrainRules in pkg/controlplane does.
		var rules clusterv1.MachineDrainRuleList
		err := c.Management.List(ctx, &rules, client.InNamespace(c.Snapshot.CP.KCP.Namespace))
		switch {
		case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			// A Cluster API without the kind has no rules.
		case err != nil:
			return fmt.Errorf("listing MachineDrainRules in %s: %w", c.Snapshot.CP.KCP.Namespace, err)
		default:
			in.Rules = rules.Items
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return notChecked("what the drain would meet", err)
	}
	// Namespaces are read only when a rule applies, for its
	// namespaceSelectors.
	if drainRulesApply(in.Rules, machines, in.Cluster) {
		nss, err := c.Workload.Kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return notChecked("namespaces of the workload cluster", err)
		}
		in.Namespaces = make(map[string]*corev1.Namespace, len(nss.Items))
		for i := range nss.Items {
			in.Namespaces[nss.Items[i].Name] = &nss.Items[i]
		}
	}
	return judgeDrain(in)
}

// drainedMachines are the machines whose node a drain empties, by name.
func drainedMachines(all []*clusterv1.Machine) []*clusterv1.Machine {
	var out []*clusterv1.Machine
	for _, m := range all {
		if m != nil && m.Status.NodeRef.Name != "" {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *clusterv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// drainInput is what drainBlockers read.
type drainInput struct {
	Cluster *clusterv1.Cluster
	// Machines are the control-plane machines that have a node.
	Machines []*clusterv1.Machine
	// Pods are the pods of each machine's node, by node name.
	Pods map[string][]corev1.Pod
	// PDBs are the workload cluster's PodDisruptionBudgets, all namespaces.
	PDBs []policyv1.PodDisruptionBudget
	// Rules are the MachineDrainRules in the machines' namespace.
	Rules []clusterv1.MachineDrainRule
	// Namespaces are the workload cluster's namespaces by name; nil when no
	// rule applies to a machine.
	Namespaces map[string]*corev1.Namespace
}

// judgeDrain decides what the drain of each machine's node meets.
func judgeDrain(in drainInput) Finding {
	var (
		blocks, warns, notes, do []string
		// held are the machines whose drain may wait on something: their
		// nodeDrainTimeoutSeconds says how long.
		heldByPDB, heldByWait []*clusterv1.Machine
		pdbPods               = map[string][]string{} // budget -> pods it refuses
		pdbs                  = map[string]*policyv1.PodDisruptionBudget{}
		multi, bare, local    []string
		ruled                 = map[string][]string{} // "who (behavior)" -> pods
		looked, nodes         int
	)
	invalid := invalidDrainRules(in.Rules)
	guards := newPDBIndex(in.PDBs)
	for _, m := range in.Machines {
		node := m.Status.NodeRef.Name
		if _, ok := m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation]; ok {
			notes = append(notes, fmt.Sprintf("machine %s opts out of draining (%s): its pods go down with it unjudged", m.Name, clusterv1.ExcludeNodeDrainingAnnotation))
			continue
		}
		nodes++
		rules := drainRulesFor(in.Rules, m, in.Cluster)
		pods := in.Pods[node]
		for i := range pods {
			p := &pods[i]
			if drainIgnores(p) {
				continue
			}
			looked++
			who := fmt.Sprintf("%s/%s (node %s)", p.Namespace, p.Name, node)
			var nsLabels map[string]string
			if ns := in.Namespaces[p.Namespace]; ns != nil {
				nsLabels = ns.Labels
			}
			behavior, by := podDrainBehavior(p, rules, nsLabels)
			switch behavior {
			case clusterv1.MachineDrainRuleDrainBehaviorSkip, clusterv1.MachineDrainRuleDrainBehaviorWaitCompleted:
				key := fmt.Sprintf("%s (%s)", by, behavior)
				ruled[key] = append(ruled[key], who)
				if behavior == clusterv1.MachineDrainRuleDrainBehaviorWaitCompleted {
					heldByWait = appendMachine(heldByWait, m)
				}
				// Not evicted: no budget is asked, nothing else applies.
				continue
			}
			if metav1.GetControllerOf(p) == nil {
				bare = append(bare, who)
			}
			if vols := diskEmptyDirs(p); len(vols) > 0 {
				local = append(local, fmt.Sprintf("%s/%s (node %s: %s)", p.Namespace, p.Name, node, strings.Join(vols, ", ")))
			}
			if p.Status.Phase == corev1.PodPending {
				// The Eviction API deletes a pending pod without asking
				// its budgets.
				continue
			}
			switch matched := guards.matching(p); {
			case len(matched) > 1:
				names := make([]string, len(matched))
				for i, b := range matched {
					names[i] = b.Namespace + "/" + b.Name
				}
				multi = append(multi, fmt.Sprintf("%s is selected by PodDisruptionBudgets %s, and the Eviction API refuses a pod with more than one", who, strings.Join(names, " and ")))
				heldByPDB = appendMachine(heldByPDB, m)
			case len(matched) == 1 && evictionRefused(p, matched[0]):
				key := matched[0].Namespace + "/" + matched[0].Name
				pdbs[key] = matched[0]
				pdbPods[key] = append(pdbPods[key], who)
				heldByPDB = appendMachine(heldByPDB, m)
			}
		}
	}

	for _, key := range slices.Sorted(maps.Keys(pdbPods)) {
		b := pdbs[key]
		blocks = append(blocks, fmt.Sprintf("PodDisruptionBudget %s allows no disruption (needs %d healthy pods, has %d) and guards %s",
			key, b.Status.DesiredHealthy, b.Status.CurrentHealthy, namedUpTo(pdbPods[key], 5)))
	}
	blocks = append(blocks, multi...)
	if len(pdbPods)+len(multi) > 0 {
		blocks = append(blocks, "Cluster API's drain retries those evictions "+drainWaitLimit(heldByPDB))
		first := slices.Sorted(maps.Keys(pdbPods))
		cmd := "kubectl -n NAMESPACE get pdb"
		if len(first) > 0 {
			ns, name, _ := strings.Cut(first[0], "/")
			cmd = fmt.Sprintf("kubectl -n %s get pdb %s -o yaml", ns, name)
		}
		act := fmt.Sprintf("let each PodDisruptionBudget named allow one disruption before the upgrade — scale its workload up or relax minAvailable/maxUnavailable (`%s`) — or move its pods off the control-plane nodes", cmd)
		if len(multi) > 0 {
			act += "; leave each pod under one PodDisruptionBudget at most"
		}
		do = append(do, act)
	}
	for _, name := range invalid {
		blocks = append(blocks, fmt.Sprintf("MachineDrainRule %s has an invalid selector: Cluster API's drain fails on every machine of the namespace until it is fixed", name))
	}
	if len(invalid) > 0 {
		do = append(do, fmt.Sprintf("fix or delete MachineDrainRule %s (`kubectl -n %s get machinedrainrule %s -o yaml`)", invalid[0], in.Rules[0].Namespace, invalid[0]))
	}

	if len(bare) > 0 {
		warns = append(warns, "pods without a controller, evicted and never recreated: "+namedUpTo(bare, 5))
		do = append(do, "run each bare pod under a controller (a Deployment), or delete it yourself if it is not needed")
	}
	if len(local) > 0 {
		warns = append(warns, "pods whose emptyDir data the eviction deletes: "+namedUpTo(local, 5))
		do = append(do, "copy out what those emptyDir volumes hold that must survive, or accept its loss")
	}
	var firstRule string
	for _, key := range slices.Sorted(maps.Keys(ruled)) {
		what := "not evicted: it goes down with its machine, without a graceful eviction"
		if strings.HasSuffix(key, "("+string(clusterv1.MachineDrainRuleDrainBehaviorWaitCompleted)+")") {
			what = "the drain waits for it to complete, " + drainWaitLimit(heldByWait)
		}
		warns = append(warns, fmt.Sprintf("%s applies to %s: %s", key, namedUpTo(ruled[key], 5), what))
		if firstRule == "" && strings.HasPrefix(key, "MachineDrainRule ") {
			firstRule, _, _ = strings.Cut(strings.TrimPrefix(key, "MachineDrainRule "), " ")
		}
	}
	if len(ruled) > 0 {
		check := "confirm the cluster.x-k8s.io/drain labels named are meant for pods on control-plane nodes"
		if firstRule != "" {
			check = fmt.Sprintf("confirm each MachineDrainRule and label named is meant for control-plane machines (`kubectl -n %s get machinedrainrule %s -o yaml`)", in.Rules[0].Namespace, firstRule)
		}
		do = append(do, check+": a skipped pod is killed with its machine, and a WaitCompleted pod that never completes holds the drain")
	}

	f := Finding{Result: Pass}
	switch {
	case len(blocks) > 0:
		f.Result = Block
		f.Found = strings.Join(append(blocks, warns...), "; ")
	case len(warns) > 0:
		f.Result = Warn
		f.Found = strings.Join(warns, "; ")
	default:
		f.Found = fmt.Sprintf("%d pods to evict on %d control-plane nodes: no PodDisruptionBudget refuses one, none is bare or on an emptyDir, no MachineDrainRule skips or waits", looked, nodes)
	}
	if len(notes) > 0 {
		f.Found += "; " + strings.Join(notes, "; ")
	}
	if f.Result != Pass {
		f.Do = strings.Join(do, "; ")
	}
	return f
}

// drainIgnores is a pod Cluster API's drain leaves alone or deletes at no
// cost: a static pod's mirror (the kubelet runs it, deletion does nothing),
// a DaemonSet's pod (its DaemonSet tolerates the cordon and would recreate
// it; Cluster API evicts one only when its DaemonSet is gone, which is rare
// and cannot be held by anything judged here), a finished pod (deleted
// without a budget, nothing running is lost), and a pod being deleted
// already (it is going whatever the drain does).
func drainIgnores(p *corev1.Pod) bool {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return true
	}
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "DaemonSet" {
		return true
	}
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil
}

// diskEmptyDirs names p's emptyDir volumes that live on the node's disk.
// Every emptyDir is gone once its pod is, and Cluster API warns on any; a
// memory-backed one (medium Memory or HugePages) is left out here because
// it never outlives even a reboot of its node: what a pod keeps there is
// scratch by design, and naming it would flag most controllers for nothing.
// A disk-backed one survives container restarts and reboots, so a pod may
// well keep something there it expects to find again.
func diskEmptyDirs(p *corev1.Pod) []string {
	var out []string
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumDefault {
			out = append(out, v.Name)
		}
	}
	return out
}

// podDrainBehavior is what Cluster API's drain does with p, and why: the
// pod's cluster.x-k8s.io/drain label first (skip, or wait-completed in any
// case, with or without its dash), then the first of rules (those that
// apply to the machine, by name) whose pod selectors match p and its
// namespace's labels. by names the label or rule; "" for the default Drain.
func podDrainBehavior(p *corev1.Pod, rules []*clusterv1.MachineDrainRule, nsLabels map[string]string) (behavior clusterv1.MachineDrainRuleDrainBehavior, by string) {
	if v, ok := p.Labels[clusterv1.PodDrainLabel]; ok {
		label := fmt.Sprintf("label %s=%s", clusterv1.PodDrainLabel, v)
		switch {
		case strings.EqualFold(v, string(clusterv1.MachineDrainRuleDrainBehaviorSkip)):
			return clusterv1.MachineDrainRuleDrainBehaviorSkip, label
		case strings.EqualFold(strings.Replace(v, "-", "", 1), string(clusterv1.MachineDrainRuleDrainBehaviorWaitCompleted)):
			return clusterv1.MachineDrainRuleDrainBehaviorWaitCompleted, label
		}
		// Any other value: Cluster API logs it and goes on to the rules.
	}
	for _, r := range rules {
		if drainRuleAppliesToPod(r, p.Labels, nsLabels) {
			return r.Spec.Drain.Behavior, "MachineDrainRule " + r.Name
		}
	}
	return clusterv1.MachineDrainRuleDrainBehaviorDrain, ""
}

// drainRulesFor are the rules that apply to machine m of cluster, sorted by
// name as Cluster API's drain orders them (the first matching a pod wins).
// A rule with no machine selector applies to every machine; otherwise one
// of its selectors must match both the machine's and the cluster's labels.
func drainRulesFor(rules []clusterv1.MachineDrainRule, m *clusterv1.Machine, cluster *clusterv1.Cluster) []*clusterv1.MachineDrainRule {
	var clusterLabels map[string]string
	if cluster != nil {
		clusterLabels = cluster.Labels
	}
	var out []*clusterv1.MachineDrainRule
	for i := range rules {
		r := &rules[i]
		applies := len(r.Spec.Machines) == 0
		for _, s := range r.Spec.Machines {
			if drainSelectorMatches(s.Selector, m.Labels) && drainSelectorMatches(s.ClusterSelector, clusterLabels) {
				applies = true
				break
			}
		}
		if applies {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *clusterv1.MachineDrainRule) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// drainRulesApply tells whether any rule applies to any of machines: only
// then are the namespaces worth reading.
func drainRulesApply(rules []clusterv1.MachineDrainRule, machines []*clusterv1.Machine, cluster *clusterv1.Cluster) bool {
	for _, m := range machines {
		if len(drainRulesFor(rules, m, cluster)) > 0 {
			return true
		}
	}
	return false
}

// drainRuleAppliesToPod: a rule with no pod selector applies to every pod;
// otherwise one of its selectors must match both the pod's and its
// namespace's labels.
func drainRuleAppliesToPod(r *clusterv1.MachineDrainRule, podLabels, nsLabels map[string]string) bool {
	if len(r.Spec.Pods) == 0 {
		return true
	}
	for _, s := range r.Spec.Pods {
		if drainSelectorMatches(s.Selector, podLabels) && drainSelectorMatches(s.NamespaceSelector, nsLabels) {
			return true
		}
	}
	return false
}

// drainSelectorMatches is a MachineDrainRule's selector semantics: absent
// or empty matches everything. An invalid one matches nothing here;
// invalidDrainRules reports it, since Cluster API refuses the drain then.
func drainSelectorMatches(s *metav1.LabelSelector, lbls map[string]string) bool {
	if s == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return false
	}
	return sel.Empty() || sel.Matches(labels.Set(lbls))
}

// invalidDrainRules names the rules with a selector that does not parse.
// Cluster API validates every rule of the namespace before each drain and
// fails the drain while any is invalid, whether it applies or not. Its
// admission webhook refuses such rules, so this finds only one written
// past it.
func invalidDrainRules(rules []clusterv1.MachineDrainRule) []string {
	var out []string
	for _, r := range rules {
		var sels []*metav1.LabelSelector
		for _, s := range r.Spec.Machines {
			sels = append(sels, s.Selector, s.ClusterSelector)
		}
		for _, s := range r.Spec.Pods {
			sels = append(sels, s.Selector, s.NamespaceSelector)
		}
		for _, s := range sels {
			if s == nil {
				continue
			}
			if _, err := metav1.LabelSelectorAsSelector(s); err != nil {
				out = append(out, r.Name)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// pdbIndex finds the budgets of a pod as the Eviction API does: every
// budget of the pod's namespace whose selector matches the pod's labels. A
// nil selector matches nothing and an empty one every pod (policy/v1); an
// invalid one matches nothing.
type pdbIndex map[string][]pdbSelector

type pdbSelector struct {
	pdb *policyv1.PodDisruptionBudget
	sel labels.Selector
}

func newPDBIndex(pdbs []policyv1.PodDisruptionBudget) pdbIndex {
	idx := pdbIndex{}
	for i := range pdbs {
		b := &pdbs[i]
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil {
			continue
		}
		idx[b.Namespace] = append(idx[b.Namespace], pdbSelector{pdb: b, sel: sel})
	}
	return idx
}

func (idx pdbIndex) matching(p *corev1.Pod) []*policyv1.PodDisruptionBudget {
	var out []*policyv1.PodDisruptionBudget
	for _, s := range idx[p.Namespace] {
		if s.sel.Matches(labels.Set(p.Labels)) {
			out = append(out, s.pdb)
		}
	}
	slices.SortFunc(out, func(a, b *policyv1.PodDisruptionBudget) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// evictionRefused tells whether the Eviction API refuses p, a running pod
// (pending and finished ones are deleted without asking), under its one
// budget b. A pod that is not Ready is let go when b says AlwaysAllow, or,
// by default (IfHealthyBudget), when the budget is met without it; a Ready
// one only while b allows a disruption. A budget whose status lags its
// spec refuses too, but only until its controller catches up: not judged.
func evictionRefused(p *corev1.Pod, b *policyv1.PodDisruptionBudget) bool {
	if !drainPodReady(p) {
		if ptr.Deref(b.Spec.UnhealthyPodEvictionPolicy, policyv1.IfHealthyBudget) == policyv1.AlwaysAllow {
			return false
		}
		if b.Status.DesiredHealthy > 0 && b.Status.CurrentHealthy >= b.Status.DesiredHealthy {
			return false
		}
	}
	return b.Status.DisruptionsAllowed <= 0
}

func drainPodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// drainWaitLimit says how long Cluster API's drain of machines keeps at
// it: until each machine's spec.deletion.nodeDrainTimeoutSeconds (which
// KCP copies from its machine template), without end when that is unset
// or 0. After it, the machine is deleted with the pods still on it.
func drainWaitLimit(machines []*clusterv1.Machine) string {
	limits := map[int32]bool{}
	for _, m := range machines {
		limits[max(ptr.Deref(m.Spec.Deletion.NodeDrainTimeoutSeconds, 0), 0)] = true
	}
	if len(limits) != 1 {
		return "until each machine's nodeDrainTimeoutSeconds passes (without end where it is unset), and the run waits with it"
	}
	for s := range limits {
		if s == 0 {
			return "without end (the machines' nodeDrainTimeoutSeconds is unset), and the run waits with it"
		}
		return fmt.Sprintf("for up to %s (nodeDrainTimeoutSeconds), the run waiting with it, then deletes the machine with the pods still on it", time.Duration(s)*time.Second)
	}
	return ""
}

func appendMachine(ms []*clusterv1.Machine, m *clusterv1.Machine) []*clusterv1.Machine {
	if slices.Contains(ms, m) {
		return ms
	}
	return append(ms, m)
}

// namedUpTo lists items, at most n of them and a count of the rest, so a
// finding stays one readable row on a cluster with many.
func namedUpTo(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:n], ", "), len(items)-n)
}
