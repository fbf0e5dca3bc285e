package etcd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
)

// testCluster is a real etcd cluster of embedded members, one per simulated node, each on
// its own loopback address with the kubeadm ports.
type testCluster struct {
	t       *testing.T
	caCert  []byte
	caKey   []byte
	prefix  string
	members map[string]*member.Member
	nodes   []etcd.Node
}

// newTestCluster starts n members on a loopback /24 of the test's own, so tests (and
// other packages') never collide on the fixed ports.
func newTestCluster(t *testing.T, n int, opts ...func(*member.Config)) *testCluster {
	t.Helper()
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, caCert: caCert, caKey: caKey, prefix: simtest.AddressPrefix(t), members: map[string]*member.Member{}}
	for i := range n {
		tc.start(fmt.Sprintf("node-%c", 'a'+i), opts...)
	}
	return tc
}

func (tc *testCluster) ip(name string) string {
	return fmt.Sprintf("%s.%d", tc.prefix, 2+int(name[len(name)-1]-'a'))
}

// start starts the member of node name, joining the running ones.
func (tc *testCluster) start(name string, opts ...func(*member.Config)) *member.Member {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var existing []string
	for _, m := range tc.members {
		existing = append(existing, m.ClientURL())
	}
	cfg := member.Config{
		Name: name, IP: tc.ip(name),
		ClientPort: member.DefaultClientPort, PeerPort: member.DefaultPeerPort,
		CACert: tc.caCert, CAKey: tc.caKey, DataDir: tc.t.TempDir(),
		ExistingClientURLs: existing,
		TickMs:             10, ElectionMs: 100, UnsafeNoFsync: true,
		RelaxedReconfigCheck: true,
	}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := member.Start(ctx, cfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(m.Stop)
	tc.members[name] = m
	tc.nodes = append(tc.nodes, etcd.Node{Name: name, IP: cfg.IP})
	return m
}

// client is the product's client to this cluster, reaching members directly.
func (tc *testCluster) client(opts ...func(*etcd.Config)) *etcd.Client {
	tc.t.Helper()
	creds, err := etcd.NewCredentials(tc.caCert, tc.caKey, "")
	if err != nil {
		tc.t.Fatal(err)
	}
	dialer, err := etcd.NewDirectDialer("https://{{.NodeIP}}:2379")
	if err != nil {
		tc.t.Fatal(err)
	}
	cfg := etcd.Config{Dialer: dialer, Credentials: creds, DialTimeout: 2 * time.Second, CallTimeout: 5 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := etcd.New(cfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { c.Close() })
	return c
}

// raw is a plain clientv3 client for arranging what the product must then observe.
func (tc *testCluster) raw(endpoints ...string) *clientv3.Client {
	tc.t.Helper()
	creds, err := etcd.NewCredentials(tc.caCert, tc.caKey, "")
	if err != nil {
		tc.t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: creds.TLSConfig(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { cli.Close() })
	return cli
}

func (tc *testCluster) node(name string) etcd.Node {
	for _, n := range tc.nodes {
		if n.Name == name {
			return n
		}
	}
	tc.t.Fatalf("no node %s", name)
	return etcd.Node{}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustMembers(t *testing.T, ctx context.Context, c *etcd.Client, nodes []etcd.Node) []etcd.Member {
	t.Helper()
	members, err := c.Members(ctx, nodes)
	if err != nil {
		t.Fatal(err)
	}
	return members
}

// followers are the voting members that do not lead, in the order listed.
func followers(members []etcd.Member) []etcd.Member {
	var out []etcd.Member
	for _, m := range members {
		if m.Voting() && !m.Leader {
			out = append(out, m)
		}
	}
	return out
}

func named(t *testing.T, members []etcd.Member, name string) etcd.Member {
	t.Helper()
	m, ok := etcd.MemberByName(members, name)
	if !ok {
		t.Fatalf("member %s not listed in %v", name, members)
	}
	return m
}
