// Package member runs one real etcd member the way a kubeadm control-plane node runs its
// stacked etcd, for the simulator and for tests of the product's etcd access.
//
// Each member is its own OS process running the etcd binary (v3.6.14, from the envtest
// binaries; see AssetsDir), as the static pod is on a node. In production an etcd that
// crashes takes down that member only; run in-process it would take the whole simulator
// or test with it, and etcd does panic on some requests that reach a member in the moment
// between its removal from the cluster and its shutdown. The child runs in a process group
// of its own and is killed when its parent dies, so no member outlives the process that
// started it, even one killed with SIGKILL. etcd's log lines go to Config.Logger.
//
// A member listens on its own address (a loopback address such as 127.0.0.N, one per
// simulated node) and speaks TLS only, with serving and peer certificates signed by the
// cluster's etcd CA (the `<cluster>-etcd` Secret), written to the member's data directory
// as kubeadm writes them to the node's disk; the CA key never is. The first member
// bootstraps a new cluster; every later one joins as kubeadm does: MemberAddAsLearner
// through the existing members, start, then MemberPromote once it has caught up with the
// leader. Until it has started, a member added this way is listed with an empty name,
// exactly as in a real cluster.
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
// stops by itself, as etcd does, and a crashed one is gone too; Stopped tells when.
//
// Ports: 0 picks a free port on the member's address (chosen before etcd starts, since
// it takes explicit URLs). The simulator uses the kubeadm ports
// (DefaultClientPort, DefaultPeerPort) on a distinct address per node; tests that run in
// parallel with other packages should use addresses of their own (127.x.y.z) so fixed ports
// never collide.
package member

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
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

	// Logger receives etcd's log lines, its entries at their own level (panic and fatal
	// ones at error) and anything else it prints, such as a crash's stack, at error; nil
	// discards them.
	Logger *zap.Logger
}

// Member is an etcd member started by Start.
type Member struct {
	cfg                  Config
	ca                   *authority
	bin                  string
	id                   uint64
	clientURL            string
	peerURL              string
	clientPort, peerPort int

	mu   sync.Mutex
	proc *process
}

// joinCallTimeout bounds each etcd call made while joining; the whole Start is bounded
// by ctx.
const joinCallTimeout = 5 * time.Second

// Start starts the member and returns once it serves clients and, when joining, once it is
// a voting member (unless Config.StayLearner).
func Start(ctx context.Context, cfg Config) (*Member, error) {
	if cfg.Name == "" || cfg.IP == "" || cfg.DataDir == "" {
		return nil, errors.New("etcd member: name, IP and data directory are required")
	}
	if net.ParseIP(cfg.IP) == nil {
		return nil, fmt.Errorf("etcd member %s: %q is not an IP address", cfg.Name, cfg.IP)
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cfg.Logger = cfg.Logger.With(zap.String("member", cfg.Name))
	ca, err := parseAuthority(cfg.CACert, cfg.CAKey)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
	}
	bin, err := etcdBinary()
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
	}
	// The etcd binary takes explicit URLs, so free ports are picked here; fixed ports are
	// checked here too, so that a taken one fails Start with the listen error
	// (EADDRINUSE) before this member is added to the cluster.
	ports, err := reservePorts(cfg.IP, cfg.ClientPort, cfg.PeerPort)
	if err != nil {
		return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
	}
	clientPort, peerPort := ports[0], ports[1]
	m := &Member{
		cfg:        cfg,
		ca:         ca,
		bin:        bin,
		clientURL:  "https://" + net.JoinHostPort(cfg.IP, strconv.Itoa(clientPort)),
		peerURL:    "https://" + net.JoinHostPort(cfg.IP, strconv.Itoa(peerPort)),
		clientPort: clientPort,
		peerPort:   peerPort,
	}

	state, initial := "new", m.cfg.Name+"="+m.peerURL
	var joined uint64
	if len(cfg.ExistingClientURLs) > 0 {
		admin, err := adminClient(ca, cfg.ExistingClientURLs)
		if err != nil {
			return nil, fmt.Errorf("etcd member %s: %w", cfg.Name, err)
		}
		defer admin.Close()
		if err := awaitClusterVersion(ctx, ca, cfg.ExistingClientURLs); err != nil {
			return nil, fmt.Errorf("etcd member %s: join: %w", cfg.Name, err)
		}
		initial, joined, err = m.addAsLearner(ctx, admin)
		if err != nil {
			return nil, fmt.Errorf("etcd member %s: join: %w", cfg.Name, err)
		}
		state = "existing"
		defer func() {
			if m.proc == nil {
				// Leave no unstartable member behind to block the next learner.
				rctx, cancel := context.WithTimeout(context.Background(), joinCallTimeout)
				defer cancel()
				_, _ = admin.MemberRemove(rctx, joined)
			}
		}()
	}

	if err := m.launch(ctx, state, initial); err != nil {
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

// launch starts etcd and waits until it serves clients, which etcd does once it has
// joined the raft group and published its name (a learner too).
func (m *Member) launch(ctx context.Context, state, initialCluster string) error {
	args, err := m.args(state, initialCluster)
	if err != nil {
		return fmt.Errorf("etcd member %s: %w", m.cfg.Name, err)
	}
	proc, err := startProcess(m.bin, args, m.cfg.Logger)
	if err != nil {
		return fmt.Errorf("etcd member %s: start: %w", m.cfg.Name, err)
	}
	id, err := waitServing(ctx, m.ca, m.clientURL, proc)
	if err != nil {
		proc.stop()
		return fmt.Errorf("etcd member %s: %w", m.cfg.Name, err)
	}
	m.mu.Lock()
	m.proc, m.id = proc, id
	m.mu.Unlock()
	return nil
}

// errExited cancels the wait for a member whose process has ended.
var errExited = errors.New("etcd exited before serving clients")

// waitServing polls the member's own Status until it answers, and returns its ID.
func waitServing(ctx context.Context, ca *authority, clientURL string, proc *process) (uint64, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-proc.done:
			cancel(errExited)
		case <-ctx.Done():
		}
	}()
	cli, err := adminClient(ca, []string{clientURL})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	var id uint64
	err = retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := cli.Status(ctx, clientURL)
		if err != nil {
			return true, err
		}
		id = resp.Header.MemberId
		return false, nil
	})
	if err != nil {
		if errors.Is(context.Cause(ctx), errExited) {
			return 0, proc.exited()
		}
		return 0, fmt.Errorf("waiting to serve: %w", err)
	}
	return id, nil
}

// Restart starts a stopped member again from its data directory, as a rebooted node
// does; it rejoins with its old identity. The member may have stopped by Stop, by itself
// or by a crash.
func (m *Member) Restart(ctx context.Context) error {
	select {
	case <-m.Stopped():
	default:
		return fmt.Errorf("etcd member %s: restart: still running", m.cfg.Name)
	}
	if _, err := reservePorts(m.cfg.IP, m.clientPort, m.peerPort); err != nil {
		return fmt.Errorf("etcd member %s: restart: %w", m.cfg.Name, err)
	}
	// With data on disk etcd ignores the initial cluster; "existing" keeps it from
	// trying to bootstrap one.
	return m.launch(ctx, "existing", m.cfg.Name+"="+m.peerURL)
}

// args writes the member's certificates and returns the etcd command line, the flags
// kubeadm's static pod manifest sets plus the tuning of Config.
func (m *Member) args(state, initialCluster string) ([]string, error) {
	ca := m.ca
	pki := filepath.Join(m.cfg.DataDir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, err
	}
	ips := []net.IP{net.ParseIP(m.cfg.IP), net.IPv4(127, 0, 0, 1), net.IPv6loopback}
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
	// The CA certificate only: a node's etcd never needs the CA key.
	caFile := filepath.Join(pki, "ca.crt")
	if err := os.WriteFile(caFile, m.cfg.CACert, 0o600); err != nil {
		return nil, err
	}

	args := []string{
		"--name=" + m.cfg.Name,
		"--data-dir=" + filepath.Join(m.cfg.DataDir, "etcd"),
		"--listen-client-urls=" + m.clientURL,
		"--advertise-client-urls=" + m.clientURL,
		"--listen-peer-urls=" + m.peerURL,
		"--initial-advertise-peer-urls=" + m.peerURL,
		"--initial-cluster=" + initialCluster,
		"--initial-cluster-token=cp-rollout-sim",
		"--initial-cluster-state=" + state,
		// Like kubeadm's static pod: client certificate authentication on both sides.
		"--cert-file=" + serverCrt,
		"--key-file=" + serverKey,
		"--trusted-ca-file=" + caFile,
		"--client-cert-auth=true",
		"--peer-cert-file=" + peerCrt,
		"--peer-key-file=" + peerKey,
		"--peer-trusted-ca-file=" + caFile,
		"--peer-client-cert-auth=true",
		"--strict-reconfig-check=" + strconv.FormatBool(!m.cfg.RelaxedReconfigCheck),
		"--quota-backend-bytes=" + strconv.FormatInt(m.cfg.QuotaBackendBytes, 10),
		"--unsafe-no-fsync=" + strconv.FormatBool(m.cfg.UnsafeNoFsync),
		// JSON on stderr is what the parent forwards to Config.Logger.
		"--logger=zap",
		"--log-outputs=stderr",
		"--log-format=json",
	}
	if m.cfg.TickMs > 0 {
		args = append(args, "--heartbeat-interval="+strconv.FormatUint(uint64(m.cfg.TickMs), 10))
	}
	if m.cfg.ElectionMs > 0 {
		args = append(args, "--election-timeout="+strconv.FormatUint(uint64(m.cfg.ElectionMs), 10))
	}
	return args, nil
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

// awaitClusterVersion waits until a running member reports the cluster version. etcd
// decides it shortly after the first election, and a member that joins before then
// exits at once ("incompatible with current running cluster", isCompatibleWithCluster
// in etcdserver/cluster_util.go). On a node kubelet would restart it; here the join
// waits instead, which is what kubeadm's minutes between init and join amount to.
func awaitClusterVersion(ctx context.Context, ca *authority, clientURLs []string) error {
	cert, err := ca.issue("cp-rollout-sim-join", nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: ca.pool, MinVersion: tls.VersionTLS12,
	}}}
	defer hc.CloseIdleConnections()
	return retry(ctx, func(ctx context.Context) (bool, error) {
		var last error
		for _, u := range clientURLs {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/version", nil)
			if err != nil {
				return false, err
			}
			resp, err := hc.Do(req)
			if err != nil {
				last = err
				continue
			}
			var v version.Versions
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			switch {
			case err != nil:
				last = err
			case v.Cluster == "" || v.Cluster == "not_decided":
				last = fmt.Errorf("%s has not decided the cluster version yet", u)
			default:
				return false, nil
			}
		}
		return true, last
	})
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
		// gRPC waits a second after a refused connection and longer after each next
		// one; a member whose process is still starting refuses a few, and every start
		// would pay for that backoff.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: joinCallTimeout,
		})},
	})
}

// reservePorts returns the given ports, each 0 replaced by a port free on ip right now,
// after checking that every one can be listened on. The listeners stay open until all
// are chosen, so two free ports never come out the same; they are closed again for etcd
// to take.
func reservePorts(ip string, ports ...int) ([]int, error) {
	out := make([]int, 0, len(ports))
	for _, port := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			return nil, err
		}
		defer l.Close()
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// Name is the member name (the node name).
func (m *Member) Name() string { return m.cfg.Name }

// ID is the member ID etcd assigned.
func (m *Member) ID() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.id
}

// ClientURL is the https URL clients reach this member at.
func (m *Member) ClientURL() string { return m.clientURL }

// PeerURL is the https URL other members reach this member at.
func (m *Member) PeerURL() string { return m.peerURL }

// Stopped is closed once the member's etcd process has exited, whether by Stop, by itself
// (a member removed from the cluster shuts down) or by a crash. After Restart, call it
// again for the new run.
func (m *Member) Stopped() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc.done
}

// Stop stops the member and keeps its data directory: SIGTERM, as the kubelet stops a
// static pod, then SIGKILL when etcd has not exited within a grace period. It returns
// once the process is gone and is safe to call more than once.
func (m *Member) Stop() {
	m.mu.Lock()
	proc := m.proc
	m.mu.Unlock()
	proc.stop()
}
