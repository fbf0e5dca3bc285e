package sim

import (
	"context"
	"fmt"
	"net"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpadmission "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"
	"sigs.k8s.io/cluster-api/util/conditions"
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
	// KCPControllerImage is the image of the KCP controller that runs in-process.
	KCPControllerImage = "registry.k8s.io/cluster-api/kubeadm-control-plane-controller:v1.14.2"

	coreControllerNamespace  = "capi-system"
	coreControllerDeployment = "capi-controller-manager"
	coreControllerImage      = "registry.k8s.io/cluster-api/cluster-api-controller:v1.14.2"

	// defaultNodeDeletionTimeoutSeconds is what the Machine webhook defaults
	// spec.deletion.nodeDeletionTimeoutSeconds to; no webhook runs here.
	defaultNodeDeletionTimeoutSeconds = int32(10)
)

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
// have created: the provider Deployments, the Cluster with its KCP and machine
// template, the certificate and kubeconfig Secrets.
func (s *Sim) createManagementObjects(ctx context.Context) error {
	c := s.mgmt
	if err := ensureNamespace(ctx, c, s.opts.Namespace); err != nil {
		return err
	}
	if err := s.createProviderDeployments(ctx); err != nil {
		return err
	}

	infraCluster := &unstructured.Unstructured{}
	infraCluster.SetGroupVersionKind(builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureClusterKind))
	infraCluster.SetNamespace(s.opts.Namespace)
	infraCluster.SetName(s.opts.ClusterName)
	if err := c.Create(ctx, infraCluster); err != nil {
		return fmt.Errorf("creating the infrastructure cluster: %w", err)
	}
	if err := unstructured.SetNestedField(infraCluster.Object, true, "status", "initialization", "provisioned"); err != nil {
		return err
	}
	if domains := s.failureDomains(); len(domains) > 0 {
		var list []any
		for _, fd := range domains {
			list = append(list, map[string]any{"name": fd.Name, "controlPlane": true})
		}
		if err := unstructured.SetNestedSlice(infraCluster.Object, list, "status", "failureDomains"); err != nil {
			return err
		}
	}
	if err := c.Status().Update(ctx, infraCluster); err != nil {
		return fmt.Errorf("marking the infrastructure cluster provisioned: %w", err)
	}

	template := &unstructured.Unstructured{}
	template.SetGroupVersionKind(builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureMachineTemplateKind))
	template.SetNamespace(s.opts.Namespace)
	template.SetName(s.infraTemplateName())
	if err := unstructured.SetNestedMap(template.Object, map[string]any{"spec": map[string]any{}}, "spec", "template"); err != nil {
		return err
	}
	if err := c.Create(ctx, template); err != nil {
		return fmt.Errorf("creating the infrastructure machine template: %w", err)
	}

	host, port, err := s.workloadEndpoint()
	if err != nil {
		return err
	}
	cluster := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.opts.ClusterName},
		Spec: clusterv1.ClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: host, Port: port},
			ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: controlplanev1.GroupVersion.Group,
				Kind:     "KubeadmControlPlane",
				Name:     s.kcpName(),
			},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: builder.InfrastructureGroupVersion.Group,
				Kind:     builder.GenericInfrastructureClusterKind,
				Name:     s.opts.ClusterName,
			},
		},
	}
	if err := c.Create(ctx, cluster); err != nil {
		return fmt.Errorf("creating the Cluster: %w", err)
	}

	kcp := s.desiredKCP()
	if err := c.Create(ctx, kcp); err != nil {
		return fmt.Errorf("creating the KubeadmControlPlane: %w", err)
	}

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
	return nil
}

// desiredKCP is the KubeadmControlPlane as a user would write it, with the
// defaults its webhook would add (no webhooks run in the simulator).
func (s *Sim) desiredKCP() *controlplanev1.KubeadmControlPlane {
	kcp := &controlplanev1.KubeadmControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: s.kcpName()},
		Spec: controlplanev1.KubeadmControlPlaneSpec{
			Replicas: ptr.To(s.opts.Replicas),
			Version:  s.opts.Version,
			MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{
				Spec: controlplanev1.KubeadmControlPlaneMachineTemplateSpec{
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: builder.InfrastructureGroupVersion.Group,
						Kind:     builder.GenericInfrastructureMachineTemplateKind,
						Name:     s.infraTemplateName(),
					},
					// KCP copies this onto every Machine it creates; setting it here
					// stands in for the Machine webhook's default on those machines.
					Deletion: controlplanev1.KubeadmControlPlaneMachineTemplateDeletionSpec{
						NodeDeletionTimeoutSeconds: ptr.To(defaultNodeDeletionTimeoutSeconds),
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
	_ = (&kcpadmission.KubeadmControlPlane{}).Default(context.Background(), kcp)
	return kcp
}

// ValidateKCP runs the KubeadmControlPlane webhook's validation, which no
// webhook server enforces in the simulator: tests call it on what they write.
func ValidateKCP(ctx context.Context, oldKCP, newKCP *controlplanev1.KubeadmControlPlane) error {
	v := &kcpadmission.KubeadmControlPlane{}
	var err error
	if oldKCP == nil {
		_, err = v.ValidateCreate(ctx, newKCP)
	} else {
		_, err = v.ValidateUpdate(ctx, oldKCP, newKCP)
	}
	return err
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
		{coreControllerNamespace, coreControllerDeployment, "cluster-api", coreControllerImage, 1},
		{KCPControllerNamespace, KCPControllerDeployment, "control-plane-kubeadm", KCPControllerImage, kcpReplicas},
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

// markClusterInitialized does what the Cluster controller (not run here) would
// do once the infrastructure and the first control-plane machine are up. The
// Machine controller only sets nodeRefs for an initialized Cluster, and the
// ClusterCache connects only then; the kubeconfig Secret already exists, so
// the first connection succeeds rather than waiting 30 s for a retry.
func (s *Sim) markClusterInitialized(ctx context.Context) error {
	cluster := &clusterv1.Cluster{}
	if err := s.mgmt.Get(ctx, s.ClusterKey(), cluster); err != nil {
		return err
	}
	patch := client.MergeFrom(cluster.DeepCopy())
	cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	cluster.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	cluster.Status.FailureDomains = s.failureDomains() // copied from the infrastructure cluster
	conditions.Set(cluster, metav1.Condition{
		Type:   clusterv1.ClusterControlPlaneInitializedCondition,
		Status: metav1.ConditionTrue,
		Reason: clusterv1.ClusterControlPlaneInitializedReason,
	})
	if err := s.mgmt.Status().Patch(ctx, cluster, patch); err != nil {
		return fmt.Errorf("marking the Cluster initialized: %w", err)
	}

	// The Cluster controller also makes the Cluster an owner of its control
	// plane and labels it; KCP waits for that owner reference.
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := s.mgmt.Get(ctx, s.KCPKey(), kcp); err != nil {
		return err
	}
	kcpPatch := client.MergeFrom(kcp.DeepCopy())
	kcp.OwnerReferences = append(kcp.OwnerReferences, metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(),
		Kind:       "Cluster",
		Name:       cluster.Name,
		UID:        cluster.UID,
	})
	if kcp.Labels == nil {
		kcp.Labels = map[string]string{}
	}
	kcp.Labels[clusterv1.ClusterNameLabel] = cluster.Name
	if err := s.mgmt.Patch(ctx, kcp, kcpPatch); err != nil {
		return fmt.Errorf("making the Cluster own its KubeadmControlPlane: %w", err)
	}
	return nil
}

// createInitialMachines creates the KCP's replicas with the tool's own
// controlplane.CreateMachine — KCP's desiredstate for the InfraMachine,
// KubeadmConfig (init for the first, join for the rest) and Machine, applied
// with KCP's field owner, exactly as KCP's cloneConfigsAndGenerateMachine —
// but all at once: KCP would add them one by one, each waiting for the
// previous one to be healthy, which makes start-up several times slower
// without testing anything the tool does.
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

var infraMachineGVK = builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureMachineKind)
