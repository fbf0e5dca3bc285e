package sim_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	kcpstate "sigs.k8s.io/cluster-api/controlplane/kubeadm/pkg"
	"sigs.k8s.io/cluster-api/util/collections"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/test/builder"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// TestEveryRolloutChangeIsVisibleToKCP: each change KCP rolls out, made on
// the simulator as a user makes it, makes KCP's own UpToDate (through
// NewControlPlane, as the tool decides) call exactly the machines it should
// outdated, and the simulator shows what the change is about: a machine's
// image on its Node, its certificate expiry where KCP records it. KCP runs
// for the certificate records (it writes them) and is paused for the spec
// changes, so that it leaves the machines to the test.
func TestEveryRolloutChangeIsVisibleToKCP(t *testing.T) {
	t.Parallel()
	s := simtest.Start(t, sim.Options{Replicas: 3, ProvisionDelay: 200 * time.Millisecond, DeleteDelay: 200 * time.Millisecond}).Sim
	ctx := context.Background()
	c, w := s.ManagementClient(), s.WorkloadClient()
	machines, err := s.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, m := range machines {
		all = append(all, m.Name)
	}
	initialImage := "sim-image-" + s.Options().Version

	t.Run("each machine boots the image its template names", func(t *testing.T) {
		for _, m := range machines {
			assertImage(t, s, &m, initialImage)
		}
	})

	served := s.APIServerCertificateExpiry().UTC().Format(time.RFC3339)
	victim, bystander := machines[0], machines[1]

	t.Run("KCP records the served certificate's expiry and keeps a recorded one", func(t *testing.T) {
		for _, m := range machines {
			awaitCertificatesExpiry(t, c, &m, served)
		}

		setFault(t, c, &victim, "certs-expire-in=10d")
		awaitApplied(t, c, &victim, "certs-expire-in=10d")
		recorded := kubeadmConfigOf(t, c, &victim).Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation]
		expiry, err := time.Parse(time.RFC3339, recorded)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(expiry); d > 10*24*time.Hour || d < 10*24*time.Hour-time.Minute {
			t.Fatalf("recorded expiry %s is %s away, want 10 days", recorded, d)
		}
		// The Machine controller copies the record, as it does KCP's.
		awaitMachineCertificatesExpiry(t, c, &victim, expiry)

		// KCP re-records a removed expiry; once it has re-recorded the
		// bystander's, written after the fault, it has reconciled with the
		// fault's record in its cache, and skipped it.
		config := kubeadmConfigOf(t, c, &bystander)
		removal := sim.AnnotationPatch(clusterv1.MachineCertificatesExpiryDateAnnotation, "")
		if err := c.Patch(ctx, config, client.RawPatch(types.MergePatchType, removal)); err != nil {
			t.Fatal(err)
		}
		awaitCertificatesExpiry(t, c, &bystander, served)
		if got := kubeadmConfigOf(t, c, &victim).Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation]; got != recorded {
			t.Fatalf("KCP overwrote the recorded expiry %s with %s", recorded, got)
		}
	})

	pauseKCP(t, c, s.KCPKey())
	needingRollout := func(t *testing.T, want []string, reason string) {
		t.Helper()
		awaitNeedingRollout(t, s, want, reason)
	}
	t.Run("nothing to roll out on the simulator as it starts", func(t *testing.T) {
		needingRollout(t, nil, "")
	})

	t.Run("certificates within rollout.before.certificatesExpiryDays: that machine", func(t *testing.T) {
		patchKCP(t, c, s.KCPKey(), func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.Rollout.Before.CertificatesExpiryDays = 21
		})
		needingRollout(t, []string{victim.Name}, "Certificates will expire soon")
		// A later expiry, asked for over the first, is beyond the window.
		setFault(t, c, &victim, "certs-expire-in=30d")
		awaitApplied(t, c, &victim, "certs-expire-in=30d")
		needingRollout(t, nil, "")
		setFault(t, c, &victim, "certs-expire-in=0")
		awaitApplied(t, c, &victim, "certs-expire-in=0")
		needingRollout(t, []string{victim.Name}, "Certificates will expire soon")

		// The undo records the served certificate's expiry, as KCP does,
		// while KCP is paused and records nothing.
		setFault(t, c, &victim, "")
		awaitApplied(t, c, &victim, "")
		awaitCertificatesExpiry(t, c, &victim, served)
		needingRollout(t, nil, "")
		patchKCP(t, c, s.KCPKey(), func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.Rollout.Before.CertificatesExpiryDays = 0
		})
	})

	t.Run("a kubeadm configuration change: every machine", func(t *testing.T) {
		patchKCP(t, c, s.KCPKey(), func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.APIServer.ExtraArgs = []bootstrapv1.Arg{{Name: "audit-log-maxage", Value: ptr.To("30")}}
		})
		needingRollout(t, all, "KubeadmConfig is not up-to-date")
		patchKCP(t, c, s.KCPKey(), func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.APIServer.ExtraArgs = nil
		})
		needingRollout(t, nil, "")
	})

	t.Run("a restart, rollout.after: every machine created before it", func(t *testing.T) {
		patchKCP(t, c, s.KCPKey(), func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.Rollout.After = metav1.Now()
		})
		needingRollout(t, all, "rolloutAfter expired")
		patchKCP(t, c, s.KCPKey(), func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.Rollout.After = metav1.Time{}
		})
		needingRollout(t, nil, "")
	})

	t.Run("a new machine template: every machine but one made from it, which boots its image", func(t *testing.T) {
		template, image := s.ClusterKey().Name+"-control-plane-image-2", "sim-image-2"
		if err := s.CreateInfraTemplate(ctx, template, image); err != nil {
			t.Fatal(err)
		}
		patchKCP(t, c, s.KCPKey(), func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name = template
		})
		needingRollout(t, all, "GenericInfrastructureMachine is not up-to-date")

		// A replacement made as KCP makes it, from the KCP now pointing at
		// the new template.
		replacement := createMachine(t, s)
		simtest.Eventually(t, 2*time.Minute, "the replacement's node", func(ctx context.Context) (bool, string, error) {
			if err := c.Get(ctx, client.ObjectKeyFromObject(replacement), replacement); err != nil {
				return false, "", err
			}
			return replacement.Status.NodeRef.IsDefined(), "no nodeRef yet", nil
		})
		assertImage(t, s, replacement, image)
		needingRollout(t, all, "GenericInfrastructureMachine is not up-to-date")
		for _, m := range machines {
			node := &corev1.Node{}
			if err := w.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node); err != nil {
				t.Fatal(err)
			}
			if node.Status.NodeInfo.OSImage != initialImage {
				t.Errorf("node %s of outdated machine %s reports %q, want the image it booted, %q", node.Name, m.Name, node.Status.NodeInfo.OSImage, initialImage)
			}
		}
	})
}

// assertImage checks that machine's InfraMachine names image and reports it
// booted, and that its Node reports it as its OS image.
func assertImage(t *testing.T, s *sim.Sim, m *clusterv1.Machine, image string) {
	t.Helper()
	ctx := context.Background()
	im := &unstructured.Unstructured{}
	im.SetGroupVersionKind(builder.InfrastructureGroupVersion.WithKind(builder.GenericInfrastructureMachineKind))
	if err := s.ManagementClient().Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.InfrastructureRef.Name}, im); err != nil {
		t.Fatal(err)
	}
	booted, _, _ := unstructured.NestedString(im.Object, "status", "image")
	if got := sim.InfraMachineImage(im); got != image || booted != image {
		t.Errorf("machine %s: InfraMachine spec.image %q, status.image %q; want %q", m.Name, got, booted, image)
	}
	node := &corev1.Node{}
	if err := s.WorkloadClient().Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, node); err != nil {
		t.Fatal(err)
	}
	if got := node.Status.NodeInfo.OSImage; got != image {
		t.Errorf("machine %s: node %s osImage %q, want %q", m.Name, node.Name, got, image)
	}
}

func kubeadmConfigOf(t *testing.T, c client.Client, m *clusterv1.Machine) *bootstrapv1.KubeadmConfig {
	t.Helper()
	config := &bootstrapv1.KubeadmConfig{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.Bootstrap.ConfigRef.Name}, config); err != nil {
		t.Fatal(err)
	}
	return config
}

// awaitCertificatesExpiry waits for the certificates-expiry record on the
// machine's KubeadmConfig to be want.
func awaitCertificatesExpiry(t *testing.T, c client.Client, m *clusterv1.Machine, want string) {
	t.Helper()
	simtest.Eventually(t, time.Minute, "certificates expiry "+want+" recorded for "+m.Name, func(ctx context.Context) (bool, string, error) {
		config := &bootstrapv1.KubeadmConfig{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.Bootstrap.ConfigRef.Name}, config); err != nil {
			return false, "", err
		}
		got := config.Annotations[clusterv1.MachineCertificatesExpiryDateAnnotation]
		return got == want, fmt.Sprintf("recorded %q", got), nil
	})
}

func awaitMachineCertificatesExpiry(t *testing.T, c client.Client, m *clusterv1.Machine, want time.Time) {
	t.Helper()
	simtest.Eventually(t, time.Minute, "machine "+m.Name+" status.certificatesExpiryDate", func(ctx context.Context) (bool, string, error) {
		got := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			return false, "", err
		}
		return got.Status.CertificatesExpiryDate.Time.Equal(want), got.Status.CertificatesExpiryDate.String(), nil
	})
}

// pauseKCP pauses the KCP as the tool does and waits until KCP says so: a
// reconcile under way would otherwise act on a spec change.
func pauseKCP(t *testing.T, c client.Client, key client.ObjectKey) {
	t.Helper()
	kcp := &controlplanev1.KubeadmControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := c.Patch(context.Background(), kcp, client.RawPatch(types.MergePatchType, sim.AnnotationPatch(clusterv1.PausedAnnotation, "true"))); err != nil {
		t.Fatal(err)
	}
	simtest.Eventually(t, time.Minute, "KCP Paused", func(ctx context.Context) (bool, string, error) {
		if err := c.Get(ctx, key, kcp); err != nil {
			return false, "", err
		}
		cond := conditions.Get(kcp, clusterv1.PausedCondition)
		return cond != nil && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == kcp.Generation, fmt.Sprintf("%+v", cond), nil
	})
}

// patchKCP changes the KCP's spec through its webhooks, as kubectl would.
func patchKCP(t *testing.T, c client.Client, key client.ObjectKey, change func(*controlplanev1.KubeadmControlPlane)) {
	t.Helper()
	// The controllers write the KCP's status meanwhile: a conflict is read
	// again and the change made anew, as kubectl edit would.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(context.Background(), key, kcp); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(kcp.DeepCopy(), client.MergeFromWithOptimisticLock{})
		change(kcp)
		return c.Patch(context.Background(), kcp, patch)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// awaitNeedingRollout waits for KCP's view of the control plane, built as
// KCP and the tool build it, to name exactly want as needing rollout, each
// for a reason containing reason.
func awaitNeedingRollout(t *testing.T, s *sim.Sim, want []string, reason string) {
	t.Helper()
	c := s.ManagementClient()
	simtest.Eventually(t, time.Minute, fmt.Sprintf("machines needing rollout %v (%s)", want, reason), func(ctx context.Context) (bool, string, error) {
		cluster := &clusterv1.Cluster{}
		if err := c.Get(ctx, s.ClusterKey(), cluster); err != nil {
			return false, "", err
		}
		kcp := &controlplanev1.KubeadmControlPlane{}
		if err := c.Get(ctx, s.KCPKey(), kcp); err != nil {
			return false, "", err
		}
		machines, err := collections.GetFilteredMachinesForCluster(ctx, c, cluster, collections.ControlPlaneMachines(cluster.Name))
		if err != nil {
			return false, "", err
		}
		cp, err := kcpstate.NewControlPlane(ctx, nil, c, cluster, kcp, machines)
		if err != nil {
			return false, "", err
		}
		needing, results := cp.MachinesNeedingRollout()
		got := needing.Names()
		slices.Sort(got)
		var why []string
		for _, name := range got {
			why = append(why, name+": "+strings.Join(results[name].ConditionMessages, "; "))
		}
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			return false, fmt.Sprintf("needing rollout %v", why), nil
		}
		for _, name := range got {
			if !slices.ContainsFunc(results[name].ConditionMessages, func(m string) bool { return strings.Contains(m, reason) }) {
				return false, fmt.Sprintf("reasons %v", why), nil
			}
		}
		return true, "", nil
	})
}
