// Package audit answers "what did cp-rollout do to this control plane, and
// who ran it?" where anyone with kubectl looks: every step of a run that
// changes a control plane is also a Kubernetes Event on its
// KubeadmControlPlane (reporting controller cp-rollout, the run's holder as
// reporting instance, the Machine as related object), so `kubectl events`
// and `kubectl describe kcp` show it next to what KCP and the Machine
// controller report.
//
// Events are written in the background, one create each, and never hold a
// step up; one that cannot be written is dropped: the audit trail must not
// fail a rollout. client-go's event recorder is not used: it batches, spams
// filters and retries on its own schedule for long-running controllers, and
// a command that exits would lose what it had not sent yet; here Close waits
// for what was reported, a few seconds at most.
package audit

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	recordutil "k8s.io/client-go/tools/record/util"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// Controller is the reportingController of every Event the tool writes.
const Controller = "cp-rollout"

// flushLimit bounds how long Close waits for Events still being written.
const flushLimit = 5 * time.Second

// Trail writes a run's steps as Events on one KubeadmControlPlane.
type Trail struct {
	c        client.Client
	kcp      corev1.ObjectReference
	instance string
	events   chan *eventsv1.Event
	done     chan struct{}
	close    sync.Once
}

// New starts the trail of a run by instance (the run's Lease holder) on kcp.
func New(c client.Client, kcp *controlplanev1.KubeadmControlPlane, instance string) *Trail {
	t := &Trail{
		c: c,
		kcp: corev1.ObjectReference{APIVersion: controlplanev1.GroupVersion.String(), Kind: "KubeadmControlPlane",
			Namespace: kcp.Namespace, Name: kcp.Name, UID: kcp.UID},
		instance: instance,
		events:   make(chan *eventsv1.Event, 256),
		done:     make(chan struct{}),
	}
	go t.write()
	return t
}

// Reporter passes every event on to next and records on the trail the end
// of each step that changes the control plane, and every failure. A wait
// (await-join, await-deletion, await-kcp, ..., a gate pass, soak) changes nothing:
// only its failure, which is why a run stopped, is recorded. Re-reads are
// not steps.
func (t *Trail) Reporter(next progress.Reporter) progress.Reporter {
	return &reporter{Reporter: next, t: t}
}

type reporter struct {
	progress.Reporter
	t *Trail
}

func (r *reporter) Report(e progress.Event) {
	r.Reporter.Report(e)
	if Records(e.Action, e.Phase) {
		r.t.record(e)
	}
}

// Records reports whether the trail records an event of action in phase
// (see Reporter). The run's waits are named await-<what>, but for a pass
// of the operator's gate and the soak after a machine joined (Action.Waits).
func Records(action string, phase progress.Phase) bool {
	wait := rollout.Action(action).Waits()
	return action != string(rollout.Read) && (phase == progress.Failed || phase == progress.Done && !wait)
}

// record queues e's Event; when the queue is full (the API server cannot
// keep up) it is dropped rather than hold the run up.
func (t *Trail) record(e progress.Event) {
	ev := t.event(e)
	select {
	case t.events <- ev:
	default:
	}
}

// event is e as an Event: reason the action in CamelCase (with Failed for a
// step that failed, a Warning), note its message.
func (t *Trail) event(e progress.Event) *eventsv1.Event {
	now := e.Time
	if now.IsZero() {
		now = time.Now()
	}
	reason, typ := camel(e.Action), corev1.EventTypeNormal
	switch {
	case e.Phase == progress.Failed && e.Action == string(rollout.Refuse):
		reason, typ = "Refused", corev1.EventTypeWarning
	case e.Phase == progress.Failed:
		reason, typ = reason+"Failed", corev1.EventTypeWarning
	}
	note := e.Message
	if e.Hop.Of > 0 {
		note = e.Hop.String() + ": " + note
	}
	if len(note) > 1024 {
		note = note[:1021] + "..."
	}
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: t.kcp.Namespace, Name: eventName(t.kcp.Name, now)},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: Controller,
		ReportingInstance:   limit(t.instance, 128),
		Action:              limit(e.Action, 128),
		Reason:              limit(reason, 128),
		Regarding:           t.kcp,
		Note:                note,
		Type:                typ,
	}
	if e.Machine != "" {
		ev.Related = &corev1.ObjectReference{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine",
			Namespace: t.kcp.Namespace, Name: e.Machine}
	}
	return ev
}

// Warn records a Warning Event of action with reason and note on each of
// regarding (the Cluster, the KubeadmControlPlane): what a person looking at
// either must learn, such as a pause a failed run left standing, which
// `kubectl describe cluster` shows only from an Event on the Cluster itself.
// An object whose kind the client's scheme does not know is skipped.
func (t *Trail) Warn(action, reason, note string, regarding ...client.Object) {
	now := time.Now()
	for _, obj := range regarding {
		gvk, err := apiutil.GVKForObject(obj, t.c.Scheme())
		if err != nil {
			continue
		}
		ev := &eventsv1.Event{
			ObjectMeta:          metav1.ObjectMeta{Namespace: obj.GetNamespace(), Name: eventName(obj.GetName(), now)},
			EventTime:           metav1.NewMicroTime(now),
			ReportingController: Controller,
			ReportingInstance:   limit(t.instance, 128),
			Action:              limit(action, 128),
			Reason:              limit(reason, 128),
			Regarding: corev1.ObjectReference{APIVersion: gvk.GroupVersion().String(), Kind: gvk.Kind,
				Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID()},
			Note: limit(note, 1024),
			Type: corev1.EventTypeWarning,
		}
		select {
		case t.events <- ev:
		default:
		}
	}
}

// lastStamp is the latest time, in Unix nanoseconds, that named an Event
// this process wrote.
var lastStamp atomic.Int64

// eventName names an Event about the object named object, at: client-go's
// event recorders' name, <object>.<nanoseconds in hex>, or a UUID where that
// is no valid name (tools/record/util.GenerateEventName). Two Events in one
// nanosecond would share it — a warning on a Cluster and on its
// KubeadmControlPlane named alike, two steps reported with one time — and
// the second create would fail, dropping it: so each name takes a
// nanosecond later than every one before it in this process.
func eventName(object string, at time.Time) string {
	for {
		last := lastStamp.Load()
		stamp := max(at.UnixNano(), last+1)
		if lastStamp.CompareAndSwap(last, stamp) {
			return recordutil.GenerateEventName(object, stamp)
		}
	}
}

func (t *Trail) write() {
	defer close(t.done)
	for ev := range t.events {
		ctx, cancel := context.WithTimeout(context.Background(), flushLimit)
		_ = t.c.Create(ctx, ev) // never fails the run; see the package comment
		cancel()
	}
}

// Close waits, up to flushLimit, until the Events reported so far are
// written.
func (t *Trail) Close() {
	t.close.Do(func() { close(t.events) })
	select {
	case <-t.done:
	case <-time.After(flushLimit):
	}
}

// camel turns an action such as "move-leader" into "MoveLeader".
func camel(action string) string {
	var b strings.Builder
	for _, part := range strings.Split(action, "-") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

func limit(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
