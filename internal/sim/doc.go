// Package sim is the simulated Cluster API environment the tool's tests, the
// demo and cp-rollout-sim run on. No machine here boots VMs, so the machines
// are the one fake; everything around them is real:
//
//   - a management and a workload cluster, each a real kube-apiserver and etcd
//     started by controller-runtime's envtest from the binaries
//     hack/envtest-binaries.sh builds (AssetsDir finds them);
//   - the Cluster API v1beta2 CRDs (core, kubeadm control plane and bootstrap,
//     embedded from package manifests with their contract labels) and the
//     generic infrastructure CRDs of cluster-api's util/test/builder, each
//     listed once at start so the API server serves it from a ready watch
//     cache, as on a management cluster that has been running (a fresh one
//     answers a kind's first list 429 with a one-second Retry-After);
//   - the real ClusterClass and topology, Cluster, Machine, MachineSet,
//     MachineDeployment and MachineHealthCheck reconcilers, the real kubeadm
//     bootstrap (KubeadmConfig) reconciler and the real KubeadmControlPlane
//     reconciler, in managers wired as their main.go files wire them, and a
//     MachineHealthCheck on the control plane as Cluster API's documentation
//     recommends; Options.Workers adds a MachineDeployment of workers and
//     Options.Topology makes the Cluster a ClusterClass's;
//   - Cluster API's admission webhooks (core, kubeadm bootstrap and control
//     plane) with the providers' webhook configurations (package manifests),
//     served from the core manager: one local server for all three, where
//     production runs one per provider;
//   - in the workload cluster, what kubeadm init leaves there and KCP updates
//     after a rollout: kube-proxy, CoreDNS, kubeadm's ConfigMaps and bindings
//     (addons.go);
//   - a real etcd member per machine (package member) on the machine's own
//     loopback address, reachable through the workload API server's
//     pods/portforward via a kubelet stand-in (package kubelet).
//
// Several simulators can share one management cluster (StartManagement,
// Options.Management), as one management cluster hosts many clusters: its
// Cluster API controllers serve them all, and each simulator has its own
// provider, workload cluster, members and nodes. Their Clusters may share a
// namespace when their names differ: a provider serves only the objects
// labelled with its Cluster's name. Options.Labels labels a Cluster, as a
// fleet's clusters are labelled to be selected.
//
// CreateInertClusters adds clusters that exist only as management-cluster
// objects (a paused Cluster, its KCP and healthy-looking Machines, no
// workload cluster or etcd): a fleet of hundreds to list and select from,
// at the cost of a few objects each. apiservertest.StartCAPI serves them
// without any controller.
//
// The simulated part is provider.go: an infrastructure provider that reports
// the infrastructure cluster provisioned (with Options.FailureDomains), gives
// an InfraMachine a host within Options.Capacity and boots it (Node, mirror
// static pods, kubelet stand-in, etcd member joined as a learner and promoted
// as kubeadm does) once Options.ProvisionDelay has passed since then and the
// kubeadm bootstrap controller has written the machine's bootstrap data, and,
// after Options.DeleteDelay, takes the host away when the InfraMachine is
// deleted.
//
// The generic infrastructure provider's machines have one setting, the
// machine image (spec.template.spec.image of a
// GenericInfrastructureMachineTemplate, Options.Image for the initial ones,
// CreateInfraTemplate for another to roll to): a machine's host boots the
// image its InfraMachine names and its Node reports it as
// status.nodeInfo.osImage, so a rollout to a new template shows on the
// nodes.
//
// What stands in for something that does not run here:
//   - the initial machines are created at once, while the KCP (on a topology
//     cluster, the one the topology controller made) is still paused, with
//     KCP's own desiredstate code and field owner (the tool's
//     controlplane.CreateMachine, the code that creates its replacements),
//     where KCP would add them one by one; with Options.WithoutKCP the
//     simulator also reports the KCP initialized, as KCP would;
//   - KCP reads the kube-apiserver serving certificate's expiry through a
//     port-forward to kube-apiserver-<node>:6443; a small TLS endpoint with a
//     certificate signed by the cluster CA, valid a year, answers there for
//     every node. A machine's expiry is made near with SetCertificatesExpiry
//     or the certs-expire-in fault, which write KCP's record of it
//     (certexpiry.go).
//
// Faults (faults.go) break the simulated hosts on demand: Go methods for
// tests, and the same faults asked for through the management cluster with
// FaultAnnotation on a Machine or the Cluster (faultspec.go lists them), which
// the simulator's fault controller (faultcontroller.go, simulator code, no
// part of Cluster API) applies, undoes when the annotation no longer names
// them, and records in FaultAppliedAnnotation and in Events. kubectl and
// cp-rollout-sim fault write that annotation alike.
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
