// Package requests answers "how many round trips did this run make, and to
// what?": HTTP requests to the management and the workload API servers
// (a watch counts once) and RPCs to etcd members.
// The counts close every run's summary, so a change that adds round trips to
// a rollout shows in its JSON.
package requests

import (
	"context"
	"net/http"
	"sync/atomic"

	"google.golang.org/grpc"
)

// Counter counts requests; the zero value is ready to use.
type Counter struct{ n atomic.Int64 }

// Load is how many requests were counted so far.
func (c *Counter) Load() int64 { return c.n.Load() }

// Wrap counts every request sent through rt; it is a client-go
// rest.Config.WrapTransport.
func (c *Counter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper{next: rt, c: c}
}

type roundTripper struct {
	next http.RoundTripper
	c    *Counter
}

func (t roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	t.c.n.Add(1)
	return t.next.RoundTrip(r)
}

// WrappedRoundTripper lets client-go see through the counter (it is an
// apimachinery net.RoundTripperWrapper): client-go cancels a request by
// walking its chain of round trippers, and logs "unable to cancel request"
// on the user's terminal at every one it cannot see through.
func (t roundTripper) WrappedRoundTripper() http.RoundTripper { return t.next }

// DialOptions count every RPC of a gRPC connection, unary or streaming.
func (c *Counter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.n.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.n.Add(1)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}
