package fleet

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
)

func TestParseStages(t *testing.T) {
	stages, err := ParseStages("ring=canary; ring in (1,2) ;env=prod,ring!=canary")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range stages {
		got = append(got, s.String())
	}
	if want := []string{"ring=canary", "ring in (1,2)", "env=prod,ring!=canary"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("stages %q, want %q", got, want)
	}
	for _, tc := range []struct{ value, want string }{
		{"", "stage 1 is empty"},
		{"ring=0;;ring=2", "stage 2 is empty"},
		{"ring=0; ", "stage 2 is empty"},
		{"ring=0;ring in (1", `stage 2 "ring in (1"`},
		{"ring==0=1", `stage 1 "ring==0=1"`},
	} {
		if _, err := ParseStages(tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseStages(%q): %v, want an error saying %q", tc.value, err, tc.want)
		}
	}
}

// On the shared API server: inert clusters labelled in rings, one in none,
// one with a window that does not parse, and control planes of several
// sizes as the Clusters' status reports them.
func TestPlacePutsEachClusterInTheFirstStageItMatches(t *testing.T) {
	ctx := context.Background()
	cfg := apiServer(t)
	c, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLister(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, records := recordsIn(t, "stages")
	ns := records.namespace // new, for this test alone
	if err := sim.CreateInertClusters(ctx, c, ns, 6, 1, "v1.35.2"); err != nil {
		t.Fatal(err)
	}
	type cluster struct {
		labels  map[string]string
		window  string
		desired *int32 // nil: no control plane status
	}
	for name, want := range map[string]cluster{
		"inert-1": {labels: map[string]string{"ring": "0"}, window: "Sat 02:00-06:00 Europe/Berlin", desired: ptr.To(int32(3))},
		"inert-2": {labels: map[string]string{"ring": "1"}, desired: ptr.To(int32(5))},
		"inert-3": {labels: map[string]string{"ring": "2"}},
		"inert-4": {desired: ptr.To(int32(3))},
		"inert-5": {labels: map[string]string{"ring": "0"}, window: "Sat 02:00-06:00 Mars/Olympus_Mons", desired: ptr.To(int32(3))},
		"inert-6": {labels: map[string]string{"ring": "2"}, window: "Mon-Fri 22:00-02:00 UTC; Sun 00:00-24:00 UTC", desired: ptr.To(int32(1))},
	} {
		cl := &clusterv1.Cluster{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, cl); err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(cl.DeepCopy())
		for k, v := range want.labels {
			cl.Labels[k] = v
		}
		if want.window != "" {
			cl.Annotations = map[string]string{WindowAnnotation: want.window}
		}
		if err := c.Patch(ctx, cl, patch); err != nil {
			t.Fatal(err)
		}
		// CreateInertClusters reports 1 desired replica, as it made them.
		status := client.MergeFrom(cl.DeepCopy())
		if want.desired == nil {
			cl.Status.ControlPlane = nil
		} else {
			cl.Status.ControlPlane.DesiredReplicas = want.desired
		}
		if err := c.Status().Patch(ctx, cl, status); err != nil {
			t.Fatal(err)
		}
	}
	// A Cluster whose control plane is not a KubeadmControlPlane, in a ring.
	other := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other", Labels: map[string]string{"ring": "0"}},
		Spec: clusterv1.ClusterSpec{ControlPlaneRef: clusterv1.ContractVersionedObjectReference{
			APIGroup: "controlplane.cluster.x-k8s.io", Kind: "TalosControlPlane", Name: "other"}},
	}
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}

	describe := func(members []Member, skipped []Skipped) (string, string) {
		var m, s []string
		for _, x := range members {
			m = append(m, fmt.Sprintf("%s:%d:%d:%s", x.Name, x.Stage, x.Replicas, x.Window))
			if x.Namespace != ns {
				t.Errorf("%s is in namespace %q", x.Name, x.Namespace)
			}
		}
		for _, x := range skipped {
			s = append(s, x.Name+": "+x.Reason)
		}
		return strings.Join(m, " "), strings.Join(s, "\n")
	}

	t.Run("three rings", func(t *testing.T) {
		stages, err := ParseStages("ring=0;ring=1;ring=2")
		if err != nil {
			t.Fatal(err)
		}
		members, skipped, err := Place(ctx, l, Scope{Namespace: ns}, stages)
		if err != nil {
			t.Fatal(err)
		}
		m, s := describe(members, skipped)
		if want := "inert-1:1:3:Sat 02:00-06:00 Europe/Berlin inert-2:2:5: inert-3:3:0: inert-6:3:1:Mon-Fri 22:00-02:00 UTC; Sun 00:00-24:00 UTC"; m != want {
			t.Errorf("members (name:stage:replicas:window)\n%s\nwant\n%s", m, want)
		}
		want := []string{
			"inert-4: in no stage of --stages",
			`inert-5: cp-rollout.io/maintenance-window "Sat 02:00-06:00 Mars/Olympus_Mons": zone "Mars/Olympus_Mons"`,
			"other: its control plane is a TalosControlPlane, not a KubeadmControlPlane",
		}
		lines := strings.Split(s, "\n")
		if len(lines) != len(want) {
			t.Fatalf("skipped\n%s\nwant %d", s, len(want))
		}
		for i := range want {
			if !strings.HasPrefix(lines[i], want[i]) {
				t.Errorf("skipped %q, want %q…", lines[i], want[i])
			}
		}
		for _, x := range members {
			if (x.Name == "inert-1" || x.Name == "inert-6") == x.Window.IsZero() {
				t.Errorf("%s: window %q (zero %v)", x.Name, x.Window, x.Window.IsZero())
			}
		}
	})

	t.Run("the first stage a cluster matches", func(t *testing.T) {
		stages, err := ParseStages("ring=2;ring")
		if err != nil {
			t.Fatal(err)
		}
		members, skipped, err := Place(ctx, l, Scope{Namespace: ns}, stages)
		if err != nil {
			t.Fatal(err)
		}
		m, s := describe(members, skipped)
		if want := "inert-1:2:3:Sat 02:00-06:00 Europe/Berlin inert-2:2:5: inert-3:1:0: inert-6:1:1:Mon-Fri 22:00-02:00 UTC; Sun 00:00-24:00 UTC"; m != want {
			t.Errorf("members (name:stage:replicas:window)\n%s\nwant\n%s", m, want)
		}
		if !strings.HasPrefix(s, "inert-4: in no stage") {
			t.Errorf("skipped\n%s\nwant inert-4 first, in no stage", s)
		}
	})

	t.Run("no stages: one, of every cluster in scope", func(t *testing.T) {
		members, skipped, err := Place(ctx, l, Scope{Namespace: ns, Selector: labels.SelectorFromSet(labels.Set{"ring": "0"})}, nil)
		if err != nil {
			t.Fatal(err)
		}
		m, s := describe(members, skipped)
		if want := "inert-1:1:3:Sat 02:00-06:00 Europe/Berlin"; m != want {
			t.Errorf("members (name:stage:replicas:window) %s, want %s", m, want)
		}
		if !strings.HasPrefix(s, "inert-5: cp-rollout.io/maintenance-window") || !strings.Contains(s, "\nother: ") {
			t.Errorf("skipped\n%s\nwant inert-5 for its window, other for its control plane", s)
		}
	})
}
