package kubelet_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/cp-rollout/cp-rollout/internal/sim/kubelet"
)

// etcdPort is the pod port every test forwards, as the tool does for etcd.
const etcdPort = 2379

// startEcho runs a line echo server on ip that prefixes each reply with tag, so
// a test can tell which node's target answered. It closes a connection when
// the client half-closes, like a server that is done, which lets tests check
// that a half-close travels through the whole chain.
func startEcho(t *testing.T, ip, tag string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatalf("echo listen on %s: %v", ip, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s: %s\n", tag, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// routes is a static Forward table keyed by "namespace/pod:port".
func routes(table map[string]string) kubelet.ForwardFunc {
	return func(namespace, pod string, port int32) (string, bool) {
		addr, ok := table[fmt.Sprintf("%s/%s:%d", namespace, pod, port)]
		return addr, ok
	}
}

func startStandIn(t *testing.T, ip string, fwd kubelet.ForwardFunc) *kubelet.Server {
	t.Helper()
	srv, err := kubelet.Start(t.Context(), kubelet.Config{IP: ip, Forward: fwd})
	if err != nil {
		t.Fatalf("starting kubelet stand-in on %s: %v", ip, err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// spdyDialer dials url with plain SPDY, as KCP's etcd proxy dialer does.
func spdyDialer(t *testing.T, cfg *rest.Config, u *url.URL) httpstream.Dialer {
	t.Helper()
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatalf("spdy round tripper: %v", err)
	}
	return spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
}

// websocketDialer dials url with SPDY tunnelled over WebSocket, the first
// choice of kubectl and client-go's fallback dialer.
func websocketDialer(t *testing.T, cfg *rest.Config, u *url.URL) httpstream.Dialer {
	t.Helper()
	d, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, cfg)
	if err != nil {
		t.Fatalf("websocket dialer: %v", err)
	}
	return d
}

// fallbackDialer is what kubectl v0.36 port-forward builds: WebSocket first,
// SPDY when the upgrade is refused. It must be the k8s.io/streaming flavour:
// client-go v0.36's WebSocket round tripper reports a refused upgrade as
// k8s.io/streaming's UpgradeFailureError, which apimachinery's
// httpstream.IsUpgradeFailure does not recognise, so the apimachinery-typed
// NewFallbackDialer never falls back.
func fallbackDialer(t *testing.T, cfg *rest.Config, u *url.URL) httpstream.Dialer {
	t.Helper()
	return portforward.NewFallbackDialerForStreaming(websocketDialer(t, cfg, u), spdyDialer(t, cfg, u), func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// forwardLocal runs a client-go PortForwarder for remote port etcdPort and
// returns the local address it listens on. The forwarder stops at cleanup.
func forwardLocal(t *testing.T, dialer httpstream.Dialer) string {
	t.Helper()
	stop, ready := make(chan struct{}), make(chan struct{})
	var out, errOut strings.Builder
	pf, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", etcdPort)}, stop, ready, io.Discard, &errOut)
	if err != nil {
		t.Fatalf("port forwarder: %v", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- pf.ForwardPorts() }()
	t.Cleanup(func() {
		close(stop)
		<-errc
	})
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("port forward ended before ready: %v (%s%s)", err, out.String(), errOut.String())
	case <-time.After(30 * time.Second):
		t.Fatal("port forward not ready after 30s")
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("forwarded ports: %v %v", ports, err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local)
}

// roundTrip sends lines through local and checks each comes back tagged by the
// expected target, then half-closes and expects the target's close to arrive.
func roundTrip(t *testing.T, local, tag string, lines ...string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", local, 5*time.Second)
	if err != nil {
		t.Fatalf("dial forwarded port: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	for _, line := range lines {
		if _, err := fmt.Fprintln(c, line); err != nil {
			t.Fatalf("write %q: %v", line, err)
		}
		got, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read reply to %q: %v", line, err)
		}
		if want := tag + ": " + line + "\n"; got != want {
			t.Fatalf("reply = %q, want %q", got, want)
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatalf("half-close: %v", err)
	}
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Fatalf("after half-close: got %q, %v; want a clean EOF", rest, err)
	}
}

// forwardError opens one port-forward stream pair by hand, as client-go does,
// and returns what the server wrote on its error stream: the reason a forward
// failed, which PortForwarder itself only logs.
func forwardError(t *testing.T, dialer httpstream.Dialer, port int) string {
	t.Helper()
	conn, proto, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	if proto != portforward.PortForwardProtocolV1Name {
		t.Fatalf("negotiated %q", proto)
	}
	h := http.Header{}
	h.Set("port", fmt.Sprint(port))
	h.Set("requestID", "0")
	h.Set("streamType", "error")
	errStream, err := conn.CreateStream(h)
	if err != nil {
		t.Fatalf("error stream: %v", err)
	}
	_ = errStream.Close() // read-only for the client
	h.Set("streamType", "data")
	if data, err := conn.CreateStream(h); err != nil {
		// A refused forward resets the data stream as soon as it arrives,
		// which can beat the reply the client waits for. The error stream
		// still carries the reason.
		t.Logf("data stream: %v", err)
	} else {
		defer data.Reset()
	}
	return readAllWithin(t, errStream, 10*time.Second)
}

func readAllWithin(t *testing.T, r io.Reader, d time.Duration) string {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(r)
		ch <- result{b, err}
	}()
	select {
	case res := <-ch:
		if res.err != nil && !errors.Is(res.err, io.EOF) {
			t.Logf("read: %v", res.err)
		}
		return string(res.b)
	case <-time.After(d):
		t.Fatalf("no EOF within %s", d)
		return ""
	}
}

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	return context.WithCancel(t.Context())
}
