package rollout

import (
	"context"
	"errors"
	"fmt"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/annotations"

	"github.com/cp-rollout/cp-rollout/pkg/workload"
)

// drainLimit bounds the head-start drain: pods that take longer to end are
// left to Cluster API's drain, which waits for them as long as the Machine's
// nodeDrainTimeout allows.
const drainLimit = time.Minute

// drain empties m's node just before m is deleted, as Cluster API's drain
// would (see workload.Drain for why), unless Cluster API must decide how:
// the machine opts out of draining or waits on a pre-drain hook, or the
// cluster's namespace has MachineDrainRules. It reports what it did: whether
// it cordoned the node, so a deletion that does not happen can give the node
// back, and what it evicted, which it may have waited up to drainLimit for.
// Nothing it leaves undone fails the run: Cluster API's drain follows.
func (e *Engine) drain(ctx context.Context, m *clusterv1.Machine) (d workload.Drained, err error) {
	node := nodeName(m)
	if node == "" || drainLeftToClusterAPI(m) {
		return d, nil
	}
	rules, err := e.Machines.DrainRules(ctx)
	if err != nil || len(rules) > 0 {
		return d, ctx.Err()
	}
	st := e.begin(Drain, m.Name, "draining node "+node)
	defer st.end(&err)
	d, err = e.Workload.Drain(ctx, node, drainLimit)
	if err != nil {
		return d, err
	}
	var msg string
	switch {
	case d.Cordoned:
		msg = fmt.Sprintf("node %s cordoned, %d pods evicted", node, len(d.Evicted))
	case len(d.Evicted) == 0 && d.Left == "":
		msg = fmt.Sprintf("node %s has no pods to evict; left to Cluster API's drain", node)
	default:
		msg = fmt.Sprintf("node %s: %d pods evicted", node, len(d.Evicted))
	}
	if d.Left != "" {
		msg += "; left to Cluster API's drain: " + d.Left
	}
	st.done(msg)
	return d, nil
}

// uncordon gives back the node of a machine that was drained and then not
// deleted (the run stopped or failed in between). It is best effort, with a
// context of its own: the run's may be the one that ended.
func (e *Engine) uncordon(ctx context.Context, m *clusterv1.Machine) {
	ctx, cancel := cleanupContext(ctx)
	defer cancel()
	_ = e.Workload.Uncordon(ctx, nodeName(m))
}

// giveBackCordoned uncordons the nodes a drain of this tool cordoned and no
// deletion followed (a run killed in between), except those of machines
// being deleted, whose drain Cluster API finishes. It returns the nodes it
// gave back.
func (e *Engine) giveBackCordoned(ctx context.Context, cp *kcpstate.ControlPlane) (nodes []string, err error) {
	if e.Workload == nil {
		return nil, errors.New("the workload cluster was not reached")
	}
	cordoned, err := e.Workload.Cordoned(ctx)
	if err != nil || len(cordoned) == 0 {
		return nil, err
	}
	for _, node := range cordoned {
		m := machineOfNode(cp, node)
		if m == nil || !m.DeletionTimestamp.IsZero() {
			continue
		}
		st := e.begin(Uncordon, m.Name, "node "+node+" was cordoned by a run that stopped before deleting "+m.Name+": giving it back")
		err := e.Workload.Uncordon(ctx, node)
		st.end(&err)
		if err != nil {
			return nodes, fmt.Errorf("uncordoning node %s: %w", node, err)
		}
		nodes = append(nodes, node)
	}
	return nodes, nil
}

// machineOfNode is the machine whose node is node, nil when none is.
func machineOfNode(cp *kcpstate.ControlPlane, node string) *clusterv1.Machine {
	for _, m := range cp.Machines {
		if nodeName(m) == node {
			return m
		}
	}
	return nil
}

// drainLeftToClusterAPI is a machine whose drain Cluster API must run itself:
// it is excluded from draining, or a pre-drain hook holds the drain until
// someone acts on the machine first.
func drainLeftToClusterAPI(m *clusterv1.Machine) bool {
	_, excluded := m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation]
	return excluded || annotations.HasWithPrefix(clusterv1.PreDrainDeleteHookAnnotationPrefix, m.Annotations)
}
