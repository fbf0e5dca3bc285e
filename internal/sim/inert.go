package sim

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg/desiredstate"
	kcpadmission "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/test/builder"
)

const (
	// InertLabel is the label CreateInertClusters puts on its Clusters,
	// with the value InertLabelValue: env=inert.
	InertLabel      = "env"
	InertLabelValue = "inert"

	// inertWorkers is how many clusters CreateInertClusters creates at once:
	// each cluster's requests are sequential (owners first), and a local API
	// server, whose every write of a Cluster API object costs milliseconds of
	// CPU, is busy with far fewer.
	inertWorkers = 32

	// inertPausedMessage is what Cluster API's controllers write into the
	// Paused condition of an object whose Cluster has spec.paused set
	// (util/paused): the inert objects carry it already, so that the
	// controllers, finding it, write nothing.
	inertPausedMessage = "Cluster spec.paused is set to true"
)

// InertClusterName names the i-th (from 1) cluster CreateInertClusters makes.
func InertClusterName(i int) string { return fmt.Sprintf("inert-%d", i) }

// CreateInertClusters creates, in namespace, the Clusters inert-1 …
// inert-<clusters>, labelled env=inert, that exist only as management-cluster
// objects: no workload cluster, no etcd, no provider. Each is a paused
// Cluster (spec.paused, so that Cluster API's controllers leave it alone),
// its generic infrastructure cluster, a KubeadmControlPlane of machines
// replicas at version, and those control-plane Machines, with the status
// that Cluster API v1beta2 reports for a healthy cluster of them, frozen as a
// pause freezes it: provisioned and initialized, every machine Running with
// a nodeRef, Ready, Available and UpToDate, the KCP's replicas all ready and
// up to date, and each object's Paused condition True. They stand for the
// bulk of a fleet that a tool lists, selects and reports on, at eight
// objects for a cluster of five machines.
//
// The objects hold what Cluster API's webhooks would have defaulted, so they
// are the same on a bare API server with the CRDs (apiservertest.StartCAPI)
// as on a simulator's management cluster. There, the controllers find the
// finalizers and Paused conditions they would add already in place and write
// nothing; deleting an inert object takes removing its finalizer, as
// deleting a paused cluster's does. The ClusterCaches try to connect to the
// provisioned clusters now and then and fail quietly: there is no kubeconfig
// Secret. Machine names end in KCP's random suffix. The Machines' bootstrap
// and infrastructure references, and the KCP's machine template, name
// objects that do not exist.
//
// Clusters are created concurrently, 32 at a time; c's rate limit (a
// rest.Config's QPS and Burst: envtest's are 1000 and 2000) bounds how fast.
// Names already taken fail the call.
func CreateInertClusters(ctx context.Context, c client.Client, namespace string, clusters, machines int, version string) error {
	switch {
	case clusters < 0:
		return fmt.Errorf("inert clusters: want 0 or more, got %d", clusters)
	case machines < 1:
		return fmt.Errorf("inert clusters: want 1 machine or more each, got %d", machines)
	}
	// The KCP webhook's checks (an odd number of replicas with stacked
	// etcd, a semantic version) apply where no webhook runs too, before
	// anything is created.
	if _, err := inertKCP(namespace, InertClusterName(1), version, machines); err != nil {
		return err
	}
	if clusters == 0 {
		return nil
	}
	if err := ensureNamespace(ctx, c, namespace); err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(inertWorkers)
	for i := 1; i <= clusters; i++ {
		g.Go(func() error {
			return createInertCluster(ctx, c, namespace, InertClusterName(i), version, machines)
		})
	}
	return g.Wait()
}

// createInertCluster creates one inert cluster, owners before what they own
// (the owner references carry their UIDs), each object's status once what
// it counts exists.
func createInertCluster(ctx context.Context, c client.Client, namespace, name, version string, machines int) error {
	now := metav1.Now()
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:  namespace,
			Name:       name,
			Labels:     map[string]string{InertLabel: InertLabelValue},
			Finalizers: []string{clusterv1.ClusterFinalizer},
		},
		Spec: clusterv1.ClusterSpec{
			Paused: ptr.To(true),
			// .invalid never resolves (RFC 2606): there is no API server.
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: name + ".inert.invalid", Port: 6443},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: builder.InfrastructureGroupVersion.Group, Kind: builder.GenericInfrastructureClusterKind, Name: name,
			},
			ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: name + "-control-plane",
			},
		},
	}
	if err := c.Create(ctx, cluster); err != nil {
		return fmt.Errorf("creating inert Cluster %s: %w", name, err)
	}
	// The Cluster controller adds these to the objects a Cluster refers to.
	ownedByCluster := []metav1.OwnerReference{{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID,
	}}
	clusterLabel := map[string]string{clusterv1.ClusterNameLabel: name}

	infraCluster := &unstructured.Unstructured{}
	infraCluster.SetGroupVersionKind(infraClusterGVK)
	infraCluster.SetNamespace(namespace)
	infraCluster.SetName(name)
	infraCluster.SetLabels(clusterLabel)
	infraCluster.SetOwnerReferences(ownedByCluster)
	if err := c.Create(ctx, infraCluster); err != nil {
		return fmt.Errorf("creating the infrastructure cluster of inert cluster %s: %w", name, err)
	}
	provisioned := client.MergeFrom(infraCluster.DeepCopy())
	if err := unstructured.SetNestedField(infraCluster.Object, true, "status", "initialization", "provisioned"); err != nil {
		return err
	}
	if err := c.Status().Patch(ctx, infraCluster, provisioned); err != nil {
		return fmt.Errorf("reporting the infrastructure of inert cluster %s provisioned: %w", name, err)
	}

	kcp, err := inertKCP(namespace, name, version, machines)
	if err != nil {
		return err
	}
	kcp.Labels = clusterLabel
	kcp.OwnerReferences = ownedByCluster
	kcp.Finalizers = []string{controlplanev1.KubeadmControlPlaneFinalizer}
	if err := c.Create(ctx, kcp); err != nil {
		return fmt.Errorf("creating the KubeadmControlPlane of inert cluster %s: %w", name, err)
	}

	for i := 1; i <= machines; i++ {
		if err := createInertMachine(ctx, c, cluster, kcp, fmt.Sprintf("%s-cp-%d", name, i), now); err != nil {
			return err
		}
	}

	replicas := ptr.To(int32(machines))
	versions := []clusterv1.StatusVersion{{Version: version, Replicas: int32(machines)}}
	kcpStatus := client.MergeFrom(kcp.DeepCopy())
	kcp.Status = controlplanev1.KubeadmControlPlaneStatus{
		Initialization:    controlplanev1.KubeadmControlPlaneInitializationStatus{ControlPlaneInitialized: ptr.To(true)},
		Selector:          clusterv1.ClusterNameLabel + "=" + name + "," + clusterv1.MachineControlPlaneLabel,
		Replicas:          replicas,
		ReadyReplicas:     replicas,
		AvailableReplicas: replicas,
		UpToDateReplicas:  replicas,
		Versions:          versions,
		Version:           version,
		// A paused KCP reports no generation it has not seen: this one it has.
		ObservedGeneration: kcp.Generation,
	}
	setConditions(kcp, now, []metav1.Condition{
		condition(clusterv1.AvailableCondition, clusterv1.AvailableReason),
		condition(controlplanev1.KubeadmControlPlaneCertificatesAvailableCondition, clusterv1.AvailableReason),
		condition(controlplanev1.KubeadmControlPlaneInitializedCondition, controlplanev1.KubeadmControlPlaneInitializedReason),
		condition(controlplanev1.KubeadmControlPlaneEtcdClusterHealthyCondition, controlplanev1.KubeadmControlPlaneEtcdClusterHealthyReason),
		condition(controlplanev1.KubeadmControlPlaneControlPlaneComponentsHealthyCondition, controlplanev1.KubeadmControlPlaneControlPlaneComponentsHealthyReason),
		condition(clusterv1.MachinesReadyCondition, clusterv1.ReadyReason),
		condition(clusterv1.MachinesUpToDateCondition, clusterv1.UpToDateReason),
	}, settled())
	if err := c.Status().Patch(ctx, kcp, kcpStatus); err != nil {
		return fmt.Errorf("setting the status of the KubeadmControlPlane of inert cluster %s: %w", name, err)
	}

	clusterStatus := client.MergeFrom(cluster.DeepCopy())
	cluster.Status = clusterv1.ClusterStatus{
		Initialization: clusterv1.ClusterInitializationStatus{
			InfrastructureProvisioned: ptr.To(true),
			ControlPlaneInitialized:   ptr.To(true),
		},
		ControlPlane: &clusterv1.ClusterControlPlaneStatus{
			DesiredReplicas:   replicas,
			Replicas:          replicas,
			UpToDateReplicas:  replicas,
			ReadyReplicas:     replicas,
			AvailableReplicas: replicas,
			Versions:          versions,
		},
		Workers:            &clusterv1.WorkersStatus{},
		Phase:              string(clusterv1.ClusterPhaseProvisioned),
		ObservedGeneration: cluster.Generation,
	}
	setConditions(cluster, now, []metav1.Condition{
		condition(clusterv1.AvailableCondition, clusterv1.AvailableReason),
		condition(clusterv1.ClusterRemoteConnectionProbeCondition, clusterv1.ClusterRemoteConnectionProbeSucceededReason),
		condition(clusterv1.InfrastructureReadyCondition, clusterv1.ReadyReason),
		condition(clusterv1.ClusterControlPlaneInitializedCondition, clusterv1.ClusterControlPlaneInitializedReason),
		condition(clusterv1.ClusterControlPlaneAvailableCondition, clusterv1.AvailableReason),
		condition(clusterv1.ClusterWorkersAvailableCondition, clusterv1.ClusterWorkersAvailableNoWorkersReason),
		condition(clusterv1.ClusterControlPlaneMachinesReadyCondition, clusterv1.ReadyReason),
		condition(clusterv1.ClusterWorkerMachinesReadyCondition, clusterv1.NoReplicasReason),
		condition(clusterv1.ClusterControlPlaneMachinesUpToDateCondition, clusterv1.UpToDateReason),
		condition(clusterv1.ClusterWorkerMachinesUpToDateCondition, clusterv1.NoReplicasReason),
	}, settled())
	if err := c.Status().Patch(ctx, cluster, clusterStatus); err != nil {
		return fmt.Errorf("setting the status of inert Cluster %s: %w", name, err)
	}
	return nil
}

// inertKCP is an inert cluster's KubeadmControlPlane, defaulted and checked
// by the KCP webhook's own code.
func inertKCP(namespace, cluster, version string, machines int) (*controlplanev1.KubeadmControlPlane, error) {
	kcp := userKCP(namespace, cluster, version, int32(machines))
	webhook := &kcpadmission.KubeadmControlPlane{}
	if err := webhook.Default(context.Background(), kcp); err != nil {
		return nil, err
	}
	if _, err := webhook.ValidateCreate(context.Background(), kcp); err != nil {
		return nil, fmt.Errorf("inert clusters: %w", err)
	}
	return kcp, nil
}

// createInertMachine creates one control-plane Machine of an inert cluster as
// KCP's desired state makes it (name, labels, annotations, owner, readiness
// gates), defaulted by the Machine webhook's code, and gives it a healthy
// machine's status on the node named node.
func createInertMachine(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, kcp *controlplanev1.KubeadmControlPlane, node string, now metav1.Time) error {
	m, err := desiredstate.ComputeDesiredMachine(kcp, cluster, "", nil)
	if err != nil {
		return err
	}
	m.Finalizers = []string{clusterv1.MachineFinalizer}
	m.Spec.Bootstrap = clusterv1.Bootstrap{
		ConfigRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: m.Name,
		},
		DataSecretName: ptr.To(m.Name),
	}
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: builder.InfrastructureGroupVersion.Group, Kind: builder.GenericInfrastructureMachineKind, Name: m.Name,
	}
	m.Spec.ProviderID = "sim://" + cluster.Name + "/" + node
	if err := (&coreadmission.Machine{}).Default(ctx, m); err != nil {
		return err
	}
	if err := c.Create(ctx, m); err != nil {
		return fmt.Errorf("creating Machine %s of inert cluster %s: %w", m.Name, cluster.Name, err)
	}

	running := client.MergeFrom(m.DeepCopy())
	healthy := []metav1.Condition{
		condition(clusterv1.AvailableCondition, clusterv1.AvailableReason),
		condition(clusterv1.ReadyCondition, clusterv1.ReadyReason),
		condition(clusterv1.MachineUpToDateCondition, clusterv1.MachineUpToDateReason),
		condition(clusterv1.BootstrapConfigReadyCondition, clusterv1.ReadyReason),
		condition(clusterv1.InfrastructureReadyCondition, clusterv1.ReadyReason),
		condition(clusterv1.MachineNodeHealthyCondition, clusterv1.MachineNodeHealthyReason),
		condition(clusterv1.MachineNodeReadyCondition, clusterv1.MachineNodeReadyReason),
	}
	// KCP's own conditions, one for each of the readiness gates it set.
	kcpReasons := map[string]string{
		controlplanev1.KubeadmControlPlaneMachineNodeKubeadmLabelsAndTaintsSetCondition: controlplanev1.KubeadmControlPlaneMachineNodeKubeadmLabelsAndTaintsSetReason,
		controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition:             controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyReason,
	}
	for _, gate := range m.Spec.ReadinessGates {
		reason, ok := kcpReasons[gate.ConditionType]
		if !ok {
			reason = controlplanev1.KubeadmControlPlaneMachinePodRunningReason
		}
		healthy = append(healthy, condition(gate.ConditionType, reason))
	}
	m.Status = clusterv1.MachineStatus{
		Initialization: clusterv1.MachineInitializationStatus{
			InfrastructureProvisioned:  ptr.To(true),
			BootstrapDataSecretCreated: ptr.To(true),
		},
		NodeRef: clusterv1.MachineNodeReference{Name: node},
		NodeInfo: &corev1.NodeSystemInfo{
			KubeletVersion:          m.Spec.Version,
			OperatingSystem:         "linux",
			Architecture:            "amd64",
			ContainerRuntimeVersion: "containerd://2.0.0",
		},
		LastUpdated:            now,
		Addresses:              clusterv1.MachineAddresses{{Type: clusterv1.MachineHostName, Address: node}},
		Phase:                  string(clusterv1.MachinePhaseRunning),
		CertificatesExpiryDate: metav1.NewTime(now.Add(365 * 24 * time.Hour)),
		ObservedGeneration:     m.Generation,
	}
	setConditions(m, now, healthy, []metav1.Condition{notCondition(clusterv1.MachineUpdatingCondition, clusterv1.MachineNotUpdatingReason)})
	if err := c.Status().Patch(ctx, m, running); err != nil {
		return fmt.Errorf("setting the status of Machine %s of inert cluster %s: %w", m.Name, cluster.Name, err)
	}
	return nil
}

// condition is a condition that is True for reason.
func condition(conditionType, reason string) metav1.Condition {
	return metav1.Condition{Type: conditionType, Status: metav1.ConditionTrue, Reason: reason}
}

// notCondition is a condition that is False for reason.
func notCondition(conditionType, reason string) metav1.Condition {
	return metav1.Condition{Type: conditionType, Status: metav1.ConditionFalse, Reason: reason}
}

// settled is what a Cluster or KCP with nothing under way reports.
func settled() []metav1.Condition {
	return []metav1.Condition{
		notCondition(clusterv1.RollingOutCondition, clusterv1.NotRollingOutReason),
		notCondition(clusterv1.RemediatingCondition, clusterv1.NotRemediatingReason),
		notCondition(clusterv1.ScalingDownCondition, clusterv1.NotScalingDownReason),
		notCondition(clusterv1.ScalingUpCondition, clusterv1.NotScalingUpReason),
	}
}

// setConditions sets the conditions of lists on obj, and what every healthy
// object of a paused cluster reports (not deleting, paused), with Cluster
// API's conditions.Set: its order and the object's generation are what the
// controllers compare with what they would write.
func setConditions(obj conditions.Setter, now metav1.Time, lists ...[]metav1.Condition) {
	paused := condition(clusterv1.PausedCondition, clusterv1.PausedReason)
	paused.Message = inertPausedMessage
	lists = append(lists, []metav1.Condition{notCondition(clusterv1.DeletingCondition, clusterv1.NotDeletingReason), paused})
	for _, l := range lists {
		for _, c := range l {
			c.LastTransitionTime = now
			conditions.Set(obj, c)
		}
	}
}
