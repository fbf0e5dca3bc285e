// Package sim is the simulated Cluster API environment the tool's tests, the
// demo and cp-rollout-sim run on. No machine here boots VMs, so the machines
// are the one fake; everything around them is real:
//
//   - a management and a workload cluster, each a real kube-apiserver and etcd
//     started by controller-runtime's envtest from the binaries
//     hack/envtest-binaries.sh builds (AssetsDir finds them);
//   - the Cluster API v1beta2 CRDs (core, kubeadm control plane and bootstrap,
//     embedded from package crds with their contract labels) and the generic
//     infrastructure CRDs of cluster-api's util/test/builder;
//   - the real Machine reconciler and the real KubeadmControlPlane reconciler,
//     each in a manager of its own wired as its main.go wires it;
//   - a real etcd member per machine (package member) on the machine's own
//     loopback address, reachable through the workload API server's
//     pods/portforward via a kubelet stand-in (package kubelet).
//
// Several simulators can share one management cluster (StartManagement,
// Options.Management), as one management cluster hosts many clusters: its
// Cluster API controllers serve them all, and each simulator keeps its
// Cluster in a namespace of its own with its own provider, workload cluster,
// members and nodes.
//
// The simulated part is provider.go: an infrastructure and bootstrap provider
// that, after Options.ProvisionDelay and within Options.Capacity, gives an
// InfraMachine its host (Node, mirror static pods, kubelet stand-in, etcd
// member joined as a learner and promoted as kubeadm does) and, after
// Options.DeleteDelay, takes it away when the InfraMachine is deleted.
//
// What stands in for something that does not run here:
//   - no Cluster controller: Start marks the Cluster's infrastructure
//     provisioned and its control plane initialized, and makes the Cluster the
//     owner of its KCP;
//   - no webhooks: the KCP gets its webhook defaults, the Machine default
//     nodeDeletionTimeoutSeconds comes through the KCP machine template, and
//     ValidateKCP runs the KCP webhook's validation for tests;
//   - the initial machines are created at once with KCP's own desiredstate
//     code and field owner (the tool's controlplane.CreateMachine, the code
//     that creates its replacements), where KCP would add them one
//     by one;
//   - KCP reads the kube-apiserver serving certificate's expiry through a
//     port-forward to kube-apiserver-<node>:6443; a small TLS endpoint with a
//     certificate signed by the cluster CA answers there.
//
// Typical use:
//
//	s, err := sim.Start(ctx, sim.Options{Replicas: 3})
//	defer s.Stop()
//	err = s.WaitReady(ctx) // every Machine has a nodeRef, members named, voting, healthy
//	kubeconfig, _ := s.ManagementKubeconfig()
//
// Simulators that run at the same time (tests of several packages) need
// distinct Options.AddressPrefix values: members use the fixed kubeadm ports
// on their node's address.
package sim
