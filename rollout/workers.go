package rollout

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// On a topology cluster the topology controller upgrades the workers once
// the control plane is done, one MachineDeployment after another; this tool
// never drives them. With --wait-workers a run follows them until each is at
// the target, so a runbook's next step starts on an upgraded cluster.

// WorkersBehind says, for each MachineDeployment that is not yet all at
// version, what it still waits for; none means every worker runs version. A
// MachineDeployment is done when it asks for version, has observed that, and
// reports all of its replicas at version, up to date and available.
func WorkersBehind(mds []clusterv1.MachineDeployment, version string) []string {
	var out []string
	for i := range mds {
		md := &mds[i]
		want := ptr.Deref(md.Spec.Replicas, 0)
		switch {
		case md.Spec.Template.Spec.Version != version:
			why := fmt.Sprintf("MachineDeployment %s asks for %s", md.Name, md.Spec.Template.Spec.Version)
			for _, hold := range []string{clusterv1.ClusterTopologyHoldUpgradeSequenceAnnotation, clusterv1.ClusterTopologyDeferUpgradeAnnotation} {
				if _, held := md.Annotations[hold]; held {
					why += "; held by annotation " + hold
				}
			}
			out = append(out, why)
		case md.Status.ObservedGeneration < md.Generation:
			out = append(out, fmt.Sprintf("MachineDeployment %s: its controller has not observed generation %d", md.Name, md.Generation))
		case !atVersion(md.Status.Versions, version) || ptr.Deref(md.Status.Replicas, -1) != want ||
			ptr.Deref(md.Status.UpToDateReplicas, -1) != want || ptr.Deref(md.Status.AvailableReplicas, -1) != want:
			out = append(out, fmt.Sprintf("MachineDeployment %s: %d of %d machines up to date, %d available, reported at [%s]", md.Name,
				ptr.Deref(md.Status.UpToDateReplicas, 0), want, ptr.Deref(md.Status.AvailableReplicas, 0), versionList(md.Status.Versions)))
		}
	}
	return out
}

func atVersion(versions []clusterv1.StatusVersion, version string) bool {
	for _, v := range versions {
		if v.Version != version {
			return false
		}
	}
	return true
}

func versionList(versions []clusterv1.StatusVersion) string {
	var out []string
	for _, v := range versions {
		out = append(out, fmt.Sprintf("%d at %s", v.Replicas, v.Version))
	}
	return strings.Join(out, ", ")
}

// awaitWorkers follows the workers' rollout after the hand-back until
// WorkersBehind says none is behind, reporting each change of what it waits
// for. It gives up after limit (exit 4); the control plane is done either
// way.
func (e *Engine) awaitWorkers(ctx context.Context, version string, limit time.Duration) (err error) {
	st := e.begin(AwaitWorkers, "", fmt.Sprintf("waiting up to %s for the topology controller to upgrade the workers to %s", limit, version))
	defer st.end(&err)
	var count int
	// MachineDeployments are not watched: every check reads them live.
	err = e.pollUntil(ctx, st, limit, func(bool) ([]string, error) {
		mds, err := e.Topology.MachineDeployments(ctx)
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return []string{"cannot read the MachineDeployments: " + err.Error()}, nil
		}
		count = len(mds)
		return WorkersBehind(mds, version), nil
	}, func(behind []string) error {
		return exitcode.Timeoutf("the workers did not reach %s within --workers-timeout %s: %s", version, limit, strings.Join(behind, "; "))
	})
	if err != nil {
		return err
	}
	st.done(fmt.Sprintf("every worker runs %s (%d MachineDeployments)", version, count))
	return nil
}
