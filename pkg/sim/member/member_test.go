package member_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cp-rollout/cp-rollout/pkg/sim/member"
	"sigs.k8s.io/cluster-api/util/certs"
)

// TestJoinAsKubeadmDoes starts a member, joins a second one through it and a third that
// stays a learner, and checks what etcd itself reports.
func TestJoinAsKubeadmDoes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	start := func(name, ip string, existing []string, learner bool) *member.Member {
		t.Helper()
		m, err := member.Start(ctx, member.Config{
			Name: name, IP: ip, ClientPort: member.DefaultClientPort, PeerPort: member.DefaultPeerPort,
			CACert: caCert, CAKey: caKey, DataDir: t.TempDir(),
			ExistingClientURLs: existing, StayLearner: learner,
			TickMs: 10, ElectionMs: 100, UnsafeNoFsync: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(m.Stop)
		return m
	}
	a := start("node-a", "127.77.0.2", nil, false)
	if a.ClientURL() != "https://127.77.0.2:2379" {
		t.Fatalf("client URL %s", a.ClientURL())
	}
	b := start("node-b", "127.77.0.3", []string{a.ClientURL()}, false)
	start("node-c", "127.77.0.4", []string{a.ClientURL(), b.ClientURL()}, true)

	cli := client(t, caCert, caKey, a.ClientURL())
	list, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range list.Members {
		got[m.Name] = m.IsLearner
	}
	want := map[string]bool{"node-a": false, "node-b": false, "node-c": true}
	if len(got) != len(want) {
		t.Fatalf("members %v, want %v", got, want)
	}
	for name, learner := range want {
		if l, ok := got[name]; !ok || l != learner {
			t.Errorf("member %s: listed %v learner %v, want learner %v", name, ok, l, learner)
		}
	}

	// A member removed from the cluster stops by itself.
	if _, err := cli.MemberRemove(ctx, b.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-b.Stopped():
	case <-ctx.Done():
		t.Fatal("removed member kept running")
	}
}

func TestFreePorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	m, err := member.Start(ctx, member.Config{Name: "solo", IP: "127.77.1.2", CACert: caCert, CAKey: caKey,
		DataDir: t.TempDir(), TickMs: 10, ElectionMs: 100, UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	cli := client(t, caCert, caKey, m.ClientURL())
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
}

func client(t *testing.T, caCert, caKey []byte, endpoint string) *clientv3.Client {
	t.Helper()
	ca, err := certs.DecodeCertPEM(caCert)
	if err != nil {
		t.Fatal(err)
	}
	key, err := certs.DecodePrivateKeyPEM(caKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := certs.Config{CommonName: "test", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	clientKey, err := certs.NewPrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := cfg.NewSignedCert(clientKey, ca, key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		TLS: &tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: clientKey}},
			RootCAs:      pool,
			MinVersion:   tls.VersionTLS12,
		},
		Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func TestRestartRejoinsWithItsIdentity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cfg := func(name, ip string, existing ...string) member.Config {
		return member.Config{Name: name, IP: ip, CACert: caCert, CAKey: caKey, DataDir: t.TempDir(),
			ExistingClientURLs: existing, TickMs: 10, ElectionMs: 100, UnsafeNoFsync: true, RelaxedReconfigCheck: true}
	}
	a, err := member.Start(ctx, cfg("node-a", "127.77.2.2"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	b, err := member.Start(ctx, cfg("node-b", "127.77.2.3", a.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	id := b.ID()
	b.Stop()
	if err := b.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if b.ID() != id {
		t.Fatalf("restarted as member %x, was %x", b.ID(), id)
	}
	cli := client(t, caCert, caKey, b.ClientURL())
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	list, err := cli.MemberList(ctx)
	if err != nil || len(list.Members) != 2 {
		t.Fatalf("members after restart: %v %v", list, err)
	}
}
