// Package kubelet is the simulator's kubelet stand-in: one small HTTPS server per
// simulated node that serves the kubelet's port-forward endpoint, so that a real
// kube-apiserver's `pods/portforward` for `kube-system/etcd-<node>` port 2379
// reaches that node's etcd member, exactly the path KCP and the tool use in
// production.
//
// # Use
//
//	srv, err := kubelet.Start(ctx, kubelet.Config{
//		IP: "127.0.0.2", // the node's own loopback address
//		Forward: func(namespace, pod string, port int32) (string, bool) {
//			if namespace == "kube-system" && pod == "etcd-"+nodeName && port == 2379 {
//				return "127.0.0.2:2379", true
//			}
//			return "", false
//		},
//	})
//	...
//	defer srv.Stop()
//
// Then register the node with the workload API server so that it routes
// port-forward requests here:
//
//   - status.addresses: a single {Type: InternalIP, Address: cfg.IP}. The API server
//     picks the kubelet address by --kubelet-preferred-address-types (default
//     Hostname, InternalDNS, InternalIP, ExternalDNS, ExternalIP); with only an
//     InternalIP there is nothing to prefer over it, so no API server flag is needed.
//   - status.daemonEndpoints.kubeletEndpoint.port: srv.Port(). Both are status
//     fields, so set them through the nodes/status subresource.
//   - Do NOT list ExtendWebSocketsToKubelet in status.declaredFeatures (see below).
//
// The pod must exist in the API server, be bound to the node (spec.nodeName) and be
// Running; the API server checks that before it proxies. This server does not look
// at pods at all: Forward alone decides where a stream goes. Forward is called once
// per forwarded connection, from many goroutines, so it must be safe for concurrent
// use; returning false makes that one connection fail with an error the client sees
// ("no target for ..."), the session itself stays up.
//
// # Protocols
//
// Streams are served by k8s.io/cri-streaming/pkg/streaming/portforward
// (ServePortForward), the library the kubelet and the CRI runtimes use. It speaks
// SPDY/3.1 with subprotocol portforward.k8s.io, and the older WebSocket channel
// protocols (v4.channel.k8s.io, v4.base64.channel.k8s.io, ports in the query).
//
// Clients from client-go v0.31 on (kubectl, NewFallbackDialer) first try WebSocket
// with subprotocol SPDY/3.1+portforward.k8s.io, i.e. SPDY tunnelled in WebSocket
// frames. A v1.36 API server handles that in one of two ways: if the Node declares
// the ExtendWebSocketsToKubelet feature in status.declaredFeatures, it passes the
// WebSocket upgrade through to the kubelet unchanged; otherwise it terminates the
// WebSocket itself and talks plain SPDY to the kubelet. This stand-in relies on
// the second: it rejects tunnelled WebSocket requests with 400 and a message
// pointing here, so a Node that claims the feature fails loudly instead of hanging.
// Clients that dial SPDY directly (KCP's etcd dialer does) are proxied as SPDY.
//
// # TLS
//
// The server uses a self-signed certificate for cfg.IP generated in memory
// (ECDSA P-256), unless Config.Certificate is set. The kube-apiserver trusts any
// kubelet certificate when it runs without --kubelet-certificate-authority, which
// is how envtest starts it; pass a certificate signed by that CA otherwise. The
// server does not ask for a client certificate.
//
// # Lifetime
//
// Stop (or cancelling the context given to Start) closes the listener, every
// connection the API server opened, and every connection to a target, then waits
// for the handlers to return. Stopping a node's etcd member without stopping its
// stand-in is also fine: the forwarded connections see the member close and end.
package kubelet
