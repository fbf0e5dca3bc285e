package sim

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// KCP's work on a rollout does not end with the machines: once all of them
// are up to date and the replica count is met, every reconcile retags the
// kube-proxy DaemonSet to the KCP version and, when the KCP names a CoreDNS
// imageTag or imageRepository that differs from the running one, migrates the
// Corefile and moves the CoreDNS Deployment to that image. Where those
// objects are missing it skips both without a word, so a simulator without
// them would hide whether that last step runs; they are created here as
// kubeadm init leaves them.

const (
	kubeProxyName     = "kube-proxy"
	coreDNSName       = "coredns"
	kubeletConfigName = "kubelet-config"

	kubeProxyImageRepository = "registry.k8s.io/kube-proxy"
	coreDNSImageRepository   = "registry.k8s.io/coredns/coredns"

	// kubeadm's networking defaults (ClusterConfiguration v1beta4); the sim's
	// kubeadm-config leaves networking empty, so these are what kubeadm used.
	dnsDomain    = "cluster.local"
	clusterDNSIP = "10.96.0.10"

	componentConfigHashAnnotation = "kubeadm.kubernetes.io/component-config.hash"
)

// coreDNSVersions is the CoreDNS release kubeadm deploys for each Kubernetes
// minor (cmd/kubeadm/app/constants CoreDNSVersion on the release branch; it
// does not change in patch releases). Every entry is a version the
// corefile-migration library KCP uses knows, so KCP accepts it as the version
// to migrate from.
var coreDNSVersions = []struct {
	minor uint
	tag   string
}{
	{33, "v1.12.0"},
	{34, "v1.12.1"},
	{35, "v1.13.1"},
	{36, "v1.14.2"},
}

// CoreDNSVersion is the CoreDNS image tag kubeadm pairs with a Kubernetes
// version: what kubeadm init deploys, and the dns.imageTag to give a KCP when
// it upgrades to that version. Minors outside the table get the nearest
// entry's.
func CoreDNSVersion(kubernetesVersion string) (string, error) {
	v, err := version.ParseSemantic(kubernetesVersion)
	if err != nil {
		return "", fmt.Errorf("kubernetes version %q: %w", kubernetesVersion, err)
	}
	tag := coreDNSVersions[0].tag
	for _, e := range coreDNSVersions {
		if v.Minor() >= e.minor {
			tag = e.tag
		}
	}
	return tag, nil
}

// kubeProxyImage is the image kubeadm gives kube-proxy: the Kubernetes
// version as tag ("+" is not allowed in a tag, so it becomes "_", as KCP
// writes it too).
func kubeProxyImage(kubernetesVersion string) string {
	return kubeProxyImageRepository + ":" + strings.ReplaceAll(kubernetesVersion, "+", "_")
}

// createAddons creates in the workload cluster what kubeadm init leaves there
// besides kubeadm-config and KCP reads or updates: kube-proxy and CoreDNS
// with their ConfigMaps, the kubelet's base configuration and the
// ClusterRoleBindings KCP ensures before a rollout. Their pods are
// addonPods' (addonpods.go).
func (s *Sim) createAddons(ctx context.Context) error {
	host, port, err := s.workloadEndpoint()
	if err != nil {
		return err
	}
	endpoint := "https://" + net.JoinHostPort(host, strconv.Itoa(int(port)))
	coreDNSTag, err := CoreDNSVersion(s.opts.Version)
	if err != nil {
		return err
	}
	kubeProxyConfigMap, err := kubeProxyConfigMap(endpoint)
	if err != nil {
		return err
	}
	kubeletConfigMap, err := kubeletConfigMap()
	if err != nil {
		return err
	}
	objects := []client.Object{
		kubeProxyConfigMap,
		kubeProxyDaemonSet(kubeProxyImage(s.opts.Version)),
		coreDNSConfigMap(),
		coreDNSDeployment(coreDNSImageRepository + ":" + coreDNSTag),
		kubeletConfigMap,
	}
	bindings, err := kubeadmClusterRoleBindings(s.opts.Version)
	if err != nil {
		return err
	}
	objects = append(objects, bindings...)
	for _, obj := range objects {
		if err := s.workload.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			kind := fmt.Sprintf("%T", obj)
			kind = kind[strings.LastIndex(kind, ".")+1:]
			return fmt.Errorf("creating %s %s: %w", kind, client.ObjectKeyFromObject(obj), err)
		}
	}
	return nil
}

// kubeProxyConfigMap is the ConfigMap kube-proxy's pods mount: its
// KubeProxyConfiguration and a kubeconfig for the control-plane endpoint.
// KCP never reads it (it only retags the DaemonSet's image); it is here
// because the DaemonSet mounts it and tools that inspect kube-proxy read it.
func kubeProxyConfigMap(endpoint string) (*corev1.ConfigMap, error) {
	config, err := yaml.Marshal(map[string]any{
		"apiVersion":  "kubeproxy.config.k8s.io/v1alpha1",
		"kind":        "KubeProxyConfiguration",
		"bindAddress": "0.0.0.0",
		"clientConnection": map[string]any{
			"kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf",
		},
		"clusterCIDR": "",
		"mode":        "",
	})
	if err != nil {
		return nil, err
	}
	kubeconfig, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "Config",
		"clusters": []any{map[string]any{
			"name": "default",
			"cluster": map[string]any{
				"certificate-authority": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
				"server":                endpoint,
			},
		}},
		"contexts": []any{map[string]any{
			"name":    "default",
			"context": map[string]any{"cluster": "default", "namespace": "default", "user": "default"},
		}},
		"current-context": "default",
		"users": []any{map[string]any{
			"name": "default",
			"user": map[string]any{"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"},
		}},
	})
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceSystem,
			Name:      kubeProxyName,
			Labels:    map[string]string{"app": kubeProxyName},
		},
		Data: map[string]string{
			"config.conf":     string(config),
			"kubeconfig.conf": string(kubeconfig),
		},
	}
	signConfigMap(cm)
	return cm, nil
}

// kubeProxyDaemonSet is kube-proxy as kubeadm deploys it. KCP finds the
// container by the name kube-proxy and patches only its image tag (and
// repository, when the KCP sets imageRepository) to the KCP version.
func kubeProxyDaemonSet(image string) *appsv1.DaemonSet {
	labels := map[string]string{"k8s-app": kubeProxyName}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: kubeProxyName, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					PriorityClassName:  "system-node-critical",
					ServiceAccountName: kubeProxyName,
					HostNetwork:        true,
					NodeSelector:       map[string]string{corev1.LabelOSStable: "linux"},
					Tolerations:        []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name:            kubeProxyName,
						Image:           image,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command: []string{
							"/usr/local/bin/kube-proxy",
							"--config=/var/lib/kube-proxy/config.conf",
							"--hostname-override=$(NODE_NAME)",
						},
						Env: []corev1.EnvVar{{
							Name:      "NODE_NAME",
							ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}},
						}},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts: []corev1.VolumeMount{
							{Name: kubeProxyName, MountPath: "/var/lib/kube-proxy"},
							{Name: "xtables-lock", MountPath: "/run/xtables.lock"},
							{Name: "lib-modules", MountPath: "/lib/modules", ReadOnly: true},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: kubeProxyName, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: kubeProxyName},
						}}},
						{Name: "xtables-lock", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
							Path: "/run/xtables.lock", Type: ptr.To(corev1.HostPathFileOrCreate),
						}}},
						{Name: "lib-modules", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
							Path: "/lib/modules",
						}}},
					},
				},
			},
		},
	}
}

// corefile is kubeadm's default Corefile for the default cluster domain. KCP
// parses it with the corefile-migration library when it moves CoreDNS to a
// newer version, so it has to be one that library reads.
const corefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes ` + dnsDomain + ` in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success ` + dnsDomain + `
       disable denial ` + dnsDomain + `
    }
    loop
    reload
    loadbalance
}
`

// coreDNSConfigMap holds the Corefile under the key KCP reads ("Corefile");
// on an upgrade KCP rewrites the ConfigMap with the migrated Corefile and the
// previous one under "Corefile-backup".
func coreDNSConfigMap() *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: coreDNSName},
		Data:       map[string]string{"Corefile": corefile},
	}
}

// coreDNSDeployment is CoreDNS as kubeadm deploys it. KCP reads the image of
// the container named coredns (its tag must parse as a version the migration
// library knows), and switches the config-volume's item between the keys
// Corefile and Corefile-backup while it migrates.
func coreDNSDeployment(image string) *appsv1.Deployment {
	labels := map[string]string{"k8s-app": "kube-dns"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: coreDNSName, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(2)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{
				Type:          appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: ptr.To(intstr.FromInt32(1))},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					PriorityClassName:  "system-cluster-critical",
					ServiceAccountName: coreDNSName,
					DNSPolicy:          corev1.DNSDefault,
					NodeSelector:       map[string]string{corev1.LabelOSStable: "linux"},
					Tolerations: []corev1.Toleration{
						{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists},
						{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule},
					},
					Containers: []corev1.Container{{
						Name:            coreDNSName,
						Image:           image,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Args:            []string{"-conf", "/etc/coredns/Corefile"},
						Ports: []corev1.ContainerPort{
							{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
							{Name: "metrics", ContainerPort: 9153, Protocol: corev1.ProtocolTCP},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "config-volume", MountPath: "/etc/coredns", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{
						Name: "config-volume",
						VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
							LocalObjectReference: corev1.LocalObjectReference{Name: coreDNSName},
							Items:                []corev1.KeyToPath{{Key: "Corefile", Path: "Corefile"}},
						}},
					}},
				},
			},
		},
	}
}

// kubeletConfigMap is the cluster-wide KubeletConfiguration kubeadm init
// stores under the key kubelet. KCP does not read it (kubeadm join and
// upgrade on the machines do); it completes what a kubeadm cluster holds.
func kubeletConfigMap() (*corev1.ConfigMap, error) {
	config, err := yaml.Marshal(map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true, "cacheTTL": "0s"},
			"x509":      map[string]any{"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
		},
		"authorization": map[string]any{
			"mode":    "Webhook",
			"webhook": map[string]any{"cacheAuthorizedTTL": "0s", "cacheUnauthorizedTTL": "0s"},
		},
		"cgroupDriver":       "systemd",
		"clusterDNS":         []string{clusterDNSIP},
		"clusterDomain":      dnsDomain,
		"rotateCertificates": true,
		"staticPodPath":      "/etc/kubernetes/manifests",
	})
	if err != nil {
		return nil, err
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: kubeletConfigName},
		Data:       map[string]string{"kubelet": string(config)},
	}
	signConfigMap(cm)
	return cm, nil
}

// kubeadmClusterRoleBindings are the bindings KCP ensures before each rollout
// step (EnsureKubeadmPermissions: created when missing, left alone when
// present), as kubeadm init of the cluster's version left them:
// kubeadm:cluster-admins since Kubernetes 1.29, and
// kubeadm:apiserver-kubelet-client since the release that introduced it and
// its cherry-picks (1.36.1, 1.35.5). On older patch releases the binding is
// missing until KCP creates it in the first rollout, as on a real cluster.
func kubeadmClusterRoleBindings(kubernetesVersion string) ([]client.Object, error) {
	v, err := version.ParseSemantic(kubernetesVersion)
	if err != nil {
		return nil, fmt.Errorf("kubernetes version %q: %w", kubernetesVersion, err)
	}
	out := []client.Object{&rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:cluster-admins"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "kubeadm:cluster-admins"}},
	}}
	if v.AtLeast(version.MajorMinor(1, 37)) ||
		(v.Minor() == 36 && v.Patch() >= 1) || (v.Minor() == 35 && v.Patch() >= 5) {
		out = append(out, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:apiserver-kubelet-client"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "kube-apiserver-kubelet-client"}},
		})
	}
	return out, nil
}

// signConfigMap adds the checksum kubeadm puts on the component
// configurations it generated, by which kubeadm upgrade tells them from ones
// a user edited: sha256 over the values in key order.
func signConfigMap(cm *corev1.ConfigMap) {
	keys := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha256.New()
	for _, k := range keys {
		h.Write([]byte(cm.Data[k]))
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[componentConfigHashAnnotation] = fmt.Sprintf("sha256:%x", h.Sum(nil))
}
