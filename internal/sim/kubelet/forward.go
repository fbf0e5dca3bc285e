package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
)

// podForwarder adapts ServePortForward's per-pod callback, which carries only
// the pod name, to ForwardFunc, which also needs the namespace from the URL.
type podForwarder struct {
	s         *Server
	namespace string
}

// PortForward implements portforward.PortForwarder.
func (f *podForwarder) PortForward(ctx context.Context, pod, _ string, port int32, stream io.ReadWriteCloser) error {
	return f.s.forward(ctx, f.namespace, pod, port, stream)
}

// forward connects one forwarded stream to its target and copies both ways
// until the target is done sending. An error returned here reaches the client
// on the stream pair's error stream, so it says what failed and where.
func (s *Server) forward(ctx context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error {
	if !s.begin() {
		return errors.New("kubelet stand-in is stopping")
	}
	defer s.wg.Done()

	addr, ok := s.cfg.Forward(namespace, pod, port)
	if !ok {
		return fmt.Errorf("no target for port %d of pod %s/%s on this node", port, namespace, pod)
	}

	// The SPDY path hands us context.Background(), so Stop must be able to
	// end the copy on its own: merge the two.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)()

	dialCtx, cancelDial := context.WithTimeout(ctx, dialTimeout)
	var d net.Dialer
	conn, err := d.DialContext(dialCtx, "tcp", addr)
	cancelDial()
	if err != nil {
		return fmt.Errorf("pod %s/%s port %d: %w", namespace, pod, port, err)
	}
	defer conn.Close()
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()

	// aborted marks a close we caused, so the copy below does not report
	// "use of closed network connection" as if the target had failed.
	var aborted atomic.Bool
	go func() {
		_, err := io.Copy(conn, stream)
		if err == nil {
			// The client finished sending: pass the half-close on, and keep
			// reading the target's reply until it closes too.
			if tcp, ok := conn.(*net.TCPConn); ok {
				_ = tcp.CloseWrite()
				return
			}
		}
		aborted.Store(true)
		_ = conn.Close()
	}()

	_, err = io.Copy(stream, conn)
	if err != nil && !aborted.Load() && ctx.Err() == nil {
		return fmt.Errorf("pod %s/%s port %d via %s: %w", namespace, pod, port, addr, err)
	}
	return nil
}
