package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
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
	// DialOptions are added to every member connection's (a request
	// counter's interceptors, say).
	DialOptions []grpc.DialOption
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

// forget closes the connections to the member on node, once it is removed:
// its etcd stops, and gRPC would otherwise keep redialling it in the
// background, through a new port-forward each time, until the machine is
// gone.
func (c *Client) forget(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, mc := range c.conns {
		if mc.node.Name == node {
			_ = mc.api.Close()
			delete(c.conns, key)
		}
	}
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

// etcdClient is clientv3 with Status sent over the connection already open to the member:
// clientv3's own Status dials its endpoint anew on every call, which through a
// port-forward would mean a new tunnel and TLS handshake per health probe.
type etcdClient struct{ *clientv3.Client }

func (c etcdClient) Status(ctx context.Context, _ string) (*clientv3.StatusResponse, error) {
	resp, err := etcdserverpb.NewMaintenanceClient(c.ActiveConnection()).Status(ctx, &etcdserverpb.StatusRequest{})
	return (*clientv3.StatusResponse)(resp), clientv3.ContextError(ctx, err)
}

// memberConn is a connection to the member on one node; every call through it is bounded
// and its errors name the node and the way it was reached.
type memberConn struct {
	node     Node
	target   string
	endpoint string
	api      api
	grpc     *grpc.ClientConn
	cfg      *Config

	mu      sync.Mutex
	lastErr error
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
	// The endpoint only gives gRPC a name: the dialer decides where connections go, and
	// the server certificate is checked against the CA, not against this name. It is the
	// name KCP uses, the member's static pod (etcd-<node>): a member sees it as TLS server
	// name and gRPC authority, and some backends route by it.
	mc := &memberConn{node: node, target: target, endpoint: podName(node), cfg: &c.cfg}
	tlsConfig := c.cfg.Credentials.TLSConfig()
	verify := tlsConfig.VerifyConnection
	tlsConfig.VerifyConnection = func(cs tls.ConnectionState) error {
		return mc.remember(verify(cs))
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{mc.endpoint},
		TLS:       tlsConfig,
		Logger:    c.cfg.Logger.With(zap.String("node", node.Name)),
		DialOptions: append([]grpc.DialOption{
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				ctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
				defer cancel()
				conn, err := c.cfg.Dialer.DialContext(ctx, node)
				if err != nil {
					return nil, mc.remember(err)
				}
				return &observedConn{Conn: conn, mc: mc}, nil
			}),
		}, c.cfg.DialOptions...),
	})
	if err != nil {
		return nil, &MemberError{Node: node.Name, Target: target, Op: "connect", Err: err}
	}
	mc.api, mc.grpc = etcdClient{cli}, cli.ActiveConnection()
	c.conns[key] = mc
	return mc, nil
}

// remember keeps the last dial or handshake failure: gRPC retries connections in the
// background and would otherwise only say that the deadline passed.
func (mc *memberConn) remember(err error) error {
	if err != nil {
		mc.mu.Lock()
		mc.lastErr = err
		mc.mu.Unlock()
	}
	return err
}

// observedConn remembers why a connection broke, such as a port-forward the kubelet
// could not complete, which gRPC would only log.
type observedConn struct {
	net.Conn
	mc *memberConn
}

func (c *observedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.observe(err)
	return n, err
}

func (c *observedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.observe(err)
	return n, err
}

func (c *observedConn) observe(err error) {
	var netErr net.Error
	switch {
	case err == nil, errors.Is(err, net.ErrClosed), errors.As(err, &netErr) && netErr.Timeout():
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrClosedPipe):
		c.mc.rememberFirst(errors.New("connection closed by the other end"))
	default:
		c.mc.remember(err)
	}
}

// rememberFirst keeps err unless a more telling failure is already known.
func (mc *memberConn) rememberFirst(err error) {
	mc.mu.Lock()
	defer mc.mu.Unlock()
	if mc.lastErr == nil {
		mc.lastErr = err
	}
}

// ready waits, at most the dial timeout, for a working connection. etcd's client waits
// for one until the call's deadline, which would spend a whole call timeout on a member
// that is down; this fails as soon as gRPC gives up on the connection attempt.
func (mc *memberConn) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, mc.cfg.DialTimeout)
	defer cancel()
	mc.grpc.Connect()
	for {
		state := mc.grpc.GetState()
		switch state {
		case connectivity.Ready:
			mc.mu.Lock()
			mc.lastErr = nil
			mc.mu.Unlock()
			return nil
		case connectivity.TransientFailure, connectivity.Shutdown:
			mc.mu.Lock()
			err := mc.lastErr
			mc.mu.Unlock()
			if err == nil {
				err = errors.New("connection failed")
			}
			var untrusted *UntrustedError
			if errors.As(err, &untrusted) {
				return untrusted // reached, but not to be trusted: no retry will change that
			}
			return &unreachableError{fmt.Errorf("unreachable: %w", err)}
		}
		if !mc.grpc.WaitForStateChange(ctx, state) {
			mc.mu.Lock()
			err := mc.lastErr
			mc.mu.Unlock()
			if err == nil {
				err = context.Cause(ctx)
			}
			return &unreachableError{fmt.Errorf("not reachable within %s: %w", mc.cfg.DialTimeout, err)}
		}
	}
}

// attempt makes one bounded call once the member is reachable.
func (mc *memberConn) attempt(ctx context.Context, op func(ctx context.Context) error) error {
	if err := mc.ready(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, mc.cfg.CallTimeout)
	defer cancel()
	return op(ctx)
}

func (mc *memberConn) fail(what string, err error) error {
	return &MemberError{Node: mc.node.Name, Target: mc.target, Op: what, Err: err}
}

// call runs op with the call timeout, retrying transient failures with backoff.
func (mc *memberConn) call(ctx context.Context, what string, op func(ctx context.Context) error) error {
	return retry(ctx, mc.cfg, func(ctx context.Context) error {
		return mc.attempt(ctx, op)
	}, func(err error) error { return mc.fail(what, err) })
}

// status asks the member for its own state, once: a member that does not answer is
// reported unhealthy, and a stopped member must not stall every listing by a round of
// retries.
func (mc *memberConn) status(ctx context.Context) (*clientv3.StatusResponse, error) {
	var resp *clientv3.StatusResponse
	err := mc.attempt(ctx, func(ctx context.Context) error {
		var err error
		resp, err = mc.api.Status(ctx, mc.endpoint)
		return err
	})
	if err != nil {
		return nil, mc.fail("status", err)
	}
	return resp, nil
}

// retry calls attempt until it succeeds, fails permanently or runs out of attempts.
// reconfigSettle bounds the brisk polling through etcd's post-join refusal of
// membership changes (five seconds, plus slack); reconfigPoll is its interval.
const (
	reconfigSettle = 8 * time.Second
	reconfigPoll   = 250 * time.Millisecond
)

func retry(ctx context.Context, cfg *Config, attempt func(context.Context) error, wrap func(error) error) error {
	delay := cfg.Backoff
	var err error
	// etcd refuses membership changes for five seconds after a member
	// (re)connects — every replacement's join triggers it. That refusal ends
	// at a known time, so it is polled briskly within its own budget instead
	// of backing off exponentially past the moment it lifts.
	settling := time.Now().Add(reconfigSettle)
	for i := 0; i < cfg.Attempts; i++ {
		if i > 0 {
			wait := delay
			if rpctypes.Error(err) == rpctypes.ErrUnhealthy && time.Now().Before(settling) {
				wait, i = reconfigPoll, i-1 // does not use up an attempt
			} else {
				delay *= 2
			}
			select {
			case <-ctx.Done():
				return wrap(fmt.Errorf("%w (last error: %v)", context.Cause(ctx), err))
			case <-time.After(wait):
			}
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
	var unreachable *unreachableError
	var round *roundError
	if errors.As(err, &unreachable) || errors.As(err, &round) {
		return true
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

// untrusted reports a TLS failure: ours, or one gRPC flattened into a status message.
func untrusted(err error) bool {
	var u *UntrustedError
	if errors.As(err, &u) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "authentication handshake failed") ||
		strings.Contains(msg, "certificate") && strings.Contains(msg, "x509")
}

// unreachableError is a member that could not be connected to; it may come back.
type unreachableError struct{ err error }

func (e *unreachableError) Error() string { return e.err.Error() }
func (e *unreachableError) Unwrap() error { return e.err }

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
