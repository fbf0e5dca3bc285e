// Package record is the operation record this tool keeps on a
// KubeadmControlPlane it pauses: what holds the pause, who started it and
// when, and why its last run failed; and, after a hand-back, the record of
// the operation that finished. The engine decides on it and the management
// cluster client writes it, so it lives apart from both.
package record

import (
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// Annotation holds, on a KubeadmControlPlane this tool has paused, what
// operation paused it. Its presence is what makes the pause ours: a pause
// without it was set by someone else and is never removed by this tool.
const Annotation = "cp-rollout.cluster.x-k8s.io/operation"

// LastAnnotation keeps, after a hand-back, the record of the
// operation that finished: a runbook re-running a replace whose machine is
// already gone learns it is done instead of being told the machine does not
// exist. It never pauses anything.
const LastAnnotation = "cp-rollout.cluster.x-k8s.io/last-operation"

// PauseOperation is the record of `kubectl cp-rollout pause`: a pause that
// holds KCP back while someone changes its spec, which any verb of this tool
// may then take over and roll out (and handback undoes).
const PauseOperation = "pause"

// Record describes the operation that holds a control plane paused, or that
// last finished.
type Record struct {
	Operation string     `json:"operation"` // upgrade, scale, replace, rollout, restart, pause
	Target    string     `json:"target"`    // v1.36.3, replicas=5, machine name; "" for a pause
	Who       string     `json:"who"`
	Started   time.Time  `json:"started"`
	Finished  *time.Time `json:"finished,omitempty"`
	// LastFailure is why the latest run under this record failed, while the
	// pause it left stands: status explains the pause with it. Records
	// written before it existed have none; the operation finishing clears it.
	LastFailure *Failure `json:"lastFailure,omitempty"`
	// Reason is why a pause was set, as its author gave it; records written
	// before it existed, and those of the other operations, have none.
	Reason string `json:"reason,omitempty"`
}

// Failure is a run that stopped on an unsafe state (exit 3) or a wait that
// ran out (exit 4), leaving its pause and record for a re-run.
type Failure struct {
	Reason   string    `json:"reason"`
	Time     time.Time `json:"time"`
	ExitCode int       `json:"exitCode"`
}

func (r Record) String() string {
	if r.Operation == PauseOperation {
		return "pause by " + r.Detail()
	}
	return fmt.Sprintf("%s to %s by %s, started %s", r.Operation, r.Target, r.Who, r.Started.UTC().Format(time.RFC3339))
}

// Detail is who set a pause, since when and why, for "paused by cp-rollout
// pause (...)".
func (r Record) Detail() string {
	d := fmt.Sprintf("%s, since %s", r.Who, r.Started.UTC().Format(time.RFC3339))
	if r.Reason != "" {
		d += ", reason: " + r.Reason
	}
	return d
}

// Of returns the operation record on kcp, if any.
func Of(kcp *controlplanev1.KubeadmControlPlane) (*Record, error) {
	raw, ok := kcp.Annotations[Annotation]
	if !ok {
		return nil, nil
	}
	r := &Record{}
	if err := json.Unmarshal([]byte(raw), r); err != nil {
		return nil, exitcode.Unsafef("KubeadmControlPlane %s: unreadable %s annotation: %v", kcp.Name, Annotation, err)
	}
	return r, nil
}

// LastOf returns the record of the last operation that finished on kcp, if
// any can be read.
func LastOf(kcp *controlplanev1.KubeadmControlPlane) *Record {
	r := &Record{}
	if raw, ok := kcp.Annotations[LastAnnotation]; !ok || json.Unmarshal([]byte(raw), r) != nil {
		return nil
	}
	return r
}

// Who identifies this process as a Lease holder and in operation records:
// user, host and process, so a colleague knows whom to ask, and a random
// part, as client-go's leader election adds one, so two processes that share
// a user, host name and PID (containers, cloned VMs) are still two holders.
var Who = sync.OnceValue(who)

func who() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s/pid-%d-%s", name, host, os.Getpid(), rand.String(5))
}
