// Package etcd is the product's only way to etcd: it reaches each member of a workload
// cluster's stacked etcd, lists members with their health, forwards leadership, removes
// members and projects quorum, as carefully as KubeadmControlPlane's own etcd code (the
// reference: controlplane/kubeadm/pkg/etcd and workload_cluster_etcd.go in Cluster API).
//
// Members are reached node by node through a Dialer: port-forwarded through the workload
// cluster's API server to the static pod kube-system/etcd-<node> (what KCP does), or
// directly at an endpoint rendered from a template such as https://{{.NodeIP}}:2379. kubeadm
// names each member after its node, so a member is found on the node with its name.
//
// The client certificate is minted in memory from the cluster's etcd CA (the `<cluster>-etcd`
// Secret), short-lived and re-minted before it expires; the server certificate is verified
// against the same CA without a host name check, because a port-forwarded member is not
// known by any name in its certificate.
//
// etcd facts this package encodes, each learned the hard way by KCP or kubeadm:
//   - a member that has been added but not started has an empty name; it counts as a learner
//     and is never a leadership target;
//   - a learner does not serve MemberList, so members are listed through voting members;
//   - MoveLeader is only accepted by the current leader, and its target must be a voting member;
//   - MemberRemove must go through a member other than the one removed, and the last member
//     is never removed; a member refuses membership changes until it has been connected to
//     its peers for five seconds, so a change goes to a member that was there before the
//     latest join, not to the newcomer;
//   - quorum is counted over voting members only.
//
// External etcd (clusterConfiguration.etcd.external) is not the control plane's to manage:
// LoadCredentials returns ErrNotManaged and callers skip every etcd step.
package etcd
