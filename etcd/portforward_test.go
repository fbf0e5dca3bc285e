package etcd_test

import (
	"context"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiproxy "k8s.io/apimachinery/pkg/util/proxy"
	"k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/client-go/rest"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/klog/v2"
	"k8s.io/streaming/pkg/httpstream/wsstream"

	"github.com/cp-rollout/cp-rollout/etcd"
)

// fakeAPIServer serves pods/portforward the way a workload cluster does, from real
// Kubernetes parts: the kubelet's port-forward server (k8s.io/cri-streaming) on a server of
// its own, proxied by the API server's upgrade-aware handler and, from Kubernetes 1.31 on,
// its WebSocket tunnelling handler. Only the pod lookup is ours: etcd-<node> forwards to
// that node's member.
type fakeAPIServer struct {
	*httptest.Server
	pods      map[string]string
	websocket atomic.Int32
	spdy      atomic.Int32
}

func newFakeAPIServer(t *testing.T, tc *testCluster, tunnelling bool) *fakeAPIServer {
	// The kubelet and proxy parts log every refused forward; the tests check the errors.
	flags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(flags)
	_ = flags.Set("logtostderr", "false")
	_ = flags.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	s := &fakeAPIServer{pods: map[string]string{}}
	for name, m := range tc.members {
		s.pods["etcd-"+name] = strings.TrimPrefix(m.ClientURL(), "https://")
	}
	kubelet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		pod := strings.TrimPrefix(req.URL.Path, "/portForward/kube-system/")
		portforward.ServePortForward(w, req, s, pod, "", &portforward.V4Options{}, time.Minute, 10*time.Second, portforward.SupportedProtocols)
	}))
	t.Cleanup(kubelet.Close)

	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/namespaces/kube-system/pods/{pod}/portforward", func(w http.ResponseWriter, req *http.Request) {
		location, _ := url.Parse(kubelet.URL + "/portForward/kube-system/" + req.PathValue("pod"))
		var handler http.Handler = apiproxy.NewUpgradeAwareHandler(location, http.DefaultTransport, false, true, apiproxy.NewErrorResponder(responder{w}))
		if wsstream.IsWebSocketRequestWithTunnelingProtocol(req) {
			if !tunnelling {
				http.Error(w, "websocket upgrade not supported", http.StatusBadRequest)
				return
			}
			s.websocket.Add(1)
			handler = proxy.NewTunnelingHandler(handler)
		} else {
			s.spdy.Add(1)
		}
		handler.ServeHTTP(w, req)
	})
	s.Server = httptest.NewTLSServer(mux)
	t.Cleanup(s.Close)
	return s
}

type responder struct{ w http.ResponseWriter }

func (r responder) Error(err error) { http.Error(r.w, err.Error(), http.StatusBadGateway) }

// PortForward connects a forwarded stream to the member, as the kubelet connects it to the
// pod's port.
func (s *fakeAPIServer) PortForward(ctx context.Context, pod, _ string, port int32, stream io.ReadWriteCloser) error {
	addr, ok := s.pods[pod]
	if !ok || port != etcd.ClientPort {
		return fmt.Errorf("pod %s: nothing listens on port %d", pod, port)
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	var once sync.Once
	done := make(chan struct{})
	finish := func() { once.Do(func() { close(done) }) }
	go func() { _, _ = io.Copy(conn, stream); finish() }()
	go func() { _, _ = io.Copy(stream, conn); finish() }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

func (s *fakeAPIServer) restConfig() *rest.Config {
	return &rest.Config{
		Host: s.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}),
		},
	}
}

func portForwardClient(t *testing.T, tc *testCluster, s *fakeAPIServer) *etcd.Client {
	t.Helper()
	dialer, err := etcd.NewPortForwardDialer(s.restConfig())
	if err != nil {
		t.Fatal(err)
	}
	return tc.client(func(c *etcd.Config) { c.Dialer = dialer })
}

func TestPortForwardOverWebSocketReachesEveryMember(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 3)
	server := newFakeAPIServer(t, tc, true)
	c := portForwardClient(t, tc, server)

	members := mustMembers(t, ctx, c, tc.nodes)
	for _, m := range members {
		if !m.Healthy || m.Version == "" {
			t.Errorf("member %s through port-forward: healthy %v errors %v", m, m.Healthy, m.Errors)
		}
	}
	target := followers(members)[0]
	if err := c.MoveLeader(ctx, tc.nodes, target.ID); err != nil {
		t.Fatal(err)
	}
	if now, _ := etcd.Leader(mustMembers(t, ctx, c, tc.nodes)); now.ID != target.ID {
		t.Fatalf("leader is %s, want %s", now, target)
	}
	if server.websocket.Load() == 0 || server.spdy.Load() != 0 {
		t.Errorf("forwards over WebSocket %d, over SPDY %d; want WebSocket only", server.websocket.Load(), server.spdy.Load())
	}
}

func TestPortForwardFallsBackToSPDY(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 1)
	server := newFakeAPIServer(t, tc, false)
	c := portForwardClient(t, tc, server)
	if m := mustMembers(t, ctx, c, tc.nodes)[0]; !m.Healthy {
		t.Fatalf("member through SPDY: %v", m.Errors)
	}
	if server.spdy.Load() == 0 {
		t.Error("no forward over SPDY")
	}
}

func TestPortForwardToPodWithoutMemberNamesIt(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 1)
	server := newFakeAPIServer(t, tc, true)
	dialer, err := etcd.NewPortForwardDialer(server.restConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := tc.client(func(c *etcd.Config) { c.Dialer, c.Attempts = dialer, 2 })
	_, err = c.Members(ctx, []etcd.Node{{Name: "node-x"}})
	// The error names the pod and carries the kubelet's reason.
	if err == nil || !strings.Contains(err.Error(), "kube-system/etcd-node-x") || !strings.Contains(err.Error(), "nothing listens on port 2379") {
		t.Fatalf("listing through a pod without etcd: %v", err)
	}
}

// stalledAPIServer accepts connections and reads the upgrade request, and never
// answers it, as a wedged API server (or one behind a stuck load balancer) does; with
// refuseWebSocket it refuses the WebSocket upgrade at once, so the dialer falls back to
// SPDY, and stalls that. open counts its connections still open.
type stalledAPIServer struct {
	*httptest.Server
	open, seen atomic.Int32
}

func newStalledAPIServer(t *testing.T, refuseWebSocket bool) *stalledAPIServer {
	s := &stalledAPIServer{}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if refuseWebSocket && wsstream.IsWebSocketRequestWithTunnelingProtocol(req) {
			http.Error(w, "websocket upgrade not supported", http.StatusBadRequest)
			return
		}
		<-req.Context().Done() // until the client goes
	}))
	s.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		switch state {
		case http.StateNew:
			s.open.Add(1)
			s.seen.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.open.Add(-1)
		}
	}
	s.StartTLS()
	t.Cleanup(func() {
		s.CloseClientConnections()
		s.Close()
	})
	return s
}

func (s *stalledAPIServer) restConfig() *rest.Config {
	return &rest.Config{
		Host:            s.URL,
		BearerToken:     "admin-token",
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})},
	}
}

// settled waits until the stalled server holds no connection and the goroutines are
// back to at most baseline (plus a little for the runtime's own), and says what
// remains if they are not.
func settled(s *stalledAPIServer, baseline int) string {
	deadline := time.Now().Add(10 * time.Second)
	for {
		open, goroutines := s.open.Load(), runtime.NumGoroutine()
		if open == 0 && goroutines <= baseline+2 {
			return ""
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("%d connections still open on the server, %d goroutines (%d before the dials)", open, goroutines, baseline)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPortForwardDialToStalledServerLeavesNothing: against an API server that never
// answers the upgrade, over WebSocket or, after a refused WebSocket, over SPDY, a dial
// returns when its context ends — by deadline or by cancellation — and leaves neither a
// goroutine nor a connection behind: the etcd client redials at every reconnect, and
// each leaked dial would hold a socket on the API server for good.
func TestPortForwardDialToStalledServerLeavesNothing(t *testing.T) {
	const dials, bound = 4, 300 * time.Millisecond
	for _, tc := range []struct {
		name            string
		refuseWebSocket bool
	}{{"websocket", false}, {"spdy after a refused websocket", true}} {
		t.Run(tc.name, func(t *testing.T) {
			server := newStalledAPIServer(t, tc.refuseWebSocket)
			dialer, err := etcd.NewPortForwardDialer(server.restConfig())
			if err != nil {
				t.Fatal(err)
			}
			node := etcd.Node{Name: "cp-1"}
			baseline := runtime.NumGoroutine()
			for i := range dials {
				ctx, cancel := context.WithTimeout(context.Background(), bound)
				if i%2 == 1 { // cancelled, with no deadline
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(bound, cancel)
				}
				start := time.Now()
				conn, err := dialer.DialContext(ctx, node)
				took := time.Since(start)
				cancel()
				if err == nil {
					conn.Close()
					t.Fatal("a dial to a server that never answers succeeded")
				}
				if took > bound+2*time.Second {
					t.Errorf("dial %d returned after %s, its context ended after %s", i, took, bound)
				}
				if !strings.Contains(err.Error(), "port-forward kube-system/etcd-cp-1:2379") {
					t.Errorf("dial %d: the error does not name the target: %v", i, err)
				}
			}
			if server.seen.Load() < dials {
				t.Fatalf("the server saw %d connections for %d dials: the test did not reach it", server.seen.Load(), dials)
			}
			if left := settled(server, baseline); left != "" {
				t.Errorf("after %d dials: %s", dials, left)
			}
		})
	}
}

// TestPortForwardHandshakeTimeout: without a deadline of the caller's, the upgrade is
// still bounded, by HandshakeTimeout, and the dial says so.
func TestPortForwardHandshakeTimeout(t *testing.T) {
	server := newStalledAPIServer(t, false)
	dialer, err := etcd.NewPortForwardDialer(server.restConfig())
	if err != nil {
		t.Fatal(err)
	}
	if dialer.HandshakeTimeout != etcd.DefaultHandshakeTimeout {
		t.Errorf("HandshakeTimeout %s, want the default %s", dialer.HandshakeTimeout, etcd.DefaultHandshakeTimeout)
	}
	dialer.HandshakeTimeout = 300 * time.Millisecond
	baseline := runtime.NumGoroutine()
	start := time.Now()
	conn, err := dialer.DialContext(context.Background(), etcd.Node{Name: "cp-1"})
	if err == nil {
		conn.Close()
		t.Fatal("a dial to a server that never answers succeeded")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("dial returned after %s with a handshake timeout of 300ms", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer to the port-forward upgrade within 300ms") {
		t.Errorf("error %v: want the handshake timeout named, as a deadline", err)
	}
	if left := settled(server, baseline); left != "" {
		t.Error(left)
	}
}
