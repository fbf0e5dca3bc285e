package etcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults for Config, the same as KCP's.
const (
	DefaultDialTimeout = 10 * time.Second
	DefaultCallTimeout = 15 * time.Second
	// DefaultAttempts and DefaultBackoff retry for 7.5 s in all, longer than the five
	// seconds etcd's strict reconfiguration check may refuse a membership change for.
	DefaultAttempts = 5
	DefaultBackoff  = 500 * time.Millisecond
)

// Config configures a Client.
type Config struct {
	// Dialer reaches the member on a node.
	Dialer Dialer
	// Credentials authenticate the tool and verify the members.
	Credentials *Credentials
	// DialTimeout bounds opening a connection to one member, and a health probe of one.
	DialTimeout time.Duration
	// CallTimeout bounds each call to etcd (each attempt, when retried).
	CallTimeout time.Duration
	// Attempts is how often a call that failed transiently is tried in all.
	Attempts int
	// Backoff is the wait before the first retry; it doubles with each retry.
	Backoff time.Duration
	// Logger receives the etcd client library's logs; nil discards them.
	Logger *zap.Logger
}

// Client speaks to the etcd members of one workload cluster. Every operation takes the
// control-plane nodes as they are now, so callers pass what they have just read.
type Client struct {
	cfg Config

	mu    sync.Mutex
	conns map[string]*memberConn
}

// New returns a Client; it connects lazily, member by member.
func New(cfg Config) (*Client, error) {
	if cfg.Dialer == nil || cfg.Credentials == nil {
		return nil, errors.New("etcd client needs a dialer and credentials")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = DefaultAttempts
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Client{cfg: cfg, conns: map[string]*memberConn{}}, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for key, mc := range c.conns {
		errs = append(errs, mc.api.Close())
		delete(c.conns, key)
	}
	return errors.Join(errs...)
}

// api is the part of clientv3 this package uses; *clientv3.Client provides it.
type api interface {
	MemberList(ctx context.Context, opts ...clientv3.OpOption) (*clientv3.MemberListResponse, error)
	MemberRemove(ctx context.Context, id uint64) (*clientv3.MemberRemoveResponse, error)
	MoveLeader(ctx context.Context, transfereeID uint64) (*clientv3.MoveLeaderResponse, error)
	Status(ctx context.Context, endpoint string) (*clientv3.StatusResponse, error)
	AlarmList(ctx context.Context) (*clientv3.AlarmResponse, error)
	Close() error
}

// memberConn is a connection to the member on one node; every call through it is bounded
// and its errors name the node and the way it was reached.
type memberConn struct {
	node     Node
	target   string
	endpoint string
	api      api
	cfg      *Config
}

// conn returns the cached connection to node's member, creating it if needed.
func (c *Client) conn(node Node) (*memberConn, error) {
	target := c.cfg.Dialer.Target(node)
	key := node.Name + "\x00" + target
	c.mu.Lock()
	defer c.mu.Unlock()
	if mc, ok := c.conns[key]; ok {
		return mc, nil
	}
	dialer := c.cfg.Dialer
	dialTimeout := c.cfg.DialTimeout
	// The endpoint only gives gRPC a name: the dialer decides where connections go, and
	// the server certificate is checked against the CA, not against this name.
	endpoint := "https://etcd-" + node.Name + ".invalid:2379"
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{endpoint},
		TLS:       c.cfg.Credentials.TLSConfig(),
		Logger:    c.cfg.Logger.With(zap.String("node", node.Name)),
		DialOptions: []grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				ctx, cancel := context.WithTimeout(ctx, dialTimeout)
				defer cancel()
				return dialer.DialContext(ctx, node)
			}),
		},
	})
	if err != nil {
		return nil, &MemberError{Node: node.Name, Target: target, Op: "connect", Err: err}
	}
	mc := &memberConn{node: node, target: target, endpoint: endpoint, api: cli, cfg: &c.cfg}
	c.conns[key] = mc
	return mc, nil
}

// call runs op with the call timeout, retrying transient failures with backoff.
func (mc *memberConn) call(ctx context.Context, what string, op func(ctx context.Context) error) error {
	return retry(ctx, mc.cfg, func(ctx context.Context) error {
		callCtx, cancel := context.WithTimeout(ctx, mc.cfg.CallTimeout)
		defer cancel()
		return op(callCtx)
	}, func(err error) error {
		return &MemberError{Node: mc.node.Name, Target: mc.target, Op: what, Err: err}
	})
}

// status asks the member for its own state. A probe is not retried: a member that does not
// answer within the dial timeout is reported unhealthy, and a stopped member must not stall
// every listing by a whole round of retries.
func (mc *memberConn) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, min(mc.cfg.DialTimeout, mc.cfg.CallTimeout))
	defer cancel()
	resp, err := mc.api.Status(ctx, mc.endpoint)
	if err != nil {
		return nil, &MemberError{Node: mc.node.Name, Target: mc.target, Op: "status", Err: err}
	}
	return resp, nil
}

// retry calls attempt until it succeeds, fails permanently or runs out of attempts.
func retry(ctx context.Context, cfg *Config, attempt func(context.Context) error, wrap func(error) error) error {
	delay := cfg.Backoff
	var err error
	for i := 0; i < cfg.Attempts; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return wrap(fmt.Errorf("%w (last error: %v)", context.Cause(ctx), err))
			case <-time.After(delay):
			}
			delay *= 2
		}
		err = attempt(ctx)
		if err == nil || !transient(ctx, err) {
			break
		}
	}
	if err == nil {
		return nil
	}
	return wrap(err)
}

// transient tells failures worth another attempt: the member or its leader is busy or
// briefly unreachable. A certificate the CA does not trust, a missing member or a refused
// request are final.
func transient(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if untrusted(err) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// Our own call timeout; the caller's context is still alive.
		return true
	}
	switch rpctypes.Error(err) {
	case rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrNotCapable,
		rpctypes.ErrStopped, rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail,
		rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrTimeoutWaitAppliedIndex,
		rpctypes.ErrUnhealthy, rpctypes.ErrTooManyRequests:
		// ErrUnhealthy is etcd's strict reconfiguration check: it refuses membership
		// changes until the members it counts on have been connected for five seconds.
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

// untrusted reports a TLS failure; gRPC flattens it into a status message.
func untrusted(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "authentication handshake failed") ||
		strings.Contains(msg, "certificate") && strings.Contains(msg, "x509")
}

// MemberError is an etcd failure on one member, naming it, its node and how it was reached.
type MemberError struct {
	Op string
	// Member is the member's name; empty when the failure happened before it was known.
	Member string
	ID     uint64
	Node   string
	// Target is how the node was reached (endpoint or port-forward).
	Target string
	Err    error
}

func (e *MemberError) Error() string {
	var b strings.Builder
	b.WriteString("etcd")
	if e.Member != "" || e.ID != 0 {
		b.WriteString(" member ")
		b.WriteString(describeMember(e.Member, e.ID))
	}
	if e.Node != "" {
		b.WriteString(" on node ")
		b.WriteString(e.Node)
	}
	if e.Target != "" {
		b.WriteString(" (")
		b.WriteString(e.Target)
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.Op)
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *MemberError) Unwrap() error { return e.Err }

func describeMember(name string, id uint64) string {
	if name == "" {
		name = "(not started)"
	}
	if id == 0 {
		return name
	}
	return fmt.Sprintf("%s [%x]", name, id)
}
