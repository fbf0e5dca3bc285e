package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

func TestMain(m *testing.M) { simtest.Main(m) }

func TestBadUsageIsOneLineAndExitsTwo(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"down"},
		{"up"},
		{"up", "--kubeconfig-out", "k", "--replicas", "x"},
		{"up", "--kubeconfig-out", "k", "--replicas", "0"},
		{"up", "--kubeconfig-out", "k", "--capacity", "-1"},
		{"up", "--kubeconfig-out", "k", "--capacity", "2"},
		{"up", "--kubeconfig-out", "k", "--provision-delay", "-1s"},
		{"up", "--kubeconfig-out", "k", "--failure-domains", "-1"},
		{"up", "--kubeconfig-out", "k", "--no-such-flag"},
		{"up", "--kubeconfig-out", "k", "extra"},
		{"up", "--kubeconfig-out", "k", "--clusters", "0"},
		{"up", "--kubeconfig-out", "k", "--clusters", "-1"},
		{"up", "--kubeconfig-out", "k", "--clusters", "255"},
		{"up", "--kubeconfig-out", "k", "--clusters", "two"},
		{"up", "--kubeconfig-out", "k", "--clusters", "2", "--without-kcp"},
		{"up", "--kubeconfig-out", "k", "--capi-version", "1.13.6"},
		{"up", "--kubeconfig-out", "k", "--capi-version", "v1.13"},
		{"up", "--kubeconfig-out", "k", "--capi-version", "v1.13.6", "--clusters", "2"},
		{"up", "--kubeconfig-out", "k", "--capi-version", "v1.13.6", "--without-kcp"},
		{"build-capi"},
		{"build-capi", "latest"},
		{"build-capi", "v1.13.6", "v1.14.2"},
		{"up", "--kubeconfig-out", "k", "--inert-clusters", "-1"},
		{"up", "--kubeconfig-out", "k", "--inert-clusters", "3", "--inert-machines", "0"},
		{"up", "--kubeconfig-out", "k", "--inert-clusters", "3", "--inert-machines", "4"},
		{"up", "--kubeconfig-out", "k", "--cluster", "inert", "--clusters", "2", "--inert-clusters", "2"},
		{"up", "--kubeconfig-out", "k", "--cluster", "inert-3", "--inert-clusters", "5"},
		{"fault"},
		{"fault", "m1"},
		{"fault", "m1", "etcd-stopped", "extra"},
		{"fault", "m1", "etcd-stoped"},
		{"fault", "m1", "stale-learner"},
		{"fault", "cluster/demo", "etcd-stopped"},
		{"fault", "cluster/demo", "never-provision=maybe"},
		{"fault", "m1", "certs-expire-in"},
		{"fault", "m1", "certs-expire-in=on"},
		{"fault", "m1", "certs-expire-in=10days"},
		{"fault", "cluster/demo", "certs-expire-in=10d"},
		{"fault", "node/m1", "etcd-stopped"},
		{"fault", "machine/", "etcd-stopped"},
		{"fault", "--wait", "-1s", "m1", "etcd-stopped"},
		{"fault", "--no-such-flag", "m1", "etcd-stopped"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
		if lines := strings.Count(strings.TrimSpace(stderr.String()), "\n") + 1; lines != 1 || !strings.HasPrefix(stderr.String(), "error: ") {
			t.Errorf("%q: want one error line, got %q", args, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("%q: wrote to stdout: %q", args, stdout.String())
		}
	}
}

func TestUpFlags(t *testing.T) {
	o, err := parseUp([]string{"--kubeconfig-out", "k", "--cluster", "c", "--namespace", "ns", "--replicas", "5",
		"--version", "v1.36.3", "--image", "ubuntu-2404-kube-v1.36.3", "--provision-delay", "3s", "--delete-delay", "2s", "--capacity", "6", "--failure-domains", "3", "--workers", "2", "--topology", "--class-versions", "v1.35.2,v1.36.3", "--mhc=false", "--without-kcp"})
	if err != nil {
		t.Fatal(err)
	}
	if o, err := parseUp([]string{"--kubeconfig-out", "k", "--capi-version", "v1.13.6"}); err != nil || o.sim.CAPIVersion != "v1.13.6" {
		t.Fatalf("--capi-version v1.13.6: %+v, %v", o, err)
	}
	s := o.sim
	if o.kubeconfigOut != "k" || s.ClusterName != "c" || s.Namespace != "ns" || s.Replicas != 5 || s.Version != "v1.36.3" || s.Image != "ubuntu-2404-kube-v1.36.3" ||
		s.ProvisionDelay != 3*time.Second || s.DeleteDelay != 2*time.Second || s.Capacity != 6 || s.FailureDomains != 3 || s.Workers != 2 || !s.Topology || strings.Join(s.ClassVersions, " ") != "v1.35.2 v1.36.3" || !s.WithoutMachineHealthCheck || !s.WithoutKCP {
		t.Fatalf("parsed %+v", o)
	}
	o, err = parseUp([]string{"--kubeconfig-out", "k"})
	if err != nil {
		t.Fatal(err)
	}
	if s := o.sim; s.ClusterName != "demo" || s.Namespace != "default" || s.Replicas != 3 || s.Version != "v1.35.2" || s.Image != "" ||
		s.ProvisionDelay != 2*time.Second || s.DeleteDelay != time.Second || s.Capacity != 0 || s.FailureDomains != 0 || s.Workers != 0 || s.Topology || s.WithoutMachineHealthCheck || s.WithoutKCP {
		t.Fatalf("defaults %+v", o)
	}
}

func TestClustersFlags(t *testing.T) {
	o, err := parseUp([]string{"--kubeconfig-out", "k", "--cluster", "edge", "--namespace", "fleet", "--replicas", "1", "--clusters", "3",
		"--inert-clusters", "20", "--inert-machines", "5", "--failure-domains", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if o.clusters != 3 || o.inertClusters != 20 || o.inertMachines != 5 {
		t.Fatalf("parsed %+v", o)
	}
	var prefixes []string
	for i := 1; i <= 3; i++ {
		c := o.clusterOptions(i, nil)
		if want := fmt.Sprintf("edge-%d", i); c.ClusterName != want || c.Namespace != "fleet" || c.Replicas != 1 || c.FailureDomains != 3 || c.Labels["env"] != "sim" {
			t.Errorf("cluster %d: %+v, want %s in fleet with the flags' settings, labelled env=sim", i, c, want)
		}
		prefixes = append(prefixes, c.AddressPrefix)
	}
	if strings.Join(prefixes, " ") != "127.0.1 127.0.2 127.0.3" {
		t.Errorf("address prefixes %v, want one /24 each, clear of the single cluster's 127.0.0", prefixes)
	}

	// One cluster stays named --cluster, on the default addresses.
	o, err = parseUp([]string{"--kubeconfig-out", "k", "--inert-clusters", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if c := o.clusterOptions(1, nil); o.clusters != 1 || o.inertMachines != 3 || c.ClusterName != "demo" || c.AddressPrefix != "" || c.Labels["env"] != "sim" {
		t.Errorf("defaults: %+v, cluster %+v", o, c)
	}
}

func TestFaultArguments(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		scope sim.FaultScope
		name  string
		fault string
		value string
		on    bool
	}{
		{[]string{"demo-abcde", "etcd-stopped"}, sim.MachineFault, "demo-abcde", "etcd-stopped", "", true},
		{[]string{"machine/demo-abcde", "kube-apiserver-unready=off"}, sim.MachineFault, "demo-abcde", "kube-apiserver-unready", "", false},
		{[]string{"machines/demo-abcde", "drain-blocked=on"}, sim.MachineFault, "demo-abcde", "drain-blocked", "", true},
		{[]string{"cluster/demo", "stale-learner"}, sim.ClusterFault, "demo", "stale-learner", "", true},
		{[]string{"-n", "ns", "--kubeconfig", "k", "--wait", "0", "cluster/demo", "never-provision=off"}, sim.ClusterFault, "demo", "never-provision", "", false},
		// A setting takes its value after =, and off removes it whatever its value.
		{[]string{"demo-abcde", "certs-expire-in=10d"}, sim.MachineFault, "demo-abcde", "certs-expire-in", "10d", true},
		{[]string{"demo-abcde", "certs-expire-in=36h"}, sim.MachineFault, "demo-abcde", "certs-expire-in", "36h", true},
		{[]string{"demo-abcde", "certs-expire-in=off"}, sim.MachineFault, "demo-abcde", "certs-expire-in", "", false},
		{[]string{"cluster/demo", "old-workers=v1.32.4"}, sim.ClusterFault, "demo", "old-workers", "v1.32.4", true},
		{[]string{"cluster/demo", "old-workers=off"}, sim.ClusterFault, "demo", "old-workers", "", false},
		{[]string{"cluster/demo", "addon-unready"}, sim.ClusterFault, "demo", "addon-unready", "", true},
		{[]string{"demo-abcde", "etcd-alarm"}, sim.MachineFault, "demo-abcde", "etcd-alarm", "", true},
	} {
		o, err := parseFault(tc.args)
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if o.scope != tc.scope || o.name != tc.name || o.fault != tc.fault || o.value != tc.value || o.on != tc.on {
			t.Errorf("%q: parsed %+v", tc.args, o)
		}
	}
	o, err := parseFault([]string{"-n", "ns", "--kubeconfig", "k", "--wait", "0", "m", "etcd-stopped"})
	if err != nil || o.namespace != "ns" || o.kubeconfig != "k" || o.wait != 0 {
		t.Errorf("flags: %+v, %v", o, err)
	}
}

// The help lists every fault of the simulator's catalogue, a setting with
// the value it takes.
func TestFaultHelpListsTheFaults(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"fault", "--help"}, &stdout, &stderr); code != exitOK || stderr.Len() != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	for _, f := range sim.FaultCatalogue() {
		usage := f.Name
		if f.Value != "" {
			usage += "=" + f.Value
		}
		if !strings.Contains(stdout.String(), "  "+usage+" ") {
			t.Errorf("help does not list %s:\n%s", usage, stdout.String())
		}
	}
}

// TestFaultCommand: the command writes the annotation kubectl would and
// waits for the simulator to act on it; the node turns NotReady and Ready
// again, a certificate expiry setting is applied, changed and removed. A
// machine the cluster does not have is bad input.
func TestFaultCommand(t *testing.T) {
	t.Parallel()
	env := simtest.Start(t, sim.Options{Replicas: 1})
	ctx := context.Background()
	machines, err := env.Sim.Machines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, node := machines[0].Name, machines[0].Status.NodeRef.Name
	nodeReady := func() bool {
		n := &corev1.Node{}
		if err := env.Sim.WorkloadClient().Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue
			}
		}
		return false
	}

	for _, step := range []struct {
		fault, out string
		ready      bool
	}{
		{"node-not-ready", "machine/" + m + ": node-not-ready on, in effect (faults in effect: node-not-ready)", false},
		{"node-not-ready=off", "machine/" + m + ": node-not-ready off, in effect (faults in effect: none)", true},
		// A setting: its value is part of what is asked for and in effect,
		// a new value replaces the old, and off removes it whatever its value.
		{"certs-expire-in=10d", "machine/" + m + ": certs-expire-in=10d on, in effect (faults in effect: certs-expire-in=10d)", true},
		{"certs-expire-in=3d", "machine/" + m + ": certs-expire-in=3d on, in effect (faults in effect: certs-expire-in=3d)", true},
		{"certs-expire-in=off", "machine/" + m + ": certs-expire-in off, in effect (faults in effect: none)", true},
	} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"fault", "--kubeconfig", env.Kubeconfig, m, step.fault}, &stdout, &stderr); code != exitOK {
			t.Fatalf("%s: exit %d: %s", step.fault, code, stderr.String())
		}
		if got := strings.TrimSpace(stdout.String()); got != step.out {
			t.Errorf("%s: printed %q, want %q", step.fault, got, step.out)
		}
		if nodeReady() != step.ready {
			t.Errorf("%s: node %s Ready %t, want %t", step.fault, node, !step.ready, step.ready)
		}
	}
	got := &clusterv1.Machine{}
	if err := env.Sim.ManagementClient().Get(ctx, client.ObjectKey{Namespace: machines[0].Namespace, Name: m}, got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Annotations[sim.FaultAnnotation]; ok {
		t.Errorf("annotations %v: the last fault removed, want no fault annotation", got.Annotations)
	}

	var stdout, stderr bytes.Buffer
	if code := run([]string{"fault", "--kubeconfig", env.Kubeconfig, "no-such-machine", "etcd-stopped"}, &stdout, &stderr); code != exitUsage ||
		strings.TrimSpace(stderr.String()) != "error: machine/no-such-machine not found in namespace "+machines[0].Namespace {
		t.Errorf("unknown machine: exit %d, stderr %q", code, stderr.String())
	}
}
