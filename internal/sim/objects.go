package sim

import (
	"context"
	"fmt"
	"maps"
	"net"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
	"sigs.k8s.io/cluster-api/util/test/builder"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
)

const (
	// KCPControllerNamespace and KCPControllerDeployment are where clusterctl
	// installs the kubeadm control plane provider; the tool reads the image of
	// that Deployment to learn which KCP version runs.
	KCPControllerNamespace  = "capi-kubeadm-control-plane-system"
	KCPControllerDeployment = "capi-kubeadm-control-plane-controller-manager"
	// inProcessCAPIVersion is the Cluster API release whose controllers run
	// in-process: the one this module links.
	inProcessCAPIVersion = "v1.14.2"

	coreControllerNamespace  = "capi-system"
	coreControllerDeployment = "capi-controller-manager"
)

// infraTemplateName names the control plane's infrastructure machine
// template, as userKCP refers to it.
func (s *Sim) infraTemplateName() string { return s.opts.ClusterName + "-control-plane" }

// workloadEndpoint is the workload API server's host and port, the Cluster's
// controlPlaneEndpoint.
func (s *Sim) workloadEndpoint() (string, int32, error) {
	u := s.workloadEnv.ControlPlane.APIServer.SecureServing
	port, err := strconv.Atoi(u.Port)
	if err != nil {
		return "", 0, fmt.Errorf("workload API server port %q: %w", u.Port, err)
	}
	host := u.Address
	if host == "" || net.ParseIP(host) == nil {
		host = "127.0.0.1"
	}
	return host, int32(port), nil
}

// createManagementObjects creates what clusterctl and a cluster template would
// have created: the provider Deployments, the Cluster with its control plane
// (a KCP, or with Options.Topology a ClusterClass the topology controller
// makes the KCP from), the certificate and kubeconfig Secrets, the workers
// and the MachineHealthCheck. The KCP is paused before it can act, so that
// it leaves the initial machines to createInitialMachines.
func (s *Sim) createManagementObjects(ctx context.Context) error {
	c := s.mgmt
	if err := ensureNamespace(ctx, c, s.opts.Namespace); err != nil {
		return err
	}
	if err := s.createProviderDeployments(ctx); err != nil {
		return err
	}
	if err := s.createInfraTemplate(ctx, builder.GenericInfrastructureMachineTemplateKind, s.infraTemplateName()); err != nil {
		return err
	}

	host, port, err := s.workloadEndpoint()
	if err != nil {
		return err
	}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.opts.ClusterName, Labels: maps.Clone(s.opts.Labels)},
		Spec:       clusterv1.ClusterSpec{ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: host, Port: port}},
	}
	if s.opts.Topology {
		if err := s.createClusterClass(ctx); err != nil {
			return err
		}
		cluster.Spec.Topology = s.topology()
	} else {
		infraCluster := &unstructured.Unstructured{}
		infraCluster.SetGroupVersionKind(infraClusterGVK)
		infraCluster.SetNamespace(s.opts.Namespace)
		infraCluster.SetName(s.opts.ClusterName)
		if err := c.Create(ctx, infraCluster); err != nil {
			return fmt.Errorf("creating the infrastructure cluster: %w", err)
		}
		cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
			APIGroup: builder.InfrastructureGroupVersion.Group, Kind: builder.GenericInfrastructureClusterKind, Name: s.opts.ClusterName,
		}
		cluster.Spec.ControlPlaneRef = clusterv1.ContractVersionedObjectReference{
			APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: s.opts.ClusterName + "-control-plane",
		}
	}
	if err := c.Create(ctx, cluster); err != nil {
		return fmt.Errorf("creating the Cluster: %w", err)
	}

	// The kubeconfig Secret is a user-provided one (type Opaque), so KCP
	// neither adopts nor rotates it: its credentials are envtest's admin user
	// for the workload API server, not certificates from <cluster>-ca.
	kubeconfig := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.opts.Namespace,
			Name:      secret.Name(s.opts.ClusterName, secret.Kubeconfig),
			Labels:    map[string]string{clusterv1.ClusterNameLabel: s.opts.ClusterName},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: clusterv1.GroupVersion.String(),
				Kind:       "Cluster",
				Name:       cluster.Name,
				UID:        cluster.UID,
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{secret.KubeconfigDataName: s.workloadEnv.KubeConfig},
	}
	if err := c.Create(ctx, kubeconfig); err != nil {
		return fmt.Errorf("creating the kubeconfig Secret: %w", err)
	}

	kcp, err := s.pausedKCP(ctx)
	if err != nil {
		return err
	}
	s.kcpName = kcp.Name

	// KCP generates the cluster certificates on its first reconcile and owns
	// them; doing it here with the same code lets the initial machines and
	// etcd members exist before KCP runs (and when it does not run at all).
	owner := *metav1.NewControllerRef(kcp, controlplanev1.GroupVersion.WithKind("KubeadmControlPlane"))
	certificates := secret.NewCertificatesForInitialControlPlane(&kcp.Spec.KubeadmConfigSpec.ClusterConfiguration)
	if err := certificates.Generate(); err != nil {
		return fmt.Errorf("generating cluster certificates: %w", err)
	}
	if err := certificates.SaveGenerated(ctx, c, s.ClusterKey(), owner); err != nil {
		return fmt.Errorf("saving cluster certificates: %w", err)
	}

	if s.opts.Workers > 0 && !s.opts.Topology {
		if err := s.createWorkers(ctx); err != nil {
			return err
		}
	}
	if !s.opts.WithoutMachineHealthCheck {
		if err := c.Create(ctx, s.controlPlaneHealthCheck()); err != nil {
			return fmt.Errorf("creating the control plane's MachineHealthCheck: %w", err)
		}
	}
	return nil
}

// pausedKCP is the Cluster's KubeadmControlPlane, paused: created so, or,
// on a topology cluster, as the topology controller created it, paused at
// once. KCP cannot act before: it waits for the infrastructure, which the
// simulated provider, not yet started, provisions.
func (s *Sim) pausedKCP(ctx context.Context) (*controlplanev1.KubeadmControlPlane, error) {
	if !s.opts.Topology {
		kcp := s.desiredKCP()
		if err := s.mgmt.Create(ctx, kcp); err != nil {
			return nil, fmt.Errorf("creating the KubeadmControlPlane: %w", err)
		}
		return kcp, nil
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	for {
		cluster := &clusterv1.Cluster{}
		if err := s.mgmt.Get(ctx, s.ClusterKey(), cluster); err != nil {
			return nil, err
		}
		if ref := cluster.Spec.ControlPlaneRef; ref.IsDefined() {
			err := s.mgmt.Get(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: ref.Name}, kcp)
			if err == nil {
				break
			}
			if !apierrors.IsNotFound(err) {
				return nil, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the topology controller to create the KubeadmControlPlane: %w", context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
	patch := client.MergeFrom(kcp.DeepCopy())
	if kcp.Annotations == nil {
		kcp.Annotations = map[string]string{}
	}
	kcp.Annotations[clusterv1.PausedAnnotation] = ""
	if err := s.mgmt.Patch(ctx, kcp, patch); err != nil {
		return nil, fmt.Errorf("pausing the KubeadmControlPlane: %w", err)
	}
	return kcp, nil
}

// createInfraTemplate creates a template of the generic infrastructure
// provider: a machine template carries the simulator's machine image
// (Options.Image, see ImageField), a cluster template nothing.
func (s *Sim) createInfraTemplate(ctx context.Context, kind, name string) error {
	spec := map[string]any{}
	if kind == builder.GenericInfrastructureMachineTemplateKind {
		spec["image"] = s.opts.Image
	}
	return createInfraTemplate(ctx, s.mgmt, s.opts.Namespace, kind, name, spec)
}

// CreateInfraTemplate creates a GenericInfrastructureMachineTemplate name in
// the Cluster's namespace whose machines boot image, as a user prepares the
// template of a new machine image before pointing the KCP at it. A machine
// cloned from it reports image as its Node's status.nodeInfo.osImage.
func (s *Sim) CreateInfraTemplate(ctx context.Context, name, image string) error {
	return createInfraTemplate(ctx, s.mgmt, s.opts.Namespace, builder.GenericInfrastructureMachineTemplateKind, name, map[string]any{"image": image})
}

func createInfraTemplate(ctx context.Context, c client.Client, namespace, kind, name string, spec map[string]any) error {
	t := &unstructured.Unstructured{}
	t.SetGroupVersionKind(builder.InfrastructureGroupVersion.WithKind(kind))
	t.SetNamespace(namespace)
	t.SetName(name)
	if err := unstructured.SetNestedMap(t.Object, map[string]any{"spec": spec}, "spec", "template"); err != nil {
		return err
	}
	if err := c.Create(ctx, t); err != nil {
		return fmt.Errorf("creating %s %s: %w", kind, name, err)
	}
	return nil
}

// workerClass is the ClusterClass's one MachineDeployment class.
const workerClass = "default-worker"

// className names the ClusterClass of a topology cluster.
func (s *Sim) className() string { return s.opts.ClusterName + "-class" }

// createClusterClass creates a ClusterClass and its templates as a
// ClusterClass author would: the infrastructure cluster, the KCP and its
// machines, and one worker class.
func (s *Sim) createClusterClass(ctx context.Context) error {
	name := s.className()
	if err := s.createInfraTemplate(ctx, builder.GenericInfrastructureClusterTemplateKind, name); err != nil {
		return err
	}
	if err := s.createInfraTemplate(ctx, builder.GenericInfrastructureMachineTemplateKind, s.workersName()); err != nil {
		return err
	}
	kcpTemplate := &controlplanev1.KubeadmControlPlaneTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: name},
		Spec: controlplanev1.KubeadmControlPlaneTemplateSpec{Template: controlplanev1.KubeadmControlPlaneTemplateResource{
			Spec: controlplanev1.KubeadmControlPlaneTemplateResourceSpec{KubeadmConfigSpec: s.desiredKCP().Spec.KubeadmConfigSpec},
		}},
	}
	if err := s.mgmt.Create(ctx, kcpTemplate); err != nil {
		return fmt.Errorf("creating the KubeadmControlPlaneTemplate: %w", err)
	}
	bootstrap := &bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.workersName()}}
	if err := s.mgmt.Create(ctx, bootstrap); err != nil {
		return fmt.Errorf("creating the workers' KubeadmConfigTemplate: %w", err)
	}
	ref := func(apiVersion, kind, name string) clusterv1.ClusterClassTemplateReference {
		return clusterv1.ClusterClassTemplateReference{APIVersion: apiVersion, Kind: kind, Name: name}
	}
	infraVersion := builder.InfrastructureGroupVersion.String()
	class := &clusterv1.ClusterClass{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: name},
		Spec: clusterv1.ClusterClassSpec{
			Infrastructure: clusterv1.InfrastructureClass{TemplateRef: ref(infraVersion, builder.GenericInfrastructureClusterTemplateKind, name)},
			ControlPlane: clusterv1.ControlPlaneClass{
				TemplateRef: ref(controlplanev1.GroupVersion.String(), "KubeadmControlPlaneTemplate", name),
				MachineInfrastructure: clusterv1.ControlPlaneClassMachineInfrastructureTemplate{
					TemplateRef: ref(infraVersion, builder.GenericInfrastructureMachineTemplateKind, s.infraTemplateName()),
				},
			},
			Workers: clusterv1.WorkersClass{MachineDeployments: []clusterv1.MachineDeploymentClass{{
				Class:          workerClass,
				Bootstrap:      clusterv1.MachineDeploymentClassBootstrapTemplate{TemplateRef: ref(bootstrapv1.GroupVersion.String(), "KubeadmConfigTemplate", s.workersName())},
				Infrastructure: clusterv1.MachineDeploymentClassInfrastructureTemplate{TemplateRef: ref(infraVersion, builder.GenericInfrastructureMachineTemplateKind, s.workersName())},
			}}},
			KubernetesVersions: s.opts.ClassVersions,
		},
	}
	if err := s.mgmt.Create(ctx, class); err != nil {
		return fmt.Errorf("creating the ClusterClass: %w", err)
	}
	return nil
}

// topology is the Cluster's managed topology: the version, the control
// plane's replicas and, with workers, one MachineDeployment md-0.
func (s *Sim) topology() clusterv1.Topology {
	t := clusterv1.Topology{
		ClassRef:     clusterv1.ClusterClassRef{Name: s.className()},
		Version:      s.opts.Version,
		ControlPlane: clusterv1.ControlPlaneTopology{Replicas: ptr.To(s.opts.Replicas)},
	}
	if s.opts.Workers > 0 {
		t.Workers.MachineDeployments = []clusterv1.MachineDeploymentTopology{{Class: workerClass, Name: "md-0", Replicas: ptr.To(s.opts.Workers)}}
	}
	return t
}

// desiredKCP is the KubeadmControlPlane as a user would write it; its
// webhook adds the defaults. It starts paused (see createInitialMachines).
func (s *Sim) desiredKCP() *controlplanev1.KubeadmControlPlane {
	kcp := userKCP(s.opts.Namespace, s.opts.ClusterName, s.opts.Version, s.opts.Replicas)
	kcp.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	return kcp
}

// userKCP is a cluster's KubeadmControlPlane <cluster>-control-plane as a
// cluster template holds it, its machines made from the generic
// infrastructure template <cluster>-control-plane.
func userKCP(namespace, cluster, version string, replicas int32) *controlplanev1.KubeadmControlPlane {
	return &controlplanev1.KubeadmControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: cluster + "-control-plane"},
		Spec: controlplanev1.KubeadmControlPlaneSpec{
			Replicas: ptr.To(replicas),
			Version:  version,
			MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{
				Spec: controlplanev1.KubeadmControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: builder.InfrastructureGroupVersion.Group,
						Kind:     builder.GenericInfrastructureMachineTemplateKind,
						Name:     cluster + "-control-plane",
					},
				},
			},
			KubeadmConfigSpec: bootstrapv1.KubeadmConfigSpec{
				ClusterConfiguration: bootstrapv1.ClusterConfiguration{
					CertificatesDir: "/etc/kubernetes/pki",
				},
			},
		},
	}
}

// createProviderDeployments creates the Deployments clusterctl would install
// for the controllers that run in-process. Nothing runs their pods (the
// management cluster has no nodes); their status says they are available when
// the controller runs.
func (s *Sim) createProviderDeployments(ctx context.Context) error {
	kcpReplicas := int32(1)
	if s.opts.WithoutKCP {
		kcpReplicas = 0
	}
	for _, d := range []struct {
		namespace, name, provider, image string
		replicas                         int32
	}{
		{coreControllerNamespace, coreControllerDeployment, "cluster-api", "registry.k8s.io/cluster-api/cluster-api-controller:" + s.CAPIVersion(), 1},
		{KCPControllerNamespace, KCPControllerDeployment, "control-plane-kubeadm", "registry.k8s.io/cluster-api/kubeadm-control-plane-controller:" + s.CAPIVersion(), kcpReplicas},
	} {
		if err := ensureNamespace(ctx, s.mgmt, d.namespace); err != nil {
			return err
		}
		labels := map[string]string{
			"cluster.x-k8s.io/provider": d.provider,
			"control-plane":             "controller-manager",
		}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: d.namespace, Name: d.name, Labels: labels},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To(d.replicas),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name:    "manager",
						Image:   d.image,
						Command: []string{"/manager"},
					}}},
				},
			},
		}
		if err := s.mgmt.Create(ctx, dep); apierrors.IsAlreadyExists(err) && s.opts.Management != nil {
			continue // another simulator on the shared management cluster made it
		} else if err != nil {
			return fmt.Errorf("creating Deployment %s/%s: %w", d.namespace, d.name, err)
		}
		dep.Status = appsv1.DeploymentStatus{
			ObservedGeneration: dep.Generation,
			Replicas:           d.replicas,
			UpdatedReplicas:    d.replicas,
			ReadyReplicas:      d.replicas,
			AvailableReplicas:  d.replicas,
		}
		if err := s.mgmt.Status().Update(ctx, dep); err != nil {
			return fmt.Errorf("setting status of Deployment %s/%s: %w", d.namespace, d.name, err)
		}
	}
	return nil
}

// createWorkloadObjects creates what kubeadm init leaves in the workload
// cluster and KCP reads or updates during a rollout.
func (s *Sim) createWorkloadObjects(ctx context.Context) error {
	host, port, err := s.workloadEndpoint()
	if err != nil {
		return err
	}
	clusterConfig := map[string]any{
		"apiVersion":           "kubeadm.k8s.io/v1beta4",
		"kind":                 "ClusterConfiguration",
		"kubernetesVersion":    s.opts.Version,
		"controlPlaneEndpoint": net.JoinHostPort(host, strconv.Itoa(int(port))),
		"certificatesDir":      "/etc/kubernetes/pki",
		"etcd":                 map[string]any{"local": map[string]any{"dataDir": "/var/lib/etcd"}},
	}
	data, err := yaml.Marshal(clusterConfig)
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kubeadm-config"},
		Data:       map[string]string{"ClusterConfiguration": string(data)},
	}
	if err := s.workload.Create(ctx, cm); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating kube-system/kubeadm-config: %w", err)
	}
	return nil
}

// workersName names the workers' MachineDeployment and its templates.
func (s *Sim) workersName() string { return s.opts.ClusterName + "-md-0" }

// createWorkers creates what a cluster template holds for one pool of
// workers: the MachineDeployment and the bootstrap and infrastructure
// templates its machines are made from.
func (s *Sim) createWorkers(ctx context.Context) error {
	name := s.workersName()
	if err := s.createInfraTemplate(ctx, builder.GenericInfrastructureMachineTemplateKind, name); err != nil {
		return err
	}
	bootstrap := &bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: name}}
	if err := s.mgmt.Create(ctx, bootstrap); err != nil {
		return fmt.Errorf("creating the workers' KubeadmConfigTemplate: %w", err)
	}
	md := &clusterv1.MachineDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: name},
		Spec: clusterv1.MachineDeploymentSpec{
			ClusterName: s.opts.ClusterName,
			Replicas:    ptr.To(s.opts.Workers),
			Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
				ClusterName: s.opts.ClusterName,
				Version:     s.opts.Version,
				Bootstrap: clusterv1.Bootstrap{ConfigRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfigTemplate", Name: name,
				}},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: builder.InfrastructureGroupVersion.Group, Kind: builder.GenericInfrastructureMachineTemplateKind, Name: name,
				},
			}},
		},
	}
	if err := s.mgmt.Create(ctx, md); err != nil {
		return fmt.Errorf("creating the workers' MachineDeployment: %w", err)
	}
	return nil
}

// controlPlaneHealthCheck is the MachineHealthCheck Cluster API's
// documentation gives for a KCP control plane: a machine whose node has not
// been Ready for 5 minutes is unhealthy, and KCP remediates it (one at a
// time, only while etcd keeps quorum). While the tool holds KCP paused,
// nothing remediates, but the check still marks the machine.
func (s *Sim) controlPlaneHealthCheck() *clusterv1.MachineHealthCheck {
	notReadyFor5m := func(status corev1.ConditionStatus) clusterv1.UnhealthyNodeCondition {
		return clusterv1.UnhealthyNodeCondition{Type: corev1.NodeReady, Status: status, TimeoutSeconds: ptr.To(int32(300))}
	}
	return &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.opts.ClusterName + "-control-plane-unhealthy-5m"},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: s.opts.ClusterName,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}},
			Checks: clusterv1.MachineHealthCheckChecks{
				UnhealthyNodeConditions: []clusterv1.UnhealthyNodeCondition{notReadyFor5m(corev1.ConditionUnknown), notReadyFor5m(corev1.ConditionFalse)},
			},
			Remediation: clusterv1.MachineHealthCheckRemediation{
				TriggerIf: clusterv1.MachineHealthCheckRemediationTriggerIf{UnhealthyLessThanOrEqualTo: ptr.To(intstr.FromString("100%"))},
			},
		},
	}
}

// resumeKCP hands the control plane to KCP once its initial machines exist.
// KCP then reports it initialized (it finds kubeadm's ConfigMap in the
// workload cluster), the Cluster controller copies that, and only then does
// the Machine controller look for the machines' nodes. Without the KCP
// controller, the simulator reports what KCP would.
func (s *Sim) resumeKCP(ctx context.Context) error {
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := s.mgmt.Get(ctx, s.KCPKey(), kcp); err != nil {
		return err
	}
	patch := client.MergeFrom(kcp.DeepCopy())
	delete(kcp.Annotations, clusterv1.PausedAnnotation)
	if err := s.mgmt.Patch(ctx, kcp, patch); err != nil {
		return fmt.Errorf("resuming the KubeadmControlPlane: %w", err)
	}
	if !s.opts.WithoutKCP {
		return nil
	}
	patch = client.MergeFrom(kcp.DeepCopy())
	kcp.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	if err := s.mgmt.Status().Patch(ctx, kcp, patch); err != nil {
		return fmt.Errorf("reporting the control plane initialized: %w", err)
	}
	return nil
}

// createInitialMachines creates the KCP's replicas with the tool's own
// controlplane.CreateMachine — KCP's desiredstate for the InfraMachine,
// KubeadmConfig (init for the first, join for the rest) and Machine, applied
// with KCP's field owner, exactly as KCP's cloneConfigsAndGenerateMachine —
// but all at once, while KCP is paused: KCP would add them one by one, each
// waiting for the previous one to be healthy, which makes start-up several
// times slower without testing anything the tool does.
func (s *Sim) createInitialMachines(ctx context.Context) error {
	cluster := &clusterv1.Cluster{}
	if err := s.mgmt.Get(ctx, s.ClusterKey(), cluster); err != nil {
		return err
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := s.mgmt.Get(ctx, s.KCPKey(), kcp); err != nil {
		return err
	}
	cp := controlplane.New(s.mgmt, s.opts.Namespace, s.opts.ClusterName)
	domains := s.failureDomains()
	for i := int32(0); i < s.opts.Replicas; i++ {
		// Round robin over the domains is where KCP's scale-up would put
		// them one by one: always in the domain with the fewest machines,
		// ties to the first by name.
		fd := ""
		if len(domains) > 0 {
			fd = domains[int(i)%len(domains)].Name
		}
		if _, err := cp.CreateMachine(ctx, kcp, cluster, fd, i > 0); err != nil {
			return err
		}
	}
	return nil
}

// failureDomains are the control-plane failure domains fd-1 ... fd-N that the
// infrastructure cluster reports.
func (s *Sim) failureDomains() []clusterv1.FailureDomain {
	var out []clusterv1.FailureDomain
	for i := 1; i <= s.opts.FailureDomains; i++ {
		out = append(out, clusterv1.FailureDomain{Name: fmt.Sprintf("fd-%d", i), ControlPlane: ptr.To(true)})
	}
	return out
}

func ensureNamespace(ctx context.Context, c client.Client, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

var (
	infraMachineGVK = builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureMachineKind)
	infraClusterGVK = builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureClusterKind)
)
