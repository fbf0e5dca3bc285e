package etcd

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math"
	"math/big"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	"sigs.k8s.io/cluster-api/util/certs"
	"sigs.k8s.io/cluster-api/util/secret"
)

const (
	// ClientCertificateLifetime is how long a minted client certificate is valid. It is
	// short because the key exists only in this process; a run that outlasts it gets a new one.
	ClientCertificateLifetime = time.Hour
	// clockSkew backdates NotBefore so members whose clocks run behind ours accept the
	// certificate at once.
	clockSkew = 5 * time.Minute
	// renewBefore is how much validity a certificate must have left to be presented again;
	// less than that and a new one is minted, so no handshake ever races the expiry.
	renewBefore = 15 * time.Minute
	// clientCommonName identifies the tool in etcd's logs.
	clientCommonName = "kubectl-cp-rollout"
)

// ErrNotManaged reports a control plane whose etcd is external: the tool has no business
// with its members, and callers skip the etcd steps instead of failing.
var ErrNotManaged = errors.New("etcd is external to the control plane and not managed by it")

// Managed reports whether the control plane runs stacked etcd, as KCP's IsEtcdManaged does.
func Managed(kcp *controlplanev1.KubeadmControlPlane) bool {
	return !kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.Etcd.External.IsDefined()
}

// KeyAlgorithm is the key type the cluster's certificates use; client keys follow it so
// a cluster that asked for ECDSA or larger RSA keys gets them from the tool too.
func KeyAlgorithm(kcp *controlplanev1.KubeadmControlPlane) bootstrapv1.EncryptionAlgorithmType {
	return kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.EncryptionAlgorithm
}

// Credentials hold a cluster's etcd CA and mint the client certificate the tool presents
// to its members. Key material stays in memory; nothing is written or logged.
type Credentials struct {
	// source says where the CA came from, for messages: "Secret <namespace>/<name>".
	source    string
	ca        *x509.Certificate
	caKey     crypto.Signer
	roots     *x509.CertPool
	algorithm bootstrapv1.EncryptionAlgorithmType
	now       func() time.Time

	mu      sync.Mutex
	current *tls.Certificate
}

// CredentialsOption adjusts Credentials.
type CredentialsOption func(*Credentials)

// WithClock replaces the clock used to mint and renew client certificates.
func WithClock(now func() time.Time) CredentialsOption {
	return func(c *Credentials) { c.now = now }
}

// LoadCredentials reads the cluster's etcd CA from the `<cluster>-etcd` Secret in the
// management cluster. It returns ErrNotManaged for a control plane with external etcd.
func LoadCredentials(ctx context.Context, c client.Reader, cluster client.ObjectKey, kcp *controlplanev1.KubeadmControlPlane, opts ...CredentialsOption) (*Credentials, error) {
	if !Managed(kcp) {
		return nil, ErrNotManaged
	}
	name := secret.Name(cluster.Name, secret.EtcdCA)
	s, err := secret.Get(ctx, c, cluster, secret.EtcdCA)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("etcd CA Secret %s/%s not found: without it the etcd members can be neither reached nor verified", cluster.Namespace, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading etcd CA Secret %s/%s: %w", cluster.Namespace, name, err)
	}
	crt, key := s.Data[secret.TLSCrtDataName], s.Data[secret.TLSKeyDataName]
	if len(crt) == 0 || len(key) == 0 {
		return nil, fmt.Errorf("etcd CA Secret %s/%s lacks %s or %s", s.Namespace, s.Name, secret.TLSCrtDataName, secret.TLSKeyDataName)
	}
	creds, err := NewCredentials(crt, key, KeyAlgorithm(kcp), opts...)
	if err != nil {
		return nil, fmt.Errorf("etcd CA Secret %s/%s: %w", s.Namespace, s.Name, err)
	}
	creds.source = fmt.Sprintf("Secret %s/%s", s.Namespace, s.Name)
	return creds, nil
}

// NewCredentials builds Credentials from the PEM contents of an etcd CA. algorithm is the
// cluster's clusterConfiguration.encryptionAlgorithm; empty means RSA-2048.
func NewCredentials(caCertPEM, caKeyPEM []byte, algorithm bootstrapv1.EncryptionAlgorithmType, opts ...CredentialsOption) (*Credentials, error) {
	switch algorithm {
	case "", bootstrapv1.EncryptionAlgorithmRSA2048, bootstrapv1.EncryptionAlgorithmRSA3072,
		bootstrapv1.EncryptionAlgorithmRSA4096, bootstrapv1.EncryptionAlgorithmECDSAP256,
		bootstrapv1.EncryptionAlgorithmECDSAP384:
	default:
		return nil, fmt.Errorf("unsupported encryption algorithm %q", algorithm)
	}
	ca, err := certs.DecodeCertPEM(caCertPEM)
	if err != nil {
		return nil, fmt.Errorf("decoding etcd CA certificate: %w", err)
	}
	caKey, err := certs.DecodePrivateKeyPEM(caKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("decoding etcd CA key: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	c := &Credentials{ca: ca, caKey: caKey, roots: roots, algorithm: algorithm, now: time.Now}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// ClientCertificate returns a client certificate with at least renewBefore of validity
// left, minting a new one when the current one is too close to expiry.
func (c *Credentials) ClientCertificate() (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if c.current != nil && now.Add(renewBefore).Before(c.current.Leaf.NotAfter) {
		return c.current, nil
	}
	cert, err := c.mint(now)
	if err != nil {
		return nil, err
	}
	c.current = cert
	return cert, nil
}

// mint signs a new client certificate. CAPI's certs.Config.NewSignedCert does not fit: it
// reads the wall clock, copies the CA's NotBefore and makes certificates valid for a year;
// the key itself comes from CAPI so key types match the cluster's exactly.
func (c *Credentials) mint(now time.Time) (*tls.Certificate, error) {
	key, err := certs.NewSigner(c.algorithm)
	if err != nil {
		return nil, fmt.Errorf("generating %s client key: %w", algorithmName(c.algorithm), err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(math.MaxInt64))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: clientCommonName},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(ClientCertificateLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, key.Public(), c.caKey)
	if err != nil {
		return nil, fmt.Errorf("signing etcd client certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func algorithmName(a bootstrapv1.EncryptionAlgorithmType) string {
	if a == "" {
		return string(bootstrapv1.EncryptionAlgorithmRSA2048)
	}
	return string(a)
}

// TLSConfig is the client side of a connection to any member of the cluster.
//
// InsecureSkipVerify only turns off Go's built-in check, which would also demand that the
// dialed name be in the server certificate: a member reached through a port-forward is
// dialed by pod name, and kubeadm's serving certificates name the node and its addresses.
// VerifyConnection puts the chain check back, against the etcd CA alone, as KCP does.
func (c *Credentials) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, //nolint:gosec // the chain is verified in VerifyConnection.
		VerifyConnection:   c.verifyServer,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.ClientCertificate()
		},
	}
}

// verifyServer accepts a server certificate only if it chains to the etcd CA and is meant
// for serving.
func (c *Credentials) verifyServer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("etcd member presented no certificate")
	}
	intermediates := x509.NewCertPool()
	for _, ic := range cs.PeerCertificates[1:] {
		intermediates.AddCert(ic)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots:         c.roots,
		Intermediates: intermediates,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return &UntrustedError{CA: c.source, Err: err}
	}
	return nil
}

// UntrustedError is a member whose certificate the etcd CA did not sign: the CA the tool
// holds and the members disagree, so nothing a member says can be trusted and nothing may
// be done to it. It is final, never retried; the tool refuses instead (an etcd CA Secret
// replaced or rotated by hand, or one copied from another cluster).
type UntrustedError struct {
	// CA says where the CA came from, such as "Secret default/demo-etcd"; empty when it
	// was handed over directly.
	CA  string
	Err error
}

func (e *UntrustedError) Error() string {
	ca := "the etcd CA"
	if e.CA != "" {
		ca = "the etcd CA in " + e.CA
	}
	return fmt.Sprintf("member certificate not signed by %s: %v", ca, e.Err)
}

func (e *UntrustedError) Unwrap() error { return e.Err }
