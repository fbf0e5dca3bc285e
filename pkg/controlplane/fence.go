package controlplane

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// Fence stops a run's writes the moment its lock is no longer safely held.
// Every step checks the lock before it starts, but a step makes several
// writes (a delete puts the hook on, forwards leadership, deletes the
// Machine), and a renewal can fail between two of them: the fence checks the
// lock again right before each write leaves the process, to the management
// cluster, to the workload cluster and to etcd alike. What it fences is the
// sending: a write sent in time that a slow server (or an admission webhook)
// holds is applied when the server gets to it, which is why the run stops
// RenewDeadline after its last renewal, LeaseDuration-RenewDeadline before
// anyone may take its Lease over. Until Acquire arms it
// (on the Client that took the lock) it lets everything through, so reads
// and the preflight before the lock are unaffected.
type Fence struct {
	// Namespace and Lease name the run's own Lease, whose renewals and
	// release must go through even as the lock is being lost.
	Namespace, Lease string

	lock atomic.Pointer[runlock.Lock]
}

// arm makes every later write depend on l being held.
func (f *Fence) arm(l *runlock.Lock) { f.lock.Store(l) }

// Check fails once the armed lock is lost or about to be.
func (f *Fence) Check() error {
	if l := f.lock.Load(); l != nil {
		return l.Held()
	}
	return nil
}

// Wrap fences the writes of an API server client; it is a client-go
// rest.Config.WrapTransport. Reads go through: a stopping run may still look.
func (f *Fence) Wrap(rt http.RoundTripper) http.RoundTripper {
	return fencedTransport{next: rt, f: f}
}

type fencedTransport struct {
	next http.RoundTripper
	f    *Fence
}

func (t fencedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.f.fenced(r) {
		if err := t.f.Check(); err != nil {
			return nil, err
		}
	}
	return t.next.RoundTrip(r)
}

// WrappedRoundTripper lets client-go see through the fence, as it must to
// cancel a request (an apimachinery net.RoundTripperWrapper).
func (t fencedTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// fenced reports whether r is a write the lock must cover: any request but a
// read, except the run's own Lease and Events (the audit trail of the very
// stop). A port-forward only opens a stream: its SPDY form, a POST upgrade,
// is fenced here like any write, its websocket form, a GET, is not; either
// way every etcd request inside it is fenced on its own (DialOptions).
func (f *Fence) fenced(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	namespace, resource, name := namespacedPath(r.URL.Path)
	switch {
	case resource == "events":
		return false
	case resource == "leases" && namespace == f.Namespace && (name == f.Lease || name == ""):
		return false
	}
	return true
}

// namespacedPath splits an API path, /api/v1/namespaces/NS/RESOURCE[/NAME…]
// or /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME…]. Hand-written rather
// than apiserver's RequestInfoFactory, whose package would bring the API
// server's request machinery into the plugin for three path segments.
func namespacedPath(path string) (namespace, resource, name string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			namespace, resource = parts[i+1], parts[i+2]
			if i+3 < len(parts) {
				name = parts[i+3]
			}
			return namespace, resource, name
		}
	}
	return "", "", ""
}

// DialOptions fence every unary etcd RPC (all the tool makes: it watches
// nothing in etcd): after the lock is lost a run has nothing left to ask
// etcd, and the writes (moving leadership, removing a member) are the most
// consequential the tool makes.
func (f *Fence) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if err := f.Check(); err != nil {
				return err
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
	}
}
