package controlplane

import (
	"context"
	"fmt"
	"testing"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/exp/topology/desiredstate"
)

// classPlan answers as Cluster API's own plan does, for the cases its
// documentation and tests describe.
func TestClassPlanIsClusterAPIs(t *testing.T) {
	declared := []string{"v1.33.0", "v1.33.5", "v1.34.0", "v1.34.1", "v1.34.3", "v1.35.0", "v1.35.2", "v1.36.0", "v1.36.3"}
	for _, tc := range []struct{ from, target string }{
		{"v1.33.0", "v1.36.3"},
		{"v1.33.5", "v1.35.0"},
		{"v1.34.1", "v1.34.3"},
		{"v1.34.3", "v1.36.0"},
		{"v1.34.0", "v1.34.1"},
		{"v1.36.3", "v1.36.3"},
		{"v1.35.2", "v1.36.3"},
		{"v1.34.2", "v1.36.3"}, // from a version the class does not declare
		{"v1.34.3", "v1.36.2"}, // to one it does not declare
	} {
		t.Run(tc.from+"-"+tc.target, func(t *testing.T) {
			want, _, wantErr := desiredstate.GetUpgradePlanFromClusterClassVersions(declared)(context.Background(), tc.target, tc.from, "")
			got, err := classPlan(declared, tc.from, tc.target)
			if fmt.Sprint(got) != fmt.Sprint(want) || (err == nil) != (wantErr == nil) {
				t.Fatalf("classPlan %v, %v; Cluster API plans %v, %v", got, err, want, wantErr)
			}
		})
	}
	if got, err := classPlan(nil, "v1.34.3", "v1.36.3"); got != nil || err != nil {
		t.Fatalf("no declared versions: %v, %v; want no plan", got, err)
	}
}

// TestMachineVersions counts a MachineDeployment's machines by version, as
// v1.14's status.versions does, for a controller that does not write it.
func TestMachineVersions(t *testing.T) {
	machine := func(md, version string) clusterv1.Machine {
		m := clusterv1.Machine{}
		m.Labels = map[string]string{clusterv1.MachineDeploymentNameLabel: md}
		m.Spec.Version = version
		return m
	}
	machines := []clusterv1.Machine{machine("md-0", "v1.36.3"), machine("md-0", "v1.35.2"), machine("md-1", "v1.35.2"), machine("md-0", "v1.36.3")}
	got := fmt.Sprint(machineVersions(machines, "md-0"))
	if want := "[{v1.35.2 1} {v1.36.3 2}]"; got != want {
		t.Errorf("md-0's machines by version: %s, want %s", got, want)
	}
	if got := machineVersions(machines, "md-2"); got != nil {
		t.Errorf("a MachineDeployment without machines: %v, want none", got)
	}
}
