package sim_test

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cp-rollout/cp-rollout/internal/sim"
)

func TestParseFaults(t *testing.T) {
	for _, tc := range []struct {
		scope   sim.FaultScope
		value   string
		want    string
		wantErr string // a substring; "" means none
	}{
		{sim.MachineFault, "", "", ""},
		{sim.MachineFault, "etcd-stopped", "etcd-stopped", ""},
		// Sorted, spaces and duplicates dropped: the applied record compares equal.
		{sim.MachineFault, " node-not-ready, etcd-stopped,,etcd-stopped ", "etcd-stopped,node-not-ready", ""},
		{sim.MachineFault, "kube-scheduler-unready,etcd-unready,drain-blocked", "drain-blocked,etcd-unready,kube-scheduler-unready", ""},
		// A typo is reported and the rest still applies.
		{sim.MachineFault, "etcd-stoped,node-not-ready", "node-not-ready", `unknown machine fault "etcd-stoped"`},
		{sim.MachineFault, "kubelet-unready", "", `unknown machine fault "kubelet-unready"`},
		// The wrong object's fault says where it belongs.
		{sim.MachineFault, "stale-learner", "", `"stale-learner" is a cluster fault, not a machine fault`},
		{sim.ClusterFault, "etcd-stopped", "", `"etcd-stopped" is a machine fault, not a cluster fault`},
		{sim.ClusterFault, "stale-learner,never-provision", "never-provision,stale-learner", ""},
		// A setting carries its value; without one, or with a bad one, it is
		// reported and left out, and a plain fault takes no value.
		{sim.MachineFault, "node-not-ready,certs-expire-in=10d", "certs-expire-in=10d,node-not-ready", ""},
		{sim.MachineFault, "certs-expire-in=36h,certs-expire-in=36h", "certs-expire-in=36h", ""},
		{sim.MachineFault, "certs-expire-in", "", `fault "certs-expire-in" needs a value: certs-expire-in=DURATION`},
		{sim.MachineFault, "certs-expire-in=soon,etcd-stopped", "etcd-stopped", `"soon": want whole days`},
		{sim.MachineFault, "etcd-stopped=10d", "", `fault "etcd-stopped" takes no value`},
		// Given twice, the last value applies, and the clash is reported.
		{sim.MachineFault, "certs-expire-in=10d,certs-expire-in=3d", "certs-expire-in=3d", `given twice`},
		{sim.ClusterFault, "certs-expire-in=10d", "", `"certs-expire-in" is a machine fault`},
		// The staged findings of the readiness check.
		{sim.ClusterFault, "old-workers=v1.32.4,addon-unready,deprecated-api-client", "addon-unready,deprecated-api-client,old-workers=v1.32.4", ""},
		{sim.ClusterFault, "fail-closed-webhook,corefile-unknown-plugin", "corefile-unknown-plugin,fail-closed-webhook", ""},
		{sim.ClusterFault, "old-workers", "", `fault "old-workers" needs a value: old-workers=VERSION`},
		{sim.ClusterFault, "old-workers=1.32.4", "", `want a kubelet version such as v1.32.4`},
		{sim.ClusterFault, "old-workers=v1.32", "", `want a kubelet version such as v1.32.4`},
		{sim.MachineFault, "etcd-alarm,addon-unready", "etcd-alarm", `"addon-unready" is a cluster fault, not a machine fault`},
		{sim.ClusterFault, "etcd-alarm", "", `"etcd-alarm" is a machine fault, not a cluster fault`},
	} {
		got, err := sim.ParseFaults(tc.scope, tc.value)
		if sim.FormatFaults(got) != tc.want {
			t.Errorf("%s %q: faults %q, want %q", tc.scope, tc.value, got, tc.want)
		}
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s %q: %v", tc.scope, tc.value, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s %q: error %v, want one containing %q", tc.scope, tc.value, err, tc.wantErr)
		}
	}
}

func TestWithFault(t *testing.T) {
	for _, tc := range []struct {
		value, fault string
		on           bool
		want         string
	}{
		{"", "etcd-stopped", true, "etcd-stopped"},
		{"etcd-stopped", "etcd-stopped", true, "etcd-stopped"},
		{"node-not-ready", "etcd-stopped", true, "etcd-stopped,node-not-ready"},
		{"etcd-stopped,node-not-ready", "etcd-stopped", false, "node-not-ready"},
		{"etcd-stopped", "etcd-stopped", false, ""},
		{"", "etcd-stopped", false, ""},
		// Someone else's unknown name stays: only the named fault changes.
		{"custom-thing", "drain-blocked", true, "custom-thing,drain-blocked"},
		// A setting's new value replaces the old; off removes it by name.
		{"certs-expire-in=10d,etcd-stopped", "certs-expire-in=3d", true, "certs-expire-in=3d,etcd-stopped"},
		{"certs-expire-in=10d,etcd-stopped", "certs-expire-in", false, "etcd-stopped"},
	} {
		if got := sim.WithFault(tc.value, tc.fault, tc.on); got != tc.want {
			t.Errorf("WithFault(%q, %q, %t) = %q, want %q", tc.value, tc.fault, tc.on, got, tc.want)
		}
	}
}

func TestAnnotationPatch(t *testing.T) {
	var set, removed map[string]map[string]map[string]*string
	if err := json.Unmarshal(sim.AnnotationPatch(sim.FaultAnnotation, "etcd-stopped"), &set); err != nil {
		t.Fatal(err)
	}
	if v := set["metadata"]["annotations"][sim.FaultAnnotation]; v == nil || *v != "etcd-stopped" {
		t.Errorf("set patch %v", set)
	}
	if err := json.Unmarshal(sim.AnnotationPatch(sim.FaultAnnotation, ""), &removed); err != nil {
		t.Fatal(err)
	}
	if v, ok := removed["metadata"]["annotations"][sim.FaultAnnotation]; !ok || v != nil {
		t.Errorf("remove patch %v, want the annotation null", removed)
	}
}

// Every static pod component has its unready fault, and every fault says
// what it does and how it is undone (the help text and docs/simulator.md list them).
func TestFaultCatalogue(t *testing.T) {
	names := map[string]bool{}
	for _, f := range sim.FaultCatalogue() {
		if names[f.Name] || f.Effect == "" || f.Undo == "" || (f.Scope != sim.MachineFault && f.Scope != sim.ClusterFault) || strings.ContainsAny(f.Name, "=,") {
			t.Errorf("fault %+v: duplicate, or missing its scope, effect or undo", f)
		}
		names[f.Name] = true
	}
	for _, c := range sim.Components {
		if !names[c+"-unready"] {
			t.Errorf("no %s-unready fault", c)
		}
	}
	doc, err := os.ReadFile("../../docs/simulator.md")
	if err != nil {
		t.Fatal(err)
	}
	for name := range names {
		if c, ok := strings.CutSuffix(name, "-unready"); ok && slices.Contains(sim.Components, c) {
			continue // one row, <component>-unready
		}
		if !strings.Contains(string(doc), "| `"+name) {
			t.Errorf("docs/simulator.md has no row for fault %s", name)
		}
	}
}

func TestParseExpiresIn(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"10d", 240 * time.Hour, true},
		{"0d", 0, true},
		{"36h", 36 * time.Hour, true},
		{"90m", 90 * time.Minute, true},
		{"0", 0, true},
		// Expired a day ago.
		{"-1d", -24 * time.Hour, true},
		{"1.5d", 0, false},
		{"10days", 0, false},
		{"", 0, false},
	} {
		got, err := sim.ParseExpiresIn(tc.value)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseExpiresIn(%q) = %s, %v; want %s, ok %t", tc.value, got, err, tc.want, tc.ok)
		}
	}
}
