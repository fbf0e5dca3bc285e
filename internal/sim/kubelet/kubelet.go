package kubelet

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

const (
	// DefaultIdleTimeout matches the kubelet's default
	// streamingConnectionIdleTimeout, so an idle etcd client behind a
	// port-forward is cut at the same moment it would be in production.
	DefaultIdleTimeout = 4 * time.Hour

	// streamCreationTimeout is how long a client may take to open the error
	// stream after the data stream of the same pair; the kubelet uses 30s.
	streamCreationTimeout = 30 * time.Second

	// dialTimeout bounds the connection to a target. Targets are on loopback,
	// so anything slower than this means the member is wedged, and the client
	// should hear about it rather than wait on its own timeout.
	dialTimeout = 5 * time.Second
)

// ForwardFunc maps a forwarded port of a pod to the TCP address that serves it,
// for example ("kube-system", "etcd-node-a", 2379) → "127.0.0.2:2379".
// ok=false refuses the connection.
type ForwardFunc func(namespace, pod string, port int32) (addr string, ok bool)

// Config configures one node's kubelet stand-in.
type Config struct {
	// IP is the node's address, the one its Node lists as InternalIP. Required.
	IP string
	// Port to listen on; 0 picks a free one (read it back with Server.Port).
	Port int
	// Forward decides where each forwarded connection goes. Required.
	Forward ForwardFunc
	// Certificate serves TLS; nil generates a self-signed one for IP.
	Certificate *tls.Certificate
	// IdleTimeout closes a port-forward session with no traffic for this long;
	// 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration
}

// Server is a running kubelet stand-in. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	port    int
	httpSrv *http.Server

	// ctx is cancelled by Stop; forwarded connections close when it is.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards stopped, conns and stopAfter. Work (handlers, forwards)
	// registers in wg only while !stopped, which makes wg.Wait in Stop
	// race-free.
	mu      sync.Mutex
	stopped bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup

	stopAfter func() bool // unregisters the stop-on-ctx-done hook
	done      chan struct{}
}

// Start listens on cfg.IP:cfg.Port and serves the kubelet port-forward endpoints
//
//	/portForward/{namespace}/{pod}
//	/portForward/{namespace}/{pod}/{uid}
//
// (GET and POST, as the kubelet does) until Stop is called or ctx is done. The
// uid is accepted and ignored: Forward is keyed by name. Start returns once the
// port is bound, so the caller can publish Port() right away.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	ip := net.ParseIP(cfg.IP)
	if ip == nil {
		return nil, fmt.Errorf("kubelet stand-in: invalid IP %q", cfg.IP)
	}
	if cfg.Forward == nil {
		return nil, errors.New("kubelet stand-in: Forward is required")
	}
	if cfg.Port < 0 || cfg.Port > 65535 {
		return nil, fmt.Errorf("kubelet stand-in: invalid port %d", cfg.Port)
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	var cert tls.Certificate
	if cfg.Certificate != nil {
		cert = *cfg.Certificate
	} else {
		var err error
		if cert, err = selfSignedCertificate(ip, time.Now()); err != nil {
			return nil, fmt.Errorf("kubelet stand-in: %w", err)
		}
	}

	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("kubelet stand-in: listening on %s: %w", cfg.IP, err)
	}

	s := &Server{
		cfg:   cfg,
		port:  ln.Addr().(*net.TCPAddr).Port,
		conns: map[net.Conn]struct{}{},
		done:  make(chan struct{}),
	}
	// Detached from ctx on purpose: Stop must still close everything when ctx
	// is already done, and ctx ending is routed through Stop below.
	s.ctx, s.cancel = context.WithCancel(context.Background())

	mux := http.NewServeMux()
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		mux.HandleFunc(method+" /portForward/{namespace}/{pod}", s.handlePortForward)
		mux.HandleFunc(method+" /portForward/{namespace}/{pod}/{uid}", s.handlePortForward)
	}
	s.httpSrv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
	}
	tlsConfig := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// HTTP/1.1 only: SPDY and WebSocket upgrades hijack the connection,
		// which HTTP/2 cannot do. The API server's upgrade proxy speaks
		// HTTP/1.1 anyway; this keeps any other client from negotiating h2.
		NextProtos: []string{"http/1.1"},
	}

	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// Serve returns http.ErrServerClosed after Stop; any other error means
		// the listener broke, and there is nobody to report it to but the
		// clients, who will see connection refused.
		_ = s.httpSrv.Serve(tls.NewListener(&trackingListener{Listener: ln, s: s}, tlsConfig))
	}()
	// Under mu: if ctx is already done, Stop runs at once on another
	// goroutine and must not read stopAfter before it is set.
	s.mu.Lock()
	s.stopAfter = context.AfterFunc(ctx, s.Stop)
	s.mu.Unlock()
	return s, nil
}

// Port is the TCP port the server listens on; put it into the Node's
// status.daemonEndpoints.kubeletEndpoint.port.
func (s *Server) Port() int { return s.port }

// Addr is the host:port the server listens on.
func (s *Server) Addr() string {
	return net.JoinHostPort(s.cfg.IP, strconv.Itoa(s.port))
}

// Stop closes the listener, the API server's connections and every forwarded
// connection, and returns when all handlers have returned. It is idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		<-s.done
		return
	}
	s.stopped = true
	s.stopAfter()
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()

	s.cancel()
	// Close shuts the listener and idle connections but not hijacked ones,
	// which is every live port-forward session; those are closed by hand.
	_ = s.httpSrv.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	s.wg.Wait()
	close(s.done)
}

// begin registers one unit of work, unless the server is stopping.
func (s *Server) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return false
	}
	s.wg.Add(1)
	return true
}

func (s *Server) handlePortForward(w http.ResponseWriter, req *http.Request) {
	if !s.begin() {
		writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "kubelet stand-in is stopping")
		return
	}
	defer s.wg.Done()

	if wsstream.IsWebSocketRequestWithTunnelingProtocol(req) {
		// The API server only sends this when the Node declares
		// ExtendWebSocketsToKubelet; ServePortForward cannot untunnel it.
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest,
			"SPDY-over-WebSocket port-forward is not served by this kubelet stand-in: "+
				"do not declare ExtendWebSocketsToKubelet in the Node's status.declaredFeatures, "+
				"so the API server translates to SPDY")
		return
	}
	// Ports come from the query for the WebSocket channel protocol and from
	// stream headers for SPDY; NewV4Options handles both (empty for SPDY).
	opts, err := portforward.NewV4Options(req)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
		return
	}
	fwd := &podForwarder{s: s, namespace: req.PathValue("namespace")}
	portforward.ServePortForward(w, req, fwd, req.PathValue("pod"), req.PathValue("uid"), opts,
		s.cfg.IdleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
}

// writeStatus answers with a metav1.Status: client-go's WebSocket dialer
// decodes one into its error, so the message reaches the user instead of an
// empty "unable to upgrade streaming request".
func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	body, _ := json.Marshal(&metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   reason,
		Code:     int32(code),
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// trackingListener records every accepted connection so Stop can close the
// ones http.Server forgets once they are hijacked.
type trackingListener struct {
	net.Listener
	s *Server
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, s: l.s}
	l.s.mu.Lock()
	stopped := l.s.stopped
	if !stopped {
		l.s.conns[tc] = struct{}{}
	}
	l.s.mu.Unlock()
	if stopped {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	s    *Server
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}
