package etcd_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	"sigs.k8s.io/cluster-api/util/certs"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/internal/sim/member"
)

func TestClientCertificatePerKeyType(t *testing.T) {
	t.Parallel()
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := certs.DecodeCertPEM(caCert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	// A fixed moment inside the CA's validity, which starts at its creation.
	now := time.Now().Add(time.Minute).Truncate(time.Second)
	for _, tt := range []struct {
		algorithm bootstrapv1.EncryptionAlgorithmType
		check     func(any) bool
	}{
		{"", rsaBits(2048)},
		{bootstrapv1.EncryptionAlgorithmRSA2048, rsaBits(2048)},
		{bootstrapv1.EncryptionAlgorithmRSA3072, rsaBits(3072)},
		{bootstrapv1.EncryptionAlgorithmRSA4096, rsaBits(4096)},
		{bootstrapv1.EncryptionAlgorithmECDSAP256, ecCurve(elliptic.P256())},
		{bootstrapv1.EncryptionAlgorithmECDSAP384, ecCurve(elliptic.P384())},
	} {
		t.Run("algorithm="+string(tt.algorithm), func(t *testing.T) {
			creds, err := etcd.NewCredentials(caCert, caKey, tt.algorithm, etcd.WithClock(func() time.Time { return now }))
			if err != nil {
				t.Fatal(err)
			}
			cert, err := creds.ClientCertificate()
			if err != nil {
				t.Fatal(err)
			}
			leaf := cert.Leaf
			if !tt.check(leaf.PublicKey) || !tt.check(cert.PrivateKey) {
				t.Errorf("key %T does not match %s", leaf.PublicKey, tt.algorithm)
			}
			if !leaf.NotBefore.Before(now) || leaf.NotBefore.Before(now.Add(-time.Hour)) {
				t.Errorf("NotBefore %v: want a little before %v", leaf.NotBefore, now)
			}
			if !leaf.NotAfter.Equal(now.Add(etcd.ClientCertificateLifetime)) {
				t.Errorf("NotAfter %v, want %v", leaf.NotAfter, now.Add(etcd.ClientCertificateLifetime))
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("client certificate not a client certificate of the etcd CA: %v", err)
			}
		})
	}
	if _, err := etcd.NewCredentials(caCert, caKey, "DSA-1024"); err == nil {
		t.Error("unknown algorithm accepted")
	}
}

func rsaBits(bits int) func(any) bool {
	return func(k any) bool {
		switch k := k.(type) {
		case *rsa.PublicKey:
			return k.N.BitLen() == bits
		case *rsa.PrivateKey:
			return k.N.BitLen() == bits
		}
		return false
	}
}

func ecCurve(curve elliptic.Curve) func(any) bool {
	return func(k any) bool {
		switch k := k.(type) {
		case *ecdsa.PublicKey:
			return k.Curve == curve
		case *ecdsa.PrivateKey:
			return k.Curve == curve
		}
		return false
	}
}

func TestClientCertificateRemintedNearExpiry(t *testing.T) {
	t.Parallel()
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	// A fixed moment inside the CA's validity, which starts at its creation.
	now := time.Now().Add(time.Minute).Truncate(time.Second)
	creds, err := etcd.NewCredentials(caCert, caKey, bootstrapv1.EncryptionAlgorithmECDSAP256, etcd.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	first, err := creds.ClientCertificate()
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(30 * time.Minute)
	if again, _ := creds.ClientCertificate(); again != first {
		t.Fatal("certificate with half its life left was replaced")
	}
	now = now.Add(20 * time.Minute) // 10 minutes left
	renewed, err := creds.ClientCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if renewed == first || !renewed.Leaf.NotAfter.Equal(now.Add(etcd.ClientCertificateLifetime)) {
		t.Fatalf("certificate expiring at %v not re-minted at %v (got one expiring %v)", first.Leaf.NotAfter, now, renewed.Leaf.NotAfter)
	}
	if renewed.Leaf.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
		t.Error("re-minted certificate reuses the serial number")
	}
}

func TestLoadCredentialsFromEtcdCASecret(t *testing.T) {
	t.Parallel()
	caCert, caKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "prod-etcd"},
		Data:       map[string][]byte{"tls.crt": caCert, "tls.key": caKey},
	}).Build()
	kcp := &controlplanev1.KubeadmControlPlane{}
	kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.EncryptionAlgorithm = bootstrapv1.EncryptionAlgorithmECDSAP384
	ctx := context.Background()

	creds, err := etcd.LoadCredentials(ctx, cl, client.ObjectKey{Namespace: "ns", Name: "prod"}, kcp)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := creds.ClientCertificate()
	if err != nil {
		t.Fatal(err)
	}
	if !ecCurve(elliptic.P384())(cert.Leaf.PublicKey) {
		t.Errorf("key %T ignores the cluster's encryption algorithm", cert.Leaf.PublicKey)
	}

	if _, err := etcd.LoadCredentials(ctx, cl, client.ObjectKey{Namespace: "ns", Name: "other"}, kcp); err == nil || !strings.Contains(err.Error(), "etcd CA Secret ns/other-etcd not found") {
		t.Errorf("missing Secret: %v", err)
	}

	external := kcp.DeepCopy()
	external.Spec.KubeadmConfigSpec.ClusterConfiguration.Etcd.External.Endpoints = []string{"https://etcd.example:2379"}
	if etcd.Managed(external) || !etcd.Managed(kcp) {
		t.Error("Managed does not follow clusterConfiguration.etcd.external")
	}
	if _, err := etcd.LoadCredentials(ctx, cl, client.ObjectKey{Namespace: "ns", Name: "prod"}, external); !errors.Is(err, etcd.ErrNotManaged) {
		t.Errorf("external etcd: %v", err)
	}
}

func TestServerCertificateFromAnotherCARejected(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	tc := newTestCluster(t, 1)
	otherCert, otherKey, err := member.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	// The cluster's etcd CA Secret holds another CA: the member's certificate does not
	// chain to it.
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "prod-etcd"},
		Data:       map[string][]byte{"tls.crt": otherCert, "tls.key": otherKey},
	}).Build()
	creds, err := etcd.LoadCredentials(ctx, cl, client.ObjectKey{Namespace: "ns", Name: "prod"}, &controlplanev1.KubeadmControlPlane{})
	if err != nil {
		t.Fatal(err)
	}
	c := tc.client(func(c *etcd.Config) { c.Credentials = creds })
	start := time.Now()
	_, err = c.Members(ctx, tc.nodes)
	var untrusted *etcd.UntrustedError
	if !errors.As(err, &untrusted) || !strings.Contains(err.Error(), "not signed by the etcd CA in Secret ns/prod-etcd") ||
		!strings.Contains(err.Error(), "node-a") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("listing a member with an untrusted certificate: %v", err)
	}
	// An untrusted certificate is final: no round of retries.
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("refusal took %v", d)
	}
	// The same member with the right CA is reachable, so the refusal was about the CA.
	if m := mustMembers(t, ctx, tc.client(), tc.nodes)[0]; !m.Healthy {
		t.Fatalf("member with the right CA: %v", m.Errors)
	}
}
