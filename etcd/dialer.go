package etcd

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	portforwardconst "k8s.io/apimachinery/pkg/util/portforward"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/websocket"
	"k8s.io/streaming/pkg/httpstream"
	streamspdy "k8s.io/streaming/pkg/httpstream/spdy"
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

// DefaultHandshakeTimeout bounds the port-forward upgrade of one connection, and the
// creation of its streams, when the caller's context allows longer or has no deadline.
const DefaultHandshakeTimeout = 30 * time.Second

// spdyPingPeriod is client-go's for SPDY port-forwards (transport/spdy.RoundTripperFor).
const spdyPingPeriod = 5 * time.Second

// PortForwardDialer reaches the member on a node through the workload cluster's API
// server, by port-forwarding to the static pod kube-system/etcd-<node>, as KCP does. It
// needs nothing from the workload cluster's network but its API server.
type PortForwardDialer struct {
	// HandshakeTimeout bounds each dial's upgrade and stream creation, within the
	// context's own deadline: an API server that accepts a connection and never
	// answers the upgrade would otherwise hold the dial, its goroutine and its socket
	// for good, one more at every reconnect. DefaultHandshakeTimeout when not positive.
	HandshakeTimeout time.Duration

	config    *rest.Config
	pods      rest.Interface
	tlsConfig *tls.Config
}

// NewPortForwardDialer prepares port-forwarding with the given workload-cluster config.
func NewPortForwardDialer(config *rest.Config) (*PortForwardDialer, error) {
	core, err := corev1client.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("port-forward client: %w", err)
	}
	tlsConfig, err := rest.TLSConfigFor(config)
	if err != nil {
		return nil, fmt.Errorf("port-forward transport: %w", err)
	}
	return &PortForwardDialer{HandshakeTimeout: DefaultHandshakeTimeout, config: config, pods: core.RESTClient(), tlsConfig: tlsConfig}, nil
}

func podName(node Node) string { return "etcd-" + node.Name }

// Target names the pod and port forwarded to.
func (d *PortForwardDialer) Target(node Node) string {
	return fmt.Sprintf("port-forward %s/%s:%d", metav1.NamespaceSystem, podName(node), ClientPort)
}

// DialContext opens a port-forward stream to the member's client port. It tries the
// WebSocket protocol first and falls back to SPDY when the API server cannot upgrade to it,
// as kubectl port-forward does.
//
// client-go's upgrade dialers take no context, and read the upgrade's answer with no
// deadline: the dial runs here, in the caller's goroutine, on requests that carry ctx
// bounded by HandshakeTimeout, and the connection is closed when ctx ends first. Nothing
// it opened outlives a failed dial.
func (d *PortForwardDialer) DialContext(ctx context.Context, node Node) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", d.Target(node), context.Cause(ctx))
	}
	timeout := d.HandshakeTimeout
	if timeout <= 0 {
		timeout = DefaultHandshakeTimeout
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout,
		fmt.Errorf("no answer to the port-forward upgrade within %s: %w", timeout, context.DeadlineExceeded))
	defer cancel()
	u := d.pods.Post().Namespace(metav1.NamespaceSystem).Resource("pods").Name(podName(node)).SubResource("portforward").URL()

	watch := &connWatch{}
	var conn httpstream.Connection
	err := untilDone(ctx, watch, func() (err error) {
		conn, err = d.upgradeWebSocket(ctx, u, watch)
		if httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err) {
			conn, err = d.upgradeSPDY(ctx, u, watch)
		}
		return err
	})
	if err == nil {
		var stream net.Conn
		// Creating a stream waits for the kubelet's reply, watching no context either.
		err = untilDone(ctx, conn, func() (err error) {
			stream, err = openForward(conn)
			return err
		})
		if err == nil {
			return stream, nil
		}
		if stream != nil { // made as ctx ended
			stream.Close()
		}
	}
	if conn != nil {
		conn.Close()
	}
	return nil, fmt.Errorf("%s: %w", d.Target(node), err)
}

// upgradeWebSocket is client-go's SPDY-over-WebSocket dial
// (tools/portforward.NewSPDYOverWebsocketDialerForStreaming) with ctx on its request:
// the WebSocket dialer bounds the upgrade by ctx's deadline, and tells watch the
// connection it dialled, which ends the wait when ctx is cancelled sooner.
func (d *PortForwardDialer) upgradeWebSocket(ctx context.Context, u *url.URL, watch *connWatch) (httpstream.Connection, error) {
	transport, holder, err := websocket.RoundTripperFor(d.config)
	if err != nil {
		return nil, err
	}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) { watch.set(info.Conn) }})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	ws, err := websocket.Negotiate(transport, holder, req, portforwardconst.WebsocketsSPDYTunnelingPrefix+portforward.PortForwardProtocolV1Name)
	if err != nil {
		return nil, err
	}
	return streamspdy.NewClientConnectionWithPings(portforward.NewTunnelingConnection("client", ws), portforward.PingPeriod)
}

// upgradeSPDY is client-go's SPDY dial (transport/spdy.RoundTripperFor and Negotiate)
// with ctx on its request. The SPDY round tripper's own RoundTrip reads the upgrade's
// answer with no deadline, on a connection nobody else can reach, and an http.Client's
// Timeout cannot interrupt a round tripper that does not watch its request's context;
// spdyUpgrade uses its Dial (TLS, proxies) and reads the answer itself, on a connection
// watch can close.
func (d *PortForwardDialer) upgradeSPDY(ctx context.Context, u *url.URL, watch *connWatch) (httpstream.Connection, error) {
	dialer, err := streamspdy.NewRoundTripperWithConfig(streamspdy.RoundTripperConfig{TLS: d.tlsConfig, Proxier: d.config.Proxy})
	if err != nil {
		return nil, err
	}
	upgrade := &spdyUpgrade{dialer: dialer, watch: watch}
	rt, err := rest.HTTPWrappersForConfig(d.config, upgrade)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Add(httpstream.HeaderProtocolVersion, portforward.PortForwardProtocolV1Name)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("error sending request: %w", err)
	}
	return upgrade.connection(resp)
}

// spdyUpgrade is the innermost round tripper of a SPDY upgrade: the authentication
// wrappers of the REST config go around it.
type spdyUpgrade struct {
	dialer *streamspdy.SpdyRoundTripper
	watch  *connWatch
	conn   net.Conn
}

func (u *spdyUpgrade) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Add(httpstream.HeaderConnection, httpstream.HeaderUpgrade)
	req.Header.Add(httpstream.HeaderUpgrade, streamspdy.HeaderSpdy31)
	conn, err := u.dialer.Dial(req) // connects and sends req
	if err != nil {
		return nil, err
	}
	u.watch.set(conn)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	u.conn = conn
	return resp, nil
}

// connection is the SPDY connection resp upgraded to, as the SPDY round tripper's
// NewConnection makes it.
func (u *spdyUpgrade) connection(resp *http.Response) (httpstream.Connection, error) {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols ||
		!headerHas(resp.Header, httpstream.HeaderConnection, httpstream.HeaderUpgrade) ||
		!headerHas(resp.Header, httpstream.HeaderUpgrade, streamspdy.HeaderSpdy31) {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		u.conn.Close()
		return nil, fmt.Errorf("unable to upgrade connection: %s", upgradeFailure(body))
	}
	return streamspdy.NewClientConnectionWithPings(u.conn, spdyPingPeriod)
}

func headerHas(h http.Header, key, value string) bool {
	return strings.Contains(strings.ToLower(h.Get(key)), strings.ToLower(value))
}

// upgradeFailure is the reason in the body of a refused upgrade: a Status's message,
// or the text.
func upgradeFailure(body []byte) string {
	var status struct{ Message, Error string }
	if json.Unmarshal(body, &status) == nil {
		for _, msg := range []string{status.Message, status.Error} {
			if msg = strings.TrimSpace(msg); msg != "" {
				return msg
			}
		}
	}
	if msg := strings.TrimSpace(string(body)); msg != "" {
		return msg
	}
	return "empty server response"
}

// connWatch closes, when told to, the connection an upgrade has dialled so far, and
// one dialled after that at once.
type connWatch struct {
	mu     sync.Mutex
	conn   io.Closer
	closed bool
}

func (w *connWatch) set(conn io.Closer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		_ = conn.Close()
		return
	}
	w.conn = conn
}

func (w *connWatch) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.conn == nil {
		return nil
	}
	return w.conn.Close()
}

// untilDone runs step, closing c if ctx ends first, which ends a wait inside step that
// watches no context. It returns ctx's cause when ctx ended first, step's error
// otherwise.
func untilDone(ctx context.Context, c io.Closer, step func() error) error {
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	err := step()
	if !stop() {
		return context.Cause(ctx)
	}
	if err != nil {
		// The WebSocket dialer sets ctx's deadline on its connection, whose read
		// can time out a moment before ctx's own timer fires.
		if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
			<-ctx.Done()
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
	}
	return err
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
