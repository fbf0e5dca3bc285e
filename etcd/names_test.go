package etcd_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"sigs.k8s.io/cluster-api/util/certs"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

// heard is what a member is told of the name it is dialled under.
type heard struct {
	mu                    sync.Mutex
	serverName, authority string
}

// loopbackDialer sends every member's connection to one listener.
type loopbackDialer struct{ addr string }

func (d loopbackDialer) DialContext(ctx context.Context, _ etcd.Node) (net.Conn, error) {
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", d.addr)
}
func (d loopbackDialer) Target(etcd.Node) string { return d.addr }

// TestMembersAreDialledUnderKCPsNames checks the TLS server name and the gRPC
// authority a member sees: KCP names a member etcd-<node>, and backends that
// route by that name (CAPI's in-memory provider) refuse any other.
func TestMembersAreDialledUnderKCPsNames(t *testing.T) {
	t.Parallel()
	caPEM, caKeyPEM, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	serverCert := issueServerCert(t, caPEM, caKeyPEM)
	var got heard
	tlsConfig := &tls.Config{
		Certificates: []tls.Certificate{serverCert},
		ClientAuth:   tls.RequireAnyClientCert,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			got.mu.Lock()
			got.serverName = hello.ServerName
			got.mu.Unlock()
			return nil, nil
		},
	}
	server := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsConfig)),
		grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
			md, _ := metadata.FromIncomingContext(stream.Context())
			got.mu.Lock()
			if a := md.Get(":authority"); len(a) > 0 {
				got.authority = a[0]
			}
			got.mu.Unlock()
			return errors.New("this stand-in only listens")
		}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(lis) }()
	t.Cleanup(server.Stop)

	creds, err := etcd.NewCredentials(caPEM, caKeyPEM, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := etcd.New(etcd.Config{Dialer: loopbackDialer{lis.Addr().String()}, Credentials: creds,
		DialTimeout: 5 * time.Second, CallTimeout: 5 * time.Second, Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Each call fails (the stand-in answers nothing); on a loaded machine one
	// may time out before its request reaches the stand-in, so ask until it
	// has heard a request or a minute has passed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for heardRequest := false; !heardRequest && ctx.Err() == nil; {
		_, _ = c.Members(ctx, []etcd.Node{{Name: "ip-10-0-0-7", IP: "10.0.0.7"}})
		got.mu.Lock()
		heardRequest = got.authority != ""
		got.mu.Unlock()
	}

	got.mu.Lock()
	defer got.mu.Unlock()
	if got.serverName != "etcd-ip-10-0-0-7" || got.authority != "etcd-ip-10-0-0-7" {
		t.Fatalf("member dialled as server name %q, authority %q; want etcd-ip-10-0-0-7 for both, as KCP", got.serverName, got.authority)
	}
}

// issueServerCert signs a serving certificate with the CA, as kubeadm does
// for a member, with CAPI's own certificate helpers.
func issueServerCert(t *testing.T, caPEM, caKeyPEM []byte) tls.Certificate {
	t.Helper()
	ca, err := certs.DecodeCertPEM(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := certs.DecodePrivateKeyPEM(caKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	key, err := certs.NewPrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	cfg := certs.Config{CommonName: "ip-10-0-0-7", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		AltNames: certs.AltNames{DNSNames: []string{"ip-10-0-0-7", "localhost"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}}}
	cert, err := cfg.NewSignedCert(key, ca, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key}
}
