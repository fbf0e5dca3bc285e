package rollout

import (
	"context"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// TestRequestValidate: the request's own rules, judged without a cluster.
func TestRequestValidate(t *testing.T) {
	replicas := func(n int32) *int32 { return &n }
	for _, tc := range []struct {
		name string
		r    Request
		says string // "" when the request is valid
	}{
		{"an upgrade", Request{Operation: "upgrade", Version: "v1.37.0", MaxSurge: -1}, ""},
		{"a scale deleting first", Request{Operation: "scale", Replicas: replicas(3), MaxSurge: 0}, ""},
		{"an even count deleting first: the cluster decides", Request{Operation: "scale", Replicas: replicas(2), MaxSurge: 0}, ""},
		{"no leading v", Request{Operation: "upgrade", Version: "1.37.0"}, "--version 1.37.0 is not a Kubernetes version: want vMAJOR.MINOR.PATCH, for example v1.37.0"},
		{"a via without its v", Request{Operation: "upgrade", Version: "v1.37.0", Via: []string{"1.36.2"}}, "--via 1.36.2 is not a Kubernetes version"},
		{"a via out of order", Request{Operation: "upgrade", Version: "v1.37.0", Via: []string{"v1.36.2", "v1.36.1"}}, "--via v1.36.1 is not newer than v1.36.2"},
		{"a via without a version", Request{Operation: "upgrade", Via: []string{"v1.36.2"}}, "--via needs --version"},
		{"a via on the target's minor", Request{Operation: "upgrade", Version: "v1.37.3", Via: []string{"v1.37.0"}}, "--via v1.37.0 and --version v1.37.3 are both v1.37.x"},
		{"a target two minors past the via", Request{Operation: "upgrade", Version: "v1.38.0", Via: []string{"v1.36.2"}}, "v1.38.0 skips a minor version: from v1.36.2"},
		{"zero replicas", Request{Operation: "scale", Replicas: replicas(0)}, "--replicas must be at least 1, not 0"},
		{"a template without a version", Request{Operation: "upgrade", Template: "demo-v2"}, "--infrastructure-template needs --version"},
		{"a template with a via", Request{Operation: "upgrade", Version: "v1.37.0", Via: []string{"v1.36.2"}, Template: "demo-v2"}, "cannot go with --via"},
		{"a template that is no name", Request{Operation: "upgrade", Version: "v1.37.0", Template: "Demo_V2"}, "is not an object name"},
		{"a surge of 2", Request{Operation: "restart", MaxSurge: 2}, "--max-surge must be 0 or 1, not 2"},
		{"deleting first from one", Request{Operation: "scale", Replicas: replicas(1), MaxSurge: 0}, "--max-surge 0 needs at least 3 replicas (--replicas is 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			if tc.says == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if exitcode.Of(err) != exitcode.Usage || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got exit %d %v; want exit 2 saying %q", exitcode.Of(err), err, tc.says)
			}
		})
	}
}

// TestPrepareRefusesASkippedMinor: the skip is measured from the oldest
// machine, not from the version the KubeadmControlPlane asks for.
func TestPrepareRefusesASkippedMinor(t *testing.T) {
	w := world(machineSpec{}, machineSpec{}, machineSpec{})
	for _, m := range w.CP.Machines {
		m.Spec.Version = "v1.35.2" // KCP already asks for v1.36.3, no machine runs it
	}
	e, _ := engineFor(newScripted(w), fast)
	_, err := e.Prepare(context.Background(), Request{Operation: "upgrade", Version: "v1.37.0", MaxSurge: 1}, nil)
	if exitcode.Of(err) != exitcode.Usage || !strings.Contains(err.Error(), "v1.37.0 skips a minor version: from v1.35.2") {
		t.Fatalf("got exit %d %v; want v1.37.0 refused as a skip from v1.35.2", exitcode.Of(err), err)
	}
	if _, err := e.Prepare(context.Background(), Request{Operation: "scale", Replicas: ptr.To(int32(0)), MaxSurge: 1}, nil); exitcode.Of(err) != exitcode.Usage {
		t.Fatalf("a request that is not valid: got %v, want exit 2 before any read", err)
	}
}
