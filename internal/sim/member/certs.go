package member

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/cluster-api/util/certs"
	"sigs.k8s.io/cluster-api/util/secret"
)

// authority is the cluster's etcd CA as the kubeadm phases on a node see it: it signs the
// member's serving and peer certificates, the way `kubeadm join` mints them from
// /etc/kubernetes/pki/etcd/ca.{crt,key}.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

func parseAuthority(certPEM, keyPEM []byte) (*authority, error) {
	cert, err := certs.DecodeCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("etcd CA certificate: %w", err)
	}
	key, err := certs.DecodePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("etcd CA key: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &authority{cert: cert, key: key, pool: pool}, nil
}

// issue signs a certificate for this member. Serving and peer certificates carry both
// usages because etcd uses the peer certificate as a client towards other peers and
// kubeadm does the same for the serving one.
func (a *authority) issue(commonName string, ips []net.IP, dnsNames []string, usages []x509.ExtKeyUsage) (tls.Certificate, error) {
	// ECDSA keeps member start-up cheap; the key type of the operator's client
	// certificate is what the product must follow, not the simulated node's.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(math.MaxInt64))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usages,
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// writePair stores a certificate where the etcd process reads it, as kubeadm stores it
// on the node's disk: etcd's TLS flags take file paths only.
func writePair(dir, name string, c tls.Certificate) (certFile, keyFile string, err error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		return "", "", err
	}
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// NewCA creates an etcd CA the way Cluster API does for a new cluster (the contents of
// the `<cluster>-etcd` Secret), so simulated clusters and tests share production's
// certificate shape.
func NewCA() (certPEM, keyPEM []byte, err error) {
	ca := &secret.Certificate{Purpose: secret.EtcdCA, ValidityPeriodDays: secret.DefaultCACertificatesExpiryDays}
	if err := ca.Generate(); err != nil {
		return nil, nil, err
	}
	return ca.KeyPair.Cert, ca.KeyPair.Key, nil
}
