package fleet

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/record"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// Row is where one cluster's control plane stands, as `status -l/-A` shows
// it. Its JSON form is a documented, stable interface: fields are only ever
// added.
type Row struct {
	Cluster
	// ControlPlane is the KubeadmControlPlane's name; empty when the Cluster
	// has none this tool can read (Problem says why).
	ControlPlane string `json:"controlPlane,omitempty"`
	Version      string `json:"version,omitempty"`
	Replicas     int32  `json:"replicas"`
	// Machines counts the control plane's machines and UpToDate those of
	// them that are up to date (see Overview for where they come from).
	Machines int32 `json:"machines"`
	UpToDate int32 `json:"upToDate"`
	Paused   bool  `json:"paused"`
	// PausedByUs is true when the pause carries this tool's operation record.
	PausedByUs    bool                `json:"pausedByUs"`
	Lock          *rollout.LockStatus `json:"lock,omitempty"`
	Operation     *record.Record      `json:"operation,omitempty"`
	LastOperation *record.Record      `json:"lastOperation,omitempty"`
	// Acting is who changes the control plane's machines now (as status
	// CLUSTER says it); nil when the KubeadmControlPlane was not read.
	Acting *rollout.ActingStatus `json:"acting,omitempty"`
	// Problem is why the row is incomplete: the Cluster is skipped by fleet
	// commands, or its KubeadmControlPlane cannot be read.
	Problem string `json:"problem,omitempty"`
	// Etcd is the workload cluster's etcd as read from its members; only
	// with --etcd.
	Etcd *EtcdHealth `json:"etcd,omitempty"`
}

// EtcdHealth summarises a cluster's etcd members.
type EtcdHealth struct {
	Members int    `json:"members"`
	Healthy int    `json:"healthy"`
	Leader  string `json:"leader,omitempty"`
	Error   string `json:"error,omitempty"`
}

// machineReadsAtOnce bounds the Machine lists of the control planes whose
// own status cannot be trusted (Overview).
const machineReadsAtOnce = 8

// Overview reads where every Cluster in scope stands from three lists of
// the management cluster (Clusters, KubeadmControlPlanes, Leases), made at
// once and paged. It reads no workload cluster.
//
// A KubeadmControlPlane that reconciles (not paused, its status observed at
// its current generation) counts its own machines and those up to date by
// KCP's full comparison, in its status: Overview takes them from there.
// Listing every Machine instead costs most of the time at fleet scale
// (measured in docs/performance.md, "`status -A` over a fleet"). A paused
// or not yet observed control plane's status may be stale, and that is the
// one a person looks at mid-rollout: its Machines are listed, and counted
// as up to date when at the KubeadmControlPlane's version and not marked
// out of date by KCP, nor being deleted.
func Overview(ctx context.Context, l *Lister, scope Scope) ([]Row, error) {
	var (
		clusters []selected
		kcps     = map[Cluster]*kcpSummary{}
		leases   = map[Cluster]*rollout.LockStatus{}
		now      = time.Now()
	)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		clusters, err = listClusters(gctx, l, scope)
		return err
	})
	g.Go(func() error {
		err := listEach(gctx, l, collection{gv: controlplanev1.GroupVersion, resource: "kubeadmcontrolplanes", namespace: scope.Namespace},
			func(kcp *controlplanev1.KubeadmControlPlane) {
				kcps[Cluster{Namespace: kcp.Namespace, Name: kcp.Name}] = summarize(kcp)
			})
		return wrap(err, "KubeadmControlPlanes", Scope{Namespace: scope.Namespace})
	})
	g.Go(func() error {
		err := listEach(gctx, l, collection{gv: coordinationv1.SchemeGroupVersion, resource: "leases", namespace: scope.Namespace},
			func(lease *coordinationv1.Lease) {
				if name, ok := strings.CutPrefix(lease.Name, runlock.LeaseName("")); ok {
					leases[Cluster{Namespace: lease.Namespace, Name: name}] = rollout.LockOf(lease, now)
				}
			})
		return wrap(err, "Leases", Scope{Namespace: scope.Namespace})
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}

	rows := make([]Row, len(clusters))
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(machineReadsAtOnce)
	for i, cl := range clusters {
		r := &rows[i]
		r.Cluster, r.ControlPlane, r.Problem, r.Lock = cl.Cluster, cl.controlPlane, cl.problem, leases[cl.Cluster]
		if r.ControlPlane == "" {
			continue
		}
		kcp := kcps[Cluster{Namespace: r.Namespace, Name: r.ControlPlane}]
		if kcp == nil {
			r.Problem = fmt.Sprintf("KubeadmControlPlane %s not found", r.ControlPlane)
			continue
		}
		kcp.fill(r)
		acting := rollout.Acting(r.Lock, r.Operation, r.Paused, kcp.busy)
		r.Acting = &acting
		if !r.Paused && kcp.current {
			continue
		}
		g.Go(func() error { return countMachines(gctx, l, r, kcp.row.Version) })
	}
	return rows, g.Wait()
}

// kcpSummary is what a row takes from a KubeadmControlPlane, kept instead
// of the object so that each can be freed once read.
type kcpSummary struct {
	row Row // the fields fill sets
	// current is true when KCP has observed the current spec: the machine
	// counts of its status are its own, for this spec.
	current bool
	// busy names the conditions by which KCP says it is changing machines.
	busy []string
}

func summarize(kcp *controlplanev1.KubeadmControlPlane) *kcpSummary {
	s := &kcpSummary{current: kcp.Status.ObservedGeneration == kcp.Generation, busy: rollout.KCPActivity(kcp)}
	r := &s.row
	r.Version, r.Replicas = kcp.Spec.Version, ptr.Deref(kcp.Spec.Replicas, 1)
	r.Machines, r.UpToDate = ptr.Deref(kcp.Status.Replicas, 0), ptr.Deref(kcp.Status.UpToDateReplicas, 0)
	_, r.Paused = kcp.Annotations[clusterv1.PausedAnnotation]
	rec, err := record.Of(kcp)
	if err != nil {
		r.Problem = err.Error()
	}
	r.Operation, r.PausedByUs = rec, r.Paused && rec != nil
	r.LastOperation = record.LastOf(kcp)
	return s
}

// fill completes a row from its KubeadmControlPlane.
func (s *kcpSummary) fill(r *Row) {
	k := s.row
	r.Version, r.Replicas, r.Machines, r.UpToDate = k.Version, k.Replicas, k.Machines, k.UpToDate
	r.Paused, r.PausedByUs, r.Operation, r.LastOperation = k.Paused, k.PausedByUs, k.Operation, k.LastOperation
	if k.Problem != "" {
		r.Problem = k.Problem
	}
}

// countMachines counts the control-plane Machines that the row's
// KubeadmControlPlane controls, as KCP counts only the machines it owns, and
// those of them up to date at version.
func countMachines(ctx context.Context, l *Lister, r *Row, version string) error {
	r.Machines, r.UpToDate = 0, 0
	err := listEach(ctx, l, controlPlaneMachines(r.Cluster),
		func(m *clusterv1.Machine) {
			owner := metav1.GetControllerOf(m)
			if owner == nil || owner.Kind != "KubeadmControlPlane" || owner.Name != r.ControlPlane {
				return
			}
			r.Machines++
			if m.DeletionTimestamp.IsZero() && m.Spec.Version == version &&
				!conditions.IsFalse(m, clusterv1.MachineUpToDateCondition) {
				r.UpToDate++
			}
		})
	return wrap(err, "the control-plane Machines of "+r.Cluster.String(), Scope{Namespace: r.Namespace})
}

// controlPlaneMachines is where cl's control-plane Machines are: the
// selector KCP writes into its status.
func controlPlaneMachines(cl Cluster) collection {
	return collection{gv: clusterv1.GroupVersion, resource: "machines", namespace: cl.Namespace,
		labels: clusterv1.ClusterNameLabel + "=" + cl.Name + "," + clusterv1.MachineControlPlaneLabel}
}

// ControlPlaneMachines names cl's control-plane Machines, in name order, from
// one list (shell completion offers them to replace). Only their metadata is
// decoded: the names are all it keeps.
func ControlPlaneMachines(ctx context.Context, l *Lister, cl Cluster) ([]string, error) {
	var names []string
	err := listEach(ctx, l, controlPlaneMachines(cl), func(m *metav1.PartialObjectMetadata) {
		names = append(names, m.Name)
	})
	if err != nil {
		return nil, wrap(err, "the control-plane Machines of "+cl.String(), Scope{Namespace: cl.Namespace})
	}
	sort.Strings(names)
	return names, nil
}

func wrap(err error, what string, scope Scope) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("listing %s %s: %w", what, scope, err)
}
