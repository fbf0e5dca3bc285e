package kubelet_test

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/cp-rollout/cp-rollout/internal/sim/kubelet"
)

// direct returns a client config and port-forward URL that talk to the
// stand-in itself, skipping the API server, as the API server's proxy would.
func direct(srv *kubelet.Server, namespace, pod string) (*rest.Config, *url.URL) {
	cfg := &rest.Config{
		Host:            "https://" + srv.Addr(),
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
	}
	return cfg, &url.URL{Scheme: "https", Host: srv.Addr(), Path: fmt.Sprintf("/portForward/%s/%s", namespace, pod)}
}

func TestStartValidates(t *testing.T) {
	fwd := routes(nil)
	for name, cfg := range map[string]kubelet.Config{
		"no IP":      {Forward: fwd},
		"bad IP":     {IP: "node-a", Forward: fwd},
		"no Forward": {IP: "127.0.0.1"},
		"bad port":   {IP: "127.0.0.1", Port: 70000, Forward: fwd},
	} {
		if srv, err := kubelet.Start(t.Context(), cfg); err == nil {
			srv.Stop()
			t.Errorf("%s: Start succeeded", name)
		}
	}
}

func TestDirectSPDY(t *testing.T) {
	const ip = "127.0.0.211"
	target := startEcho(t, ip, "member-a")
	srv := startStandIn(t, ip, routes(map[string]string{
		fmt.Sprintf("kube-system/etcd-a:%d", etcdPort): target,
	}))
	if srv.Port() == 0 {
		t.Fatal("Port() = 0 after Start with port 0")
	}

	cfg, u := direct(srv, "kube-system", "etcd-a")
	local := forwardLocal(t, spdyDialer(t, cfg, u))
	// Two connections over one session: each gets its own stream pair.
	roundTrip(t, local, "member-a", "hello", "again")
	roundTrip(t, local, "member-a", "second connection")

	// The uid form of the path is served too.
	u.Path += "/some-uid"
	roundTrip(t, forwardLocal(t, spdyDialer(t, cfg, u)), "member-a", "by uid")
}

// TestDirectWebSocketFallsBack shows why a Node must not declare
// ExtendWebSocketsToKubelet: the stand-in refuses tunnelled WebSocket with a
// clean upgrade failure, and kubectl's fallback dialer then uses SPDY.
func TestDirectWebSocketFallsBack(t *testing.T) {
	const ip = "127.0.0.212"
	target := startEcho(t, ip, "member-b")
	srv := startStandIn(t, ip, routes(map[string]string{
		fmt.Sprintf("kube-system/etcd-b:%d", etcdPort): target,
	}))
	cfg, u := direct(srv, "kube-system", "etcd-b")

	_, _, err := websocketDialer(t, cfg, u).Dial("portforward.k8s.io")
	// An upgrade failure is exactly what makes kubectl fall back to SPDY; the
	// message says what to fix.
	if !httpstream.IsUpgradeFailure(err) || !strings.Contains(err.Error(), "ExtendWebSocketsToKubelet") {
		t.Fatalf("tunnelled WebSocket: err = %v, want an upgrade failure naming ExtendWebSocketsToKubelet", err)
	}
	roundTrip(t, forwardLocal(t, fallbackDialer(t, cfg, u)), "member-b", "via fallback")
}

func TestUnknownTargetReportsError(t *testing.T) {
	const ip = "127.0.0.213"
	srv := startStandIn(t, ip, routes(nil))
	cfg, u := direct(srv, "kube-system", "etcd-missing")

	msg := forwardError(t, spdyDialer(t, cfg, u), etcdPort)
	if !strings.Contains(msg, "no target for port 2379 of pod kube-system/etcd-missing") {
		t.Fatalf("error stream = %q", msg)
	}
}

func TestTargetDownReportsError(t *testing.T) {
	const ip = "127.0.0.214"
	// Reserve a port and free it, so nothing listens there.
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()

	srv := startStandIn(t, ip, routes(map[string]string{fmt.Sprintf("kube-system/etcd-d:%d", etcdPort): dead}))
	cfg, u := direct(srv, "kube-system", "etcd-d")
	if msg := forwardError(t, spdyDialer(t, cfg, u), etcdPort); !strings.Contains(msg, "connection refused") {
		t.Fatalf("error stream = %q", msg)
	}
}

// TestStopEndsSessions checks that Stop does not hang on a live session and
// that the client sees its connection end.
func TestStopEndsSessions(t *testing.T) {
	const ip = "127.0.0.215"
	target := startEcho(t, ip, "member-e")
	srv := startStandIn(t, ip, routes(map[string]string{fmt.Sprintf("kube-system/etcd-e:%d", etcdPort): target}))
	cfg, u := direct(srv, "kube-system", "etcd-e")
	local := forwardLocal(t, spdyDialer(t, cfg, u))

	c, err := net.Dial("tcp", local)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("first reply: %v", err)
	}

	stopped := make(chan struct{})
	go func() { srv.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop hung with a live session")
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("read %q after Stop, want the connection closed", buf[:n])
	}
	srv.Stop() // idempotent

	if _, err := net.DialTimeout("tcp", srv.Addr(), time.Second); err == nil {
		t.Fatal("listener still accepting after Stop")
	}
}

func TestContextCancelStops(t *testing.T) {
	ctx, cancel := contextWithCancel(t)
	srv, err := kubelet.Start(ctx, kubelet.Config{IP: "127.0.0.216", Forward: routes(nil)})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", srv.Addr(), time.Second)
		if err != nil {
			break
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatal("still listening 10s after ctx was cancelled")
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv.Stop()
}

// TestStartWithDoneContext covers a caller whose context is already over: the
// server must come up and go down cleanly rather than leak or race.
func TestStartWithDoneContext(t *testing.T) {
	ctx, cancel := contextWithCancel(t)
	cancel()
	srv, err := kubelet.Start(ctx, kubelet.Config{IP: "127.0.0.217", Forward: routes(nil)})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if _, err := net.DialTimeout("tcp", srv.Addr(), time.Second); err == nil {
		t.Fatal("listening after Stop")
	}
}
