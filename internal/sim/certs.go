package sim

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"time"

	corev1 "k8s.io/api/core/v1"

	"sigs.k8s.io/cluster-api/util/certs"
	"sigs.k8s.io/cluster-api/util/secret"
)

// issueFromSecret signs a certificate from tmpl with the CA in a cluster
// certificate Secret (<cluster>-ca, <cluster>-etcd, ...), returning it with
// the CA certificate. Serial and validity start are filled in; keys are
// ECDSA P-256 because only the simulator uses them.
func issueFromSecret(ca *corev1.Secret, tmpl *x509.Certificate, validFor time.Duration) (tls.Certificate, *x509.Certificate, error) {
	caCert, err := certs.DecodeCertPEM(ca.Data[secret.TLSCrtDataName])
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caKey, err := certs.DecodePrivateKeyPEM(ca.Data[secret.TLSKeyDataName])
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	tmpl.SerialNumber = big.NewInt(now.UnixNano())
	tmpl.NotBefore = now.Add(-time.Minute)
	tmpl.NotAfter = now.Add(validFor)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der, caCert.Raw}, PrivateKey: key}, caCert, nil
}
