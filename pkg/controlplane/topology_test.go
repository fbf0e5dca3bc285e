package controlplane

import (
	"context"
	"fmt"
	"testing"

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
