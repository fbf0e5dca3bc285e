package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"
)

// ClientPort is the port kubeadm's etcd serves clients on.
const ClientPort = 2379

// Node is a control-plane node that hosts an etcd member named after it.
type Node struct {
	Name string
	// IP is the node's address, used by the direct dialer's endpoint template.
	IP string
}

// A Dialer opens a connection to the etcd client port of the member on a node.
type Dialer interface {
	DialContext(ctx context.Context, node Node) (net.Conn, error)
	// Target names where DialContext goes, for errors and logs.
	Target(node Node) string
}

// DirectDialer reaches members at an address of their own, rendered per node from a
// template such as "https://{{.NodeIP}}:2379".
type DirectDialer struct {
	tmpl   *template.Template
	dialer net.Dialer
}

// endpointData is what an endpoint template can use.
type endpointData struct {
	NodeName string
	NodeIP   string
}

// NewDirectDialer parses an endpoint template and checks that it renders an https URL
// with a host (the port defaults to 2379).
func NewDirectDialer(endpointTemplate string) (*DirectDialer, error) {
	tmpl, err := template.New("etcd-endpoint").Option("missingkey=error").Parse(endpointTemplate)
	if err != nil {
		return nil, fmt.Errorf("etcd endpoint template %q: %w", endpointTemplate, err)
	}
	d := &DirectDialer{tmpl: tmpl}
	if _, err := d.address(Node{Name: "node", IP: "192.0.2.1"}); err != nil {
		return nil, err
	}
	return d, nil
}

// address renders the template for node and returns host:port.
func (d *DirectDialer) address(node Node) (string, error) {
	var b bytes.Buffer
	if err := d.tmpl.Execute(&b, endpointData{NodeName: node.Name, NodeIP: node.IP}); err != nil {
		return "", fmt.Errorf("etcd endpoint template for node %s: %w", node.Name, err)
	}
	u, err := url.Parse(b.String())
	if err != nil {
		return "", fmt.Errorf("etcd endpoint %q for node %s: %w", b.String(), node.Name, err)
	}
	if u.Scheme != "https" || u.Hostname() == "" {
		return "", fmt.Errorf("etcd endpoint %q for node %s: want https://host[:port]", b.String(), node.Name)
	}
	port := u.Port()
	if port == "" {
		port = strconv.Itoa(ClientPort)
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

// DialContext connects to the rendered endpoint of node.
func (d *DirectDialer) DialContext(ctx context.Context, node Node) (net.Conn, error) {
	addr, err := d.address(node)
	if err != nil {
		return nil, err
	}
	return d.dialer.DialContext(ctx, "tcp", addr)
}

// Target is the rendered endpoint of node.
func (d *DirectDialer) Target(node Node) string {
	addr, err := d.address(node)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return "https://" + addr
}

// PortForwardDialer reaches the member on a node through the workload cluster's API
// server, by port-forwarding to the static pod kube-system/etcd-<node>, as KCP does. It
// needs nothing from the workload cluster's network but its API server.
type PortForwardDialer struct {
	config    *rest.Config
	pods      rest.Interface
	upgrader  spdy.Upgrader
	transport http.RoundTripper
}

// NewPortForwardDialer prepares port-forwarding with the given workload-cluster config.
func NewPortForwardDialer(config *rest.Config) (*PortForwardDialer, error) {
	core, err := corev1client.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("port-forward client: %w", err)
	}
	transport, upgrader, err := spdy.RoundTripperFor(config)
	if err != nil {
		return nil, fmt.Errorf("port-forward transport: %w", err)
	}
	return &PortForwardDialer{config: config, pods: core.RESTClient(), upgrader: upgrader, transport: transport}, nil
}

func podName(node Node) string { return "etcd-" + node.Name }

// Target names the pod and port forwarded to.
func (d *PortForwardDialer) Target(node Node) string {
	return fmt.Sprintf("port-forward %s/%s:%d", metav1.NamespaceSystem, podName(node), ClientPort)
}

// DialContext opens a port-forward stream to the member's client port. It tries the
// WebSocket protocol first and falls back to SPDY when the API server cannot upgrade to it,
// as kubectl port-forward does.
func (d *PortForwardDialer) DialContext(ctx context.Context, node Node) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", d.Target(node), context.Cause(ctx))
	}
	req := d.pods.Post().Namespace(metav1.NamespaceSystem).Resource("pods").Name(podName(node)).SubResource("portforward")
	httpClient := &http.Client{Transport: d.transport}
	if deadline, ok := ctx.Deadline(); ok {
		// The upgrade dialers take no context. The SPDY one honours the deadline through
		// its HTTP client; a WebSocket dial that outlives ctx is abandoned below.
		httpClient.Timeout = max(time.Millisecond, time.Until(deadline))
	}
	spdyDialer := spdy.NewDialerForStreaming(d.upgrader, httpClient, http.MethodPost, req.URL())
	wsDialer, err := portforward.NewSPDYOverWebsocketDialerForStreaming(req.URL(), d.config)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.Target(node), err)
	}
	dialer := portforward.NewFallbackDialerForStreaming(wsDialer, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})

	type result struct {
		conn httpstream.Connection
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		done <- result{conn, err}
	}()
	var conn httpstream.Connection
	select {
	case r := <-done:
		if r.err != nil {
			return nil, fmt.Errorf("%s: %w", d.Target(node), r.err)
		}
		conn = r.conn
	case <-ctx.Done():
		go func() {
			if r := <-done; r.conn != nil {
				r.conn.Close()
			}
		}()
		return nil, fmt.Errorf("%s: %w", d.Target(node), context.Cause(ctx))
	}

	stream, err := openForward(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", d.Target(node), err)
	}
	return stream, nil
}

// openForward opens the pair of streams the port-forward protocol needs for one
// connection and presents the data stream as a net.Conn.
func openForward(conn httpstream.Connection) (net.Conn, error) {
	headers := http.Header{}
	headers.Set(corev1.PortHeader, strconv.Itoa(ClientPort))
	headers.Set(corev1.PortForwardRequestIDHeader, "0")
	headers.Set(corev1.StreamType, corev1.StreamTypeError)
	errorStream, err := conn.CreateStream(headers)
	if err != nil {
		return nil, fmt.Errorf("creating error stream: %w", err)
	}
	// We never write to the error stream; the kubelet reports on it, e.g. when nothing
	// listens on the port in the pod.
	errorStream.Close()
	headers.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(headers)
	if err != nil {
		return nil, fmt.Errorf("creating data stream: %w", explain(errorStream, err))
	}
	return newForwardConn(conn, data, errorStream), nil
}

// explain prefers the kubelet's reason, if it sends one promptly, to the bare failure.
func explain(errorStream io.Reader, err error) error {
	msg := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(errorStream)
		msg <- b
	}()
	select {
	case b := <-msg:
		if len(b) > 0 {
			return fmt.Errorf("%w: %s", err, b)
		}
	case <-time.After(time.Second):
	}
	return err
}

// forwardConn bridges a port-forward data stream to a net.Pipe, so gRPC and TLS get real
// deadline semantics (a stream has none, and a timed-out read must not tear the tunnel down).
type forwardConn struct {
	net.Conn
	tunnel    httpstream.Connection
	closeOnce sync.Once

	mu        sync.Mutex
	remoteErr error
}

func newForwardConn(tunnel httpstream.Connection, data, errs httpstream.Stream) *forwardConn {
	local, remote := net.Pipe()
	c := &forwardConn{Conn: local, tunnel: tunnel}
	explained := make(chan struct{})
	go func() {
		defer close(explained)
		// The kubelet explains on the error stream why a forward failed, e.g. that nothing
		// listens on the port in the pod.
		if msg, _ := io.ReadAll(errs); len(msg) > 0 {
			c.mu.Lock()
			c.remoteErr = errors.New(string(msg))
			c.mu.Unlock()
		}
	}()
	go func() {
		_, _ = io.Copy(remote, data)
		// The explanation may trail the end of the data; give it a moment to arrive.
		select {
		case <-explained:
		case <-time.After(time.Second):
		}
		_ = remote.Close()
	}()
	go func() {
		_, _ = io.Copy(data, remote)
		c.closeTunnel()
	}()
	return c
}

// Read returns the kubelet's explanation instead of a bare EOF when the forward failed.
func (c *forwardConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	return n, c.explained(err)
}

// Write returns the kubelet's explanation instead of a closed pipe when the forward failed.
func (c *forwardConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	return n, c.explained(err)
}

func (c *forwardConn) explained(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.remoteErr != nil {
			return c.remoteErr
		}
	}
	return err
}

func (c *forwardConn) closeTunnel() {
	c.closeOnce.Do(func() { _ = c.tunnel.Close() })
}

// Close ends the local side and the tunnel with it.
func (c *forwardConn) Close() error {
	err := c.Conn.Close()
	c.closeTunnel()
	return err
}
