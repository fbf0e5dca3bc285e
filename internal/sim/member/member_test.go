package member_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/cp-rollout/cp-rollout/internal/sim/member"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"sigs.k8s.io/cluster-api/util/certs"
)

// TestJoinAsKubeadmDoes starts a member, joins a second one through it and a third that
// stays a learner, and checks what etcd itself reports.
// It uses the kubeadm ports, on a loopback /24 no other test takes.
func TestJoinAsKubeadmDoes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := simtest.AddressPrefix(t)
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
	a := start("node-a", prefix+".2", nil, false)
	if a.ClientURL() != "https://"+prefix+".2:2379" {
		t.Fatalf("client URL %s", a.ClientURL())
	}
	b := start("node-b", prefix+".3", []string{a.ClientURL()}, false)
	start("node-c", prefix+".4", []string{a.ClientURL(), b.ClientURL()}, true)

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
	removeAndWait(ctx, t, cli, b)
}

func TestFreePorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := simtest.AddressPrefix(t)
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	m, err := member.Start(ctx, member.Config{Name: "solo", IP: prefix + ".2", CACert: caCert, CAKey: caKey,
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

// removeAndWait removes m from the cluster and waits until it has stopped by itself, as
// etcd does once it learns it was removed.
func removeAndWait(ctx context.Context, t *testing.T, cli *clientv3.Client, m *member.Member) {
	t.Helper()
	if _, err := cli.MemberRemove(ctx, m.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.Stopped():
	case <-ctx.Done():
		t.Fatal("removed member kept running")
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
	prefix := simtest.AddressPrefix(t)
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cfg := func(name, ip string, existing ...string) member.Config {
		return member.Config{Name: name, IP: ip, CACert: caCert, CAKey: caKey, DataDir: t.TempDir(),
			ExistingClientURLs: existing, TickMs: 10, ElectionMs: 100, UnsafeNoFsync: true, RelaxedReconfigCheck: true}
	}
	a, err := member.Start(ctx, cfg("node-a", prefix+".2"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	b, err := member.Start(ctx, cfg("node-b", prefix+".3", a.ClientURL()))
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

// TestRemovedMemberFailsAlone removes a member while Status calls hammer it. etcd v3.6
// can panic answering one in the moment between its removal and its shutdown ("failed to
// find local ID in cluster members"); that must end the member, as it ends the static pod
// on a node, and never the process that started it.
func TestRemovedMemberFailsAlone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	prefix := simtest.AddressPrefix(t)
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := func(name, ip string, existing ...string) member.Config {
		return member.Config{Name: name, IP: ip, CACert: caCert, CAKey: caKey, DataDir: t.TempDir(),
			ExistingClientURLs: existing, TickMs: 10, ElectionMs: 100, UnsafeNoFsync: true, RelaxedReconfigCheck: true,
			Logger: zap.New(core)}
	}
	a, err := member.Start(ctx, cfg("node-a", prefix+".2"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	b, err := member.Start(ctx, cfg("node-b", prefix+".3", a.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)

	// As the monitors do: probe the member over and over, from several connections'
	// worth of goroutines, until it is gone.
	probe := client(t, caCert, caKey, b.ClientURL())
	var calls atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-b.Stopped():
					return
				default:
				}
				callCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				_, _ = probe.Status(callCtx, b.ClientURL())
				cancel()
				calls.Add(1)
			}
		})
	}
	for calls.Load() < 50 {
		time.Sleep(time.Millisecond)
	}

	cli := client(t, caCert, caKey, a.ClientURL())
	removeAndWait(ctx, t, cli, b)
	wg.Wait()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("remaining member after the removal: %v", err)
	}
	panicked := logs.FilterMessageSnippet("failed to find local ID").Len() > 0
	t.Logf("%d Status calls; the removed member panicked: %v", calls.Load(), panicked)
}

// TestTakenPortFailsStart: the simulator moves a node to another address when its ports
// are taken, which it recognises by the listen error.
func TestTakenPortFailsStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prefix := simtest.AddressPrefix(t)
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	taken, err := net.Listen("tcp", prefix+".2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, err = member.Start(ctx, member.Config{Name: "late", IP: prefix + ".2", ClientPort: taken.Addr().(*net.TCPAddr).Port,
		CACert: caCert, CAKey: caKey, DataDir: t.TempDir()})
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("start on a taken port: %v, want EADDRINUSE", err)
	}
}
