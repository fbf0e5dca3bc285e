package fleet

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
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
	// Machines counts the control-plane Machines the KubeadmControlPlane
	// owns; UpToDate those of them at its version that KCP has not marked
	// out of date and that are not being deleted; Deleting those being
	// deleted.
	Machines int  `json:"machines"`
	UpToDate int  `json:"upToDate"`
	Deleting int  `json:"deleting"`
	Paused   bool `json:"paused"`
	// PausedByUs is true when the pause carries this tool's operation record.
	PausedByUs    bool                 `json:"pausedByUs"`
	Lock          *rollout.LockStatus  `json:"lock,omitempty"`
	Operation     *controlplane.Record `json:"operation,omitempty"`
	LastOperation *controlplane.Record `json:"lastOperation,omitempty"`
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

// machineCounts are a KubeadmControlPlane's machines, counted while they are
// listed so that no Machine is kept: a fleet's memory follows the page.
// versions counts the machines that are not being deleted and that KCP has
// not marked out of date, by version.
type machineCounts struct {
	machines, deleting int
	versions           map[string]int
}

// Overview reads where every Cluster in scope stands from four lists of the
// management cluster (Clusters, KubeadmControlPlanes, control-plane
// Machines, Leases), made at once and paged. It reads no workload cluster:
// "up to date" is the machine's version and KCP's UpToDate condition, not
// KCP's full comparison that `status CLUSTER` makes.
func Overview(ctx context.Context, c client.Reader, scope Scope) ([]Row, error) {
	var (
		rows   []Row
		kcps   = map[Cluster]*controlplanev1.KubeadmControlPlane{}
		counts = map[Cluster]*machineCounts{} // by KubeadmControlPlane
		leases = map[Cluster]*coordinationv1.Lease{}
		mu     sync.Mutex
	)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return listClusters(ctx, c, scope, func(cl *clusterv1.Cluster) {
			row := Row{Cluster: Cluster{Namespace: cl.Namespace, Name: cl.Name}, Problem: notOurs(cl)}
			if row.Problem == "" {
				row.ControlPlane = cl.Spec.ControlPlaneRef.Name
			}
			rows = append(rows, row)
		})
	})
	g.Go(func() error {
		err := listPages(ctx, c, func() *controlplanev1.KubeadmControlPlaneList { return &controlplanev1.KubeadmControlPlaneList{} },
			[]client.ListOption{client.InNamespace(scope.Namespace)}, func(l *controlplanev1.KubeadmControlPlaneList) {
				mu.Lock()
				defer mu.Unlock()
				for i := range l.Items {
					kcps[Cluster{Namespace: l.Items[i].Namespace, Name: l.Items[i].Name}] = &l.Items[i]
				}
			})
		return wrap(err, "KubeadmControlPlanes", scope)
	})
	g.Go(func() error {
		err := listPages(ctx, c, func() *clusterv1.MachineList { return &clusterv1.MachineList{} },
			[]client.ListOption{client.InNamespace(scope.Namespace), client.HasLabels{clusterv1.MachineControlPlaneLabel}},
			func(l *clusterv1.MachineList) {
				mu.Lock()
				defer mu.Unlock()
				for i := range l.Items {
					countMachine(counts, &l.Items[i])
				}
			})
		return wrap(err, "control-plane Machines", scope)
	})
	g.Go(func() error {
		err := listPages(ctx, c, func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} },
			[]client.ListOption{client.InNamespace(scope.Namespace)}, func(l *coordinationv1.LeaseList) {
				mu.Lock()
				defer mu.Unlock()
				for i := range l.Items {
					if name, ok := strings.CutPrefix(l.Items[i].Name, controlplane.LeaseName("")); ok {
						leases[Cluster{Namespace: l.Items[i].Namespace, Name: name}] = &l.Items[i]
					}
				}
			})
		return wrap(err, "Leases", scope)
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	now := time.Now()
	for i := range rows {
		r := &rows[i]
		if l := leases[r.Cluster]; l != nil {
			r.Lock = &rollout.LockStatus{Holder: ptr.Deref(l.Spec.HolderIdentity, ""), Live: controlplane.Live(l, now)}
			if l.Spec.RenewTime != nil {
				r.Lock.RenewTime = &l.Spec.RenewTime.Time
			}
		}
		if r.ControlPlane == "" {
			continue
		}
		kcp := kcps[Cluster{Namespace: r.Namespace, Name: r.ControlPlane}]
		if kcp == nil {
			r.Problem = fmt.Sprintf("KubeadmControlPlane %s not found", r.ControlPlane)
			continue
		}
		fill(r, kcp, counts[Cluster{Namespace: r.Namespace, Name: kcp.Name}])
	}
	return rows, nil
}

// fill completes a row from its KubeadmControlPlane and its machines.
func fill(r *Row, kcp *controlplanev1.KubeadmControlPlane, n *machineCounts) {
	r.Version, r.Replicas = kcp.Spec.Version, ptr.Deref(kcp.Spec.Replicas, 1)
	_, r.Paused = kcp.Annotations[clusterv1.PausedAnnotation]
	rec, err := controlplane.RecordOf(kcp)
	if err != nil {
		r.Problem = err.Error()
	}
	r.Operation, r.PausedByUs = rec, r.Paused && rec != nil
	r.LastOperation = controlplane.LastOf(kcp)
	if n != nil {
		r.Machines, r.Deleting, r.UpToDate = n.machines, n.deleting, n.versions[kcp.Spec.Version]
	}
}

// countMachine counts m for the KubeadmControlPlane that controls it, as KCP
// only counts the machines it owns.
func countMachine(counts map[Cluster]*machineCounts, m *clusterv1.Machine) {
	owner := metav1.GetControllerOf(m)
	if owner == nil || owner.Kind != "KubeadmControlPlane" {
		return
	}
	key := Cluster{Namespace: m.Namespace, Name: owner.Name}
	n := counts[key]
	if n == nil {
		n = &machineCounts{}
		counts[key] = n
	}
	n.machines++
	if !m.DeletionTimestamp.IsZero() {
		n.deleting++
		return
	}
	if !conditions.IsFalse(m, clusterv1.MachineUpToDateCondition) {
		if n.versions == nil {
			n.versions = map[string]int{}
		}
		n.versions[m.Spec.Version]++
	}
}

func wrap(err error, what string, scope Scope) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("listing %s %s: %w", what, scope, err)
}
