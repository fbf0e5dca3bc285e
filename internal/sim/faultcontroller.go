package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// This file is simulator code, not a part of Cluster API: the fault
// controller. It reads FaultAnnotation on the simulator's own Cluster and
// Machines, applies or undoes each fault on the simulated hosts (faults.go),
// and records what it did in FaultAppliedAnnotation and in an Event on the
// object, so that `kubectl describe machine` shows the fault took effect.
// It keeps its state on the objects: what is applied is what the annotation
// says, so a fault is applied once, not on every reconcile.

// faultEventSource is the Events' reporting controller.
const faultEventSource = "cp-rollout-sim-faults"

// strayLearnerTimeout bounds adding the stale-learner fault's learner: etcd
// refuses a new member while another learner is joining, and the request is
// retried on the next reconcile rather than holding the controller.
const strayLearnerTimeout = 30 * time.Second

type faultController struct {
	s      *Sim
	c      client.Client // uncached: the applied record is read afresh
	events events.EventRecorder
}

// setupFaultController registers the fault controllers with the simulated
// provider's manager, whose cache already holds only this Cluster's Machines.
func (s *Sim) setupFaultController(mgr ctrl.Manager) error {
	fc := &faultController{s: s, c: s.mgmt, events: mgr.GetEventRecorder(faultEventSource)}
	err := builder.ControllerManagedBy(mgr).
		Named("simulated-machine-faults").
		For(&clusterv1.Machine{}).
		Complete(reconcile.Func(fc.reconcileMachine))
	if err != nil {
		return err
	}
	own := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == s.opts.Namespace && o.GetName() == s.opts.ClusterName
	})
	return builder.ControllerManagedBy(mgr).
		Named("simulated-cluster-faults").
		For(&clusterv1.Cluster{}, builder.WithPredicates(own)).
		Complete(reconcile.Func(fc.reconcileCluster))
}

func (fc *faultController) reconcileMachine(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	m := &clusterv1.Machine{}
	if err := fc.c.Get(ctx, req.NamespacedName, m); err != nil {
		if apierrors.IsNotFound(err) {
			// Whatever the machine's faults acted on went with its host,
			// but a drain blocker (its pod and budget are workload objects)
			// and an etcd alarm (etcd keeps a removed member's).
			return reconcile.Result{}, errors.Join(fc.s.UnblockDrain(ctx, req.Name), fc.s.disarmGoneMachine(ctx, req.Name))
		}
		return reconcile.Result{}, err
	}
	if !fc.s.ownObject(m) {
		return reconcile.Result{}, nil
	}
	want, have, changed := fc.faults(m, MachineFault)
	if !changed {
		return reconcile.Result{}, nil
	}
	node := m.Status.NodeRef.Name
	if !m.Status.NodeRef.IsDefined() {
		// The Machine changes when it gets its node, and that brings it back.
		fc.events.Eventf(m, nil, corev1.EventTypeNormal, "FaultPending", "ApplyFault", "waiting for the machine's node before applying %s", FormatFaults(want))
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, fc.converge(ctx, m, want, have, func(fault string, on bool) (string, error) {
		return fc.machineFault(ctx, m.Name, node, fault, on)
	})
}

func (fc *faultController) reconcileCluster(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cluster := &clusterv1.Cluster{}
	if err := fc.c.Get(ctx, req.NamespacedName, cluster); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	want, have, changed := fc.faults(cluster, ClusterFault)
	if !changed {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, fc.converge(ctx, cluster, want, have, func(fault string, on bool) (string, error) {
		return fc.clusterFault(ctx, fault, on)
	})
}

// faults reads what obj asks for and what is applied; unknown names are
// reported in a Warning Event and left out.
func (fc *faultController) faults(obj client.Object, scope FaultScope) (want, have []string, changed bool) {
	want, err := ParseFaults(scope, obj.GetAnnotations()[FaultAnnotation])
	if err != nil {
		fc.events.Eventf(obj, nil, corev1.EventTypeWarning, "UnknownFault", "ApplyFault", "%s: %v", FaultAnnotation, err)
	}
	// The applied record is the simulator's own; it holds known names only.
	have, _ = ParseFaults(scope, obj.GetAnnotations()[FaultAppliedAnnotation])
	return want, have, !slices.Equal(want, have)
}

// converge undoes the faults applied but no longer asked for, then applies
// the new ones, recording each change as it is made: a failure leaves the
// record true and is retried with the controller's back-off. A fault asked
// for with a new value is applied over the old one, not undone first: the
// undo of certs-expire-in would write a far expiry that KCP, running, could
// act on in between.
func (fc *faultController) converge(ctx context.Context, obj client.Object, want, have []string, do func(fault string, on bool) (string, error)) error {
	applied := slices.Clone(have)
	step := func(fault string, on bool) error {
		action, reason := "ApplyFault", "FaultApplied"
		if !on {
			action, reason = "UndoFault", "FaultUndone"
		}
		note, err := do(fault, on)
		if err != nil {
			fc.events.Eventf(obj, nil, corev1.EventTypeWarning, "FaultFailed", action, "%s: %v", fault, err)
			return fmt.Errorf("%s %s: %w", action, fault, err)
		}
		applied = slices.DeleteFunc(applied, func(f string) bool { return FaultName(f) == FaultName(fault) })
		if on {
			applied = append(applied, fault)
		}
		if err := fc.recordApplied(ctx, obj, applied); err != nil {
			return err
		}
		fc.events.Eventf(obj, nil, corev1.EventTypeNormal, reason, action, "%s: %s", fault, note)
		return nil
	}
	for _, f := range have {
		replaced := slices.ContainsFunc(want, func(w string) bool { return FaultName(w) == FaultName(f) })
		if !replaced {
			if err := step(f, false); err != nil {
				return err
			}
		}
	}
	for _, f := range want {
		if !slices.Contains(have, f) {
			if err := step(f, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// recordApplied writes the applied faults into FaultAppliedAnnotation (none:
// the annotation goes) with a merge patch, which leaves every other
// annotation to its owner.
func (fc *faultController) recordApplied(ctx context.Context, obj client.Object, applied []string) error {
	patch := AnnotationPatch(FaultAppliedAnnotation, FormatFaults(applied))
	if err := fc.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("recording the applied faults: %w", err)
	}
	return nil
}

// machineFault applies (on) or undoes one fault (an entry NAME or
// NAME=VALUE) on the host of machine, whose node is node, and says what it
// did.
func (fc *faultController) machineFault(ctx context.Context, machine, node, entry string, on bool) (string, error) {
	s := fc.s
	var err error
	var note string
	fault, value, _ := strings.Cut(entry, "=")
	switch component, isPod := staticPodFault(fault); {
	case fault == FaultEtcdStopped && on:
		err, note = s.StopMember(node), "etcd member of node "+node+" stopped"
	case fault == FaultEtcdStopped:
		note = "etcd member of node " + node + " restarted"
		m, merr := s.memberOf(node)
		switch {
		case merr != nil:
			err = merr
		case memberStopped(m):
			err = s.RestartMember(ctx, node)
		default:
			note = "etcd member of node " + node + " runs already"
		}
	case isPod:
		err, note = s.SetStaticPodReady(ctx, node, component, !on), fmt.Sprintf("static pod %s-%s Ready=%t", component, node, !on)
	case fault == FaultNodeNotReady:
		err, note = s.SetNodeReady(ctx, node, !on), fmt.Sprintf("node %s Ready=%t", node, !on)
	case fault == FaultDrainBlocked && on:
		err = s.BlockDrain(ctx, machine, node)
		note = fmt.Sprintf("pod and PodDisruptionBudget %s/drain-blocker-%s (0 disruptions allowed) on node %s", DrainBlockerNamespace, node, node)
	case fault == FaultDrainBlocked:
		err, note = s.UnblockDrain(ctx, machine), "drain blocker pod and PodDisruptionBudget deleted"
	case fault == FaultCertsExpireIn && on:
		// ParseFaults checked the value; now is when the fault applies.
		in, _ := ParseExpiresIn(value)
		expiry := time.Now().Add(in)
		err = s.SetCertificatesExpiry(ctx, machine, expiry)
		note = fmt.Sprintf("certificates expiry recorded on the KubeadmConfig: %s (in %s)", expiry.UTC().Format(time.RFC3339), value)
	case fault == FaultCertsExpireIn:
		err = s.ResetCertificatesExpiry(ctx, machine)
		note = "certificates expiry recorded on the KubeadmConfig: " + s.APIServerCertificateExpiry().UTC().Format(time.RFC3339) + ", the served certificate's"
	case fault == FaultEtcdAlarm && on:
		var id uint64
		id, err = s.RaiseEtcdAlarm(ctx, machine, node)
		note = fmt.Sprintf("NOSPACE alarm raised for etcd member %x of node %s", id, node)
	case fault == FaultEtcdAlarm:
		var id uint64
		id, err = s.DisarmEtcdAlarm(ctx, machine, node)
		note = fmt.Sprintf("NOSPACE alarm of etcd member %x disarmed", id)
		if err == nil && id == 0 {
			note = "no etcd member of node " + node + " to disarm"
		}
	default:
		return "", fmt.Errorf("no such machine fault %q", fault)
	}
	if err != nil && !on && (errors.Is(err, errUnknownNode) || apierrors.IsNotFound(err)) {
		// The host went, and the fault with it.
		return "node " + node + " is gone, nothing to undo", nil
	}
	return note, err
}

// clusterFault applies (on) or undoes one cluster-wide fault (an entry NAME
// or NAME=VALUE).
func (fc *faultController) clusterFault(ctx context.Context, entry string, on bool) (string, error) {
	s := fc.s
	fault, value, _ := strings.Cut(entry, "=")
	if note, ok, err := fc.stagingFault(ctx, fault, value, on); ok {
		return note, err
	}
	switch fault {
	case FaultNeverProvision:
		if on {
			s.NeverProvisionNext()
			return "the next machine the provider sees never provisions", nil
		}
		s.DisarmNeverProvision()
		return "machines held back provision now", s.RecoverProvisioning(ctx)
	case FaultStaleLearner:
		peerURL := s.strayLearnerPeerURL()
		if !on {
			return "learner at " + peerURL + " removed", s.RemoveMembersAt(ctx, peerURL)
		}
		addCtx, cancel := context.WithTimeout(ctx, strayLearnerTimeout)
		defer cancel()
		added, err := s.addStrayLearnerOnce(addCtx, peerURL)
		if !added {
			return "a member at " + peerURL + " exists already", err
		}
		return "learner added at " + peerURL + ", never started", err
	}
	return "", fmt.Errorf("no such cluster fault %q", fault)
}

// stagingFault applies or undoes one of the cluster faults that stage the
// readiness check's findings (staging.go); ok is false for any other fault.
func (fc *faultController) stagingFault(ctx context.Context, fault, value string, on bool) (note string, ok bool, err error) {
	s := fc.s
	switch {
	case fault == FaultDeprecatedAPIClient && on:
		return fmt.Sprintf("a client (user agent %s) lists %s every %s; removed in %s", DeprecatedAPIClientUserAgent, DeprecatedAPI, deprecatedClientInterval, DeprecatedAPIRemovedRelease),
			true, s.StartDeprecatedAPIClient(ctx)
	case fault == FaultDeprecatedAPIClient:
		return "the client stopped; the workload API server's metrics reset", true, s.StopDeprecatedAPIClient(ctx)
	case fault == FaultOldWorkers && on:
		return fmt.Sprintf("worker nodes %s, kubelet %s, no Machine", strings.Join(OldWorkerNames(), ", "), value), true, s.SetOldWorkers(ctx, value)
	case fault == FaultOldWorkers:
		return "worker nodes " + strings.Join(OldWorkerNames(), ", ") + " deleted", true, s.RemoveOldWorkers(ctx)
	case fault == FaultFailClosedWebhook && on:
		node, err := s.AddFailClosedWebhook(ctx)
		return fmt.Sprintf("ValidatingWebhookConfiguration %s (failurePolicy Fail), its only endpoint on node %s, selecting nothing but %s", WebhookName, node, WebhookSelectorLabel), true, err
	case fault == FaultFailClosedWebhook:
		return "ValidatingWebhookConfiguration " + WebhookName + " with its Service and EndpointSlice deleted", true, s.RemoveFailClosedWebhook(ctx)
	case fault == FaultCorefileUnknownPlugin && on:
		return "plugin " + UnknownCorefilePlugin + " added to the Corefile of kube-system/coredns", true, s.AddUnknownCorefilePlugin(ctx)
	case fault == FaultCorefileUnknownPlugin:
		return "plugin " + UnknownCorefilePlugin + " taken out of the Corefile of kube-system/coredns", true, s.RemoveUnknownCorefilePlugin(ctx)
	case fault == FaultAddonUnready && on:
		n, err := s.SetAddonUnready(ctx, true)
		return fmt.Sprintf("kube-proxy stays unready on nodes that join from now on (the %d there are keep theirs Ready)", n), true, err
	case fault == FaultAddonUnready:
		_, err := s.SetAddonUnready(ctx, false)
		return "every kube-proxy pod Ready", true, err
	}
	return "", false, nil
}
