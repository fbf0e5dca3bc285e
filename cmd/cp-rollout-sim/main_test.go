package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

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
		{"up", "--kubeconfig-out", "k", "--inert-clusters", "-1"},
		{"up", "--kubeconfig-out", "k", "--inert-clusters", "3", "--inert-machines", "0"},
		{"up", "--kubeconfig-out", "k", "--inert-clusters", "3", "--inert-machines", "4"},
		{"up", "--kubeconfig-out", "k", "--cluster", "inert", "--clusters", "2", "--inert-clusters", "2"},
		{"up", "--kubeconfig-out", "k", "--cluster", "inert-3", "--inert-clusters", "5"},
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
		"--version", "v1.36.3", "--provision-delay", "3s", "--delete-delay", "2s", "--capacity", "6", "--failure-domains", "3", "--workers", "2", "--topology", "--class-versions", "v1.35.2,v1.36.3", "--mhc=false", "--without-kcp"})
	if err != nil {
		t.Fatal(err)
	}
	s := o.sim
	if o.kubeconfigOut != "k" || s.ClusterName != "c" || s.Namespace != "ns" || s.Replicas != 5 || s.Version != "v1.36.3" ||
		s.ProvisionDelay != 3*time.Second || s.DeleteDelay != 2*time.Second || s.Capacity != 6 || s.FailureDomains != 3 || s.Workers != 2 || !s.Topology || strings.Join(s.ClassVersions, " ") != "v1.35.2 v1.36.3" || !s.WithoutMachineHealthCheck || !s.WithoutKCP {
		t.Fatalf("parsed %+v", o)
	}
	o, err = parseUp([]string{"--kubeconfig-out", "k"})
	if err != nil {
		t.Fatal(err)
	}
	if s := o.sim; s.ClusterName != "demo" || s.Namespace != "default" || s.Replicas != 3 || s.Version != "v1.35.2" ||
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
