// Package member runs one real etcd member (go.etcd.io/etcd/server/v3/embed) the way a
// kubeadm control-plane node runs its stacked etcd, for the simulator and for tests of the
// product's etcd access.
//
// A member listens on its own address (a loopback address such as 127.0.0.N, one per
// simulated node) and speaks TLS only, with serving and peer certificates signed by the
// cluster's etcd CA (the `<cluster>-etcd` Secret). The first member bootstraps a new
// cluster; every later one joins as kubeadm does: MemberAddAsLearner through the existing
// members, start, then MemberPromote once it has caught up with the leader. Until it has
// started, a member added this way is listed with an empty name, exactly as in a real
// cluster.
//
//	ca, key, _ := member.NewCA()
//	first, err := member.Start(ctx, member.Config{Name: "node-a", IP: "127.0.0.2",
//		ClientPort: member.DefaultClientPort, PeerPort: member.DefaultPeerPort,
//		CACert: ca, CAKey: key, DataDir: dirA})
//	second, err := member.Start(ctx, member.Config{Name: "node-b", IP: "127.0.0.3", ...,
//		ExistingClientURLs: []string{first.ClientURL()}})
//	defer second.Stop()
//
// Stop stops a member and keeps its data, like a node that goes down; Restart brings it
// back with its identity, like a node that reboots. A member removed from the cluster
// stops by itself, as etcd does; Stopped tells when.
//
// Ports: 0 picks a free port on the member's address. The simulator uses the kubeadm ports
// (DefaultClientPort, DefaultPeerPort) on a distinct address per node; tests that run in
// parallel with other packages should use addresses of their own (127.x.y.z) so fixed ports
// never collide.
package member

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// The ports kubeadm configures for stacked etcd.
const (
	DefaultClientPort = 2379
	DefaultPeerPort   = 2380
)

// Config describes one member.
type Config struct {
	// Name is the member name; kubeadm uses the node name, and the product relies on it.
	Name string
	// IP is the address the member listens and advertises on, e.g. "127.0.0.2".
	IP string
	// ClientPort and PeerPort default to a free port on IP when 0.
	ClientPort, PeerPort int

	// CACert and CAKey are the PEM contents of the cluster's etcd CA.
	CACert, CAKey []byte

	// DataDir holds the member's data and its certificates; it must be private to the member.
	DataDir string

	// ExistingClientURLs are client URLs of members already in the cluster. Empty means this
	// member bootstraps a new cluster.
	ExistingClientURLs []string

	// StayLearner leaves a joining member unpromoted, as a node whose kubeadm join stopped
	// half-way would.
	StayLearner bool

	// TickMs and ElectionMs override etcd's heartbeat interval and election timeout
	// (100 ms / 1000 ms); tests shorten them so elections and transfers settle quickly.
	TickMs, ElectionMs uint

	// QuotaBackendBytes sets etcd's backend quota; a tiny value makes the next write raise
	// a NOSPACE alarm. 0 keeps etcd's default.
	QuotaBackendBytes int64

	// UnsafeNoFsync trades durability for speed on shared test machines.
	UnsafeNoFsync bool

	// RelaxedReconfigCheck turns off etcd's strict reconfiguration check. With it on (etcd's
	// and kubeadm's default) the cluster refuses MemberAdd and MemberRemove with "unhealthy
	// cluster" until every member it counts on has been connected for five seconds, which
	// makes each join after the second wait that long.
	RelaxedReconfigCheck bool

	// Logger receives etcd's logs; nil discards them.
	Logger *zap.Logger
}

// Member is an etcd member started by Start.
type Member struct {
	cfg       Config
	ca        *authority
	ip        net.IP
	id        uint64
	clientURL string
	peerURL   string

	mu      sync.Mutex
	etcd    *embed.Etcd
	stopped bool
}

// joinTimeout bounds each etcd call made while joining; the whole Start is bounded by ctx.
const joinCallTimeout = 5 * time.Second

// Start starts the member and returns once it serves clients and, when joining, once it is
// a voting member (unless Config.StayLearner).
func Start(ctx context.Context, cfg Config) (*Member, error) {
	if cfg.Name == "" || cfg.IP == "" || cfg.DataDir == "" {
		return nil, errors.New("etcd member: name, IP and data directory are required")
	}
	ip := net.ParseIP(cfg.IP)
	if ip == nil {
		return nil, fmt.Errorf("etcd member %s: %q is not an IP address", cfg.Name, cfg.IP)
	}
	ca, err := parseAuthority(cfg.CACert, cfg.CAKey)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
	}
	clientPort, err := portOrFree(cfg.IP, cfg.ClientPort)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: client port: %w", cfg.Name, err)
	}
	peerPort, err := portOrFree(cfg.IP, cfg.PeerPort)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: peer port: %w", cfg.Name, err)
	}
	m := &Member{
		cfg:       cfg,
		ca:        ca,
		ip:        ip,
		clientURL: "https://" + net.JoinHostPort(cfg.IP, strconv.Itoa(clientPort)),
		peerURL:   "https://" + net.JoinHostPort(cfg.IP, strconv.Itoa(peerPort)),
	}

	ec, err := m.embedConfig()
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
	}

	var joined uint64
	if len(cfg.ExistingClientURLs) > 0 {
		admin, err := adminClient(ca, cfg.ExistingClientURLs)
		if err != nil {
			return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
		}
		defer admin.Close()
		initial, id, err := m.addAsLearner(ctx, admin)
		if err != nil {
			return nil, fmt.Errorf("etcd member %s: join: %w", cfg.Name, err)
		}
		joined = id
		ec.ClusterState = embed.ClusterStateFlagExisting
		ec.InitialCluster = initial
		defer func() {
			if m.etcd == nil {
				// Leave no unstartable member behind to block the next learner.
				rctx, cancel := context.WithTimeout(context.Background(), joinCallTimeout)
				defer cancel()
				_, _ = admin.MemberRemove(rctx, joined)
			}
		}()
	}

	if err := m.launch(ctx, ec); err != nil {
		return nil, err
	}

	if joined != 0 && !cfg.StayLearner {
		admin, err := adminClient(ca, append([]string{m.clientURL}, cfg.ExistingClientURLs...))
		if err == nil {
			err = promote(ctx, admin, joined)
			admin.Close()
		}
		if err != nil {
			m.Stop()
			return nil, fmt.Errorf("etcd member %s: promote: %w", cfg.Name, err)
		}
	}
	return m, nil
}

// launch starts etcd and waits until it serves clients.
func (m *Member) launch(ctx context.Context, ec *embed.Config) error {
	e, err := embed.StartEtcd(ec)
	if err != nil {
		return fmt.Errorf("etcd member %s: start: %w", m.cfg.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcd member %s: %w", m.cfg.Name, err)
	case <-ctx.Done():
		e.Close()
		return fmt.Errorf("etcd member %s: waiting to serve: %w", m.cfg.Name, context.Cause(ctx))
	}
	m.mu.Lock()
	m.etcd, m.stopped = e, false
	m.mu.Unlock()
	m.id = uint64(e.Server.MemberID())
	return nil
}

// Restart starts a stopped member again from its data directory, as a rebooted node
// does; it rejoins with its old identity.
func (m *Member) Restart(ctx context.Context) error {
	m.mu.Lock()
	stopped := m.stopped
	m.mu.Unlock()
	if !stopped {
		return fmt.Errorf("etcd member %s: restart: still running", m.cfg.Name)
	}
	ec, err := m.embedConfig()
	if err != nil {
		return fmt.Errorf("etcd member %s: %w", m.cfg.Name, err)
	}
	// With data on disk etcd ignores the initial cluster; "existing" keeps it from
	// trying to bootstrap one.
	ec.ClusterState = embed.ClusterStateFlagExisting
	return m.launch(ctx, ec)
}

func (m *Member) embedConfig() (*embed.Config, error) {
	ca, ip := m.ca, m.ip
	pki := filepath.Join(m.cfg.DataDir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, err
	}
	ips := []net.IP{ip, net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	dns := []string{m.cfg.Name, "localhost"}
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	server, err := ca.issue(m.cfg.Name, ips, dns, usages)
	if err != nil {
		return nil, err
	}
	peer, err := ca.issue(m.cfg.Name, ips, dns, usages)
	if err != nil {
		return nil, err
	}
	serverCrt, serverKey, err := writePair(pki, "server", server)
	if err != nil {
		return nil, err
	}
	peerCrt, peerKey, err := writePair(pki, "peer", peer)
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(pki, "ca.crt")
	if err := os.WriteFile(caFile, m.cfg.CACert, 0o600); err != nil {
		return nil, err
	}

	ec := embed.NewConfig()
	ec.Name = m.cfg.Name
	ec.Dir = filepath.Join(m.cfg.DataDir, "etcd")
	clientURL, _ := url.Parse(m.clientURL)
	peerURL, _ := url.Parse(m.peerURL)
	ec.ListenClientUrls = []url.URL{*clientURL}
	ec.AdvertiseClientUrls = []url.URL{*clientURL}
	ec.ListenPeerUrls = []url.URL{*peerURL}
	ec.AdvertisePeerUrls = []url.URL{*peerURL}
	ec.InitialCluster = m.cfg.Name + "=" + m.peerURL
	ec.InitialClusterToken = "cp-rollout-sim"
	ec.ClusterState = embed.ClusterStateFlagNew
	// Like kubeadm's static pod: client certificate authentication on both sides.
	ec.ClientTLSInfo.CertFile, ec.ClientTLSInfo.KeyFile = serverCrt, serverKey
	ec.ClientTLSInfo.TrustedCAFile = caFile
	ec.ClientTLSInfo.ClientCertAuth = true
	ec.PeerTLSInfo.CertFile, ec.PeerTLSInfo.KeyFile = peerCrt, peerKey
	ec.PeerTLSInfo.TrustedCAFile = caFile
	ec.PeerTLSInfo.ClientCertAuth = true
	if m.cfg.TickMs > 0 {
		ec.TickMs = m.cfg.TickMs
	}
	if m.cfg.ElectionMs > 0 {
		ec.ElectionMs = m.cfg.ElectionMs
	}
	ec.QuotaBackendBytes = m.cfg.QuotaBackendBytes
	ec.UnsafeNoFsync = m.cfg.UnsafeNoFsync
	ec.StrictReconfigCheck = !m.cfg.RelaxedReconfigCheck
	logger := m.cfg.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(logger.With(zap.String("member", m.cfg.Name)))
	return ec, nil
}

// addAsLearner registers this member with the running cluster and returns the
// initial-cluster string etcd needs to start as part of it. A member already registered
// under this peer URL (a join that was interrupted) is reused, as kubeadm does.
func (m *Member) addAsLearner(ctx context.Context, admin *clientv3.Client) (string, uint64, error) {
	var members []*memberEntry
	var id uint64
	err := retry(ctx, func(ctx context.Context) (bool, error) {
		list, err := admin.MemberList(ctx)
		if err != nil {
			return true, err
		}
		for _, existing := range list.Members {
			if len(existing.PeerURLs) > 0 && existing.PeerURLs[0] == m.peerURL {
				id = existing.ID
				members = entries(list.Members)
				return false, nil
			}
		}
		resp, err := admin.MemberAddAsLearner(ctx, []string{m.peerURL})
		if err != nil {
			// One learner at a time and a healthy quorum: both pass with time.
			return true, err
		}
		id = resp.Member.ID
		members = entries(resp.Members)
		return false, nil
	})
	if err != nil {
		return "", 0, err
	}
	var initial []string
	for _, e := range members {
		name := e.name
		switch {
		case e.id == id:
			name = m.cfg.Name
		case name == "":
			// Another member that has not started yet still needs a unique name here.
			name = strconv.FormatUint(e.id, 16)
		}
		for _, u := range e.peerURLs {
			initial = append(initial, name+"="+u)
		}
	}
	return strings.Join(initial, ","), id, nil
}

type memberEntry struct {
	id       uint64
	name     string
	peerURLs []string
}

func entries[T interface {
	GetID() uint64
	GetName() string
	GetPeerURLs() []string
}](list []T) []*memberEntry {
	out := make([]*memberEntry, 0, len(list))
	for _, x := range list {
		out = append(out, &memberEntry{id: x.GetID(), name: x.GetName(), peerURLs: x.GetPeerURLs()})
	}
	return out
}

// promote retries until the learner has caught up with the leader, which etcd checks
// before it accepts the promotion.
func promote(ctx context.Context, admin *clientv3.Client, id uint64) error {
	return retry(ctx, func(ctx context.Context) (bool, error) {
		_, err := admin.MemberPromote(ctx, id)
		if err == nil || errors.Is(err, rpctypes.ErrMemberNotLearner) {
			return false, nil
		}
		return true, err
	})
}

// retry calls op until it succeeds, reports a permanent failure, or ctx ends.
func retry(ctx context.Context, op func(context.Context) (again bool, err error)) error {
	delay := 50 * time.Millisecond
	for {
		callCtx, cancel := context.WithTimeout(ctx, joinCallTimeout)
		again, err := op(callCtx)
		cancel()
		if err == nil || !again {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", context.Cause(ctx), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// adminClient speaks to the cluster as kubeadm does during join, with a certificate
// signed by the etcd CA.
func adminClient(ca *authority, endpoints []string) (*clientv3.Client, error) {
	cert, err := ca.issue("cp-rollout-sim-join", nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	if err != nil {
		return nil, err
	}
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: joinCallTimeout,
		TLS: &tls.Config{
			Certificates: []tls.Certificate{cert},
			RootCAs:      ca.pool,
			MinVersion:   tls.VersionTLS12,
		},
		Logger: zap.NewNop(),
	})
}

// portOrFree returns port, or a port free on ip right now when port is 0.
func portOrFree(ip string, port int) (int, error) {
	if port != 0 {
		return port, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Name is the member name (the node name).
func (m *Member) Name() string { return m.cfg.Name }

// ID is the member ID etcd assigned.
func (m *Member) ID() uint64 { return m.id }

// ClientURL is the https URL clients reach this member at.
func (m *Member) ClientURL() string { return m.clientURL }

// PeerURL is the https URL other members reach this member at.
func (m *Member) PeerURL() string { return m.peerURL }

// Stopped is closed once the member has stopped, whether by Stop or by itself (a member
// removed from the cluster shuts down). After Restart, call it again for the new run.
func (m *Member) Stopped() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd.Server.StopNotify()
}

// Stop stops the member and keeps its data directory. It is safe to call more than once.
func (m *Member) Stop() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.stopped {
		m.stopped = true
		m.etcd.Close()
	}
}
