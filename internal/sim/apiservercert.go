package sim

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/secret"
)

// apiServerCertServer stands in for the kube-apiserver static pods' serving
// endpoint (port 6443) as far as KCP looks at it: KCP port-forwards there to
// read the expiry of the certificate with CN kube-apiserver, signed by the
// cluster CA, and fails its whole reconcile when it cannot. The workload API
// server itself is envtest's and serves a certificate of its own CA.
type apiServerCertServer struct {
	addr string
	// notAfter is the certificate's expiry as KCP reads it, to the second.
	notAfter time.Time
	ln       net.Listener
	wg       sync.WaitGroup
}

func startAPIServerCertServer(ctx context.Context, c client.Client, cluster client.ObjectKey) (*apiServerCertServer, error) {
	ca := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, secret.ClusterCA)}, ca); err != nil {
		return nil, fmt.Errorf("reading the cluster CA: %w", err)
	}
	cert, _, err := issueFromSecret(ca, &x509.Certificate{
		// kubeadm's serving certificate CN, the one KCP looks for.
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:    []string{"kubernetes", "kubernetes.default", "localhost"},
	}, 365*24*time.Hour)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, err
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	s := &apiServerCertServer{addr: ln.Addr().String(), notAfter: leaf.NotAfter, ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
				_ = conn.(*tls.Conn).Handshake()
			}()
		}
	}()
	return s, nil
}

func (s *apiServerCertServer) stop() {
	_ = s.ln.Close()
	s.wg.Wait()
}
