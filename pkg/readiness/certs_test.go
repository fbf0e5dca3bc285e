package readiness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
	"k8s.io/client-go/rest"
	"math/big"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/certs"
)

// TestJudgeCertificates: a certificate that expires before the run can
// finish (now + its limit) blocks, one within 30 days warns, one further
// passes; a machine whose expiry is not known is said and passes; a CA that
// could not be read warns without hiding what the machines say.
func TestJudgeCertificates(t *testing.T) {
	now := cpBase
	const limit = 6 * time.Hour
	day := 24 * time.Hour
	expiring := func(name string, in time.Duration) *clusterv1.Machine {
		m := cpm(name, "node-"+name)
		m.Status.CertificatesExpiryDate = metav1.NewTime(now.Add(in))
		return m
	}
	unknown := cpm("m-new", "node-new")
	ca := func(in time.Duration) caCert {
		return caCert{secret: "default/demo-ca", what: "cluster CA", notAfter: now.Add(in)}
	}
	farCA := []caCert{ca(3650 * day)}
	for _, tc := range []struct {
		name       string
		limit      time.Duration
		machines   []*clusterv1.Machine
		cas        []caCert
		result     Result
		found, do  []string
		notInFound []string
	}{
		{name: "far off", machines: []*clusterv1.Machine{expiring("m1", 300*day), expiring("m2", 200*day)}, cas: farCA,
			result: Pass, found: []string{"earliest machine certificates (m2) expire 2026-09-17T00:00:00Z, in 200 days", "Secret default/demo-ca (cluster CA) expires"}},
		{name: "a second before the run's end blocks", machines: []*clusterv1.Machine{expiring("m1", limit-time.Second)}, cas: farCA,
			result: Block, found: []string{"machine m1: certificates expire 2026-03-01T05:59:59Z, in 5h59m, before the run can finish (it may take 6h)"},
			do: []string{"`kubectl cp-rollout rollout demo -n default --certificates-expiring-within 30d`"}},
		{name: "at the run's end exactly it only warns", machines: []*clusterv1.Machine{expiring("m1", limit)}, cas: farCA,
			result: Warn, found: []string{"machine m1: certificates expire"}, notInFound: []string{"before the run"}},
		{name: "already expired blocks", machines: []*clusterv1.Machine{expiring("m1", -day)}, cas: farCA,
			result: Block, found: []string{"machine m1: certificates expired 2026-02-28T00:00:00Z"}},
		{name: "within 30 days warns", machines: []*clusterv1.Machine{expiring("m1", 29*day), expiring("m2", 31*day)}, cas: farCA,
			result: Warn, found: []string{"machine m1: certificates expire 2026-03-30T00:00:00Z, in 29 days"},
			do: []string{"--certificates-expiring-within 30d"}, notInFound: []string{"m2"}},
		{name: "a run limit beyond 30 days widens the window", limit: 45 * day, machines: []*clusterv1.Machine{expiring("m1", 40*day)}, cas: farCA,
			result: Block, do: []string{"--certificates-expiring-within 45d"}},
		{name: "an unknown expiry is said and passes", machines: []*clusterv1.Machine{unknown, expiring("m1", 300*day)}, cas: farCA,
			result: Pass, found: []string{"expiry not known for machine m-new", "not judged"}},
		{name: "a CA within 30 days warns, its rotation out of the tool's scope", machines: []*clusterv1.Machine{expiring("m1", 300*day)}, cas: []caCert{ca(20 * day)},
			result: Warn, found: []string{"Secret default/demo-ca (cluster CA) expires 2026-03-21T00:00:00Z, in 20 days"},
			do: []string{"outside this tool's scope"}, notInFound: []string{"machine m1"}},
		{name: "a CA that lapses during the run blocks", machines: []*clusterv1.Machine{expiring("m1", 300*day)}, cas: []caCert{ca(time.Hour)},
			result: Block, found: []string{"Secret default/demo-ca (cluster CA) expires", "before the run can finish"}},
		{name: "a CA not read warns, and a machine's block still blocks",
			machines: []*clusterv1.Machine{expiring("m1", time.Hour)},
			cas:      []caCert{{secret: "default/demo-ca", what: "cluster CA", err: errors.New(`secrets "demo-ca" is forbidden`)}},
			result:   Block, found: []string{"not checked: Secret default/demo-ca (cluster CA): secrets \"demo-ca\" is forbidden", "machine m1"},
			do: []string{"make Secret default/demo-ca readable", "--certificates-expiring-within"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit := certsLimitOr(tc.limit, limit)
			f := judgeCertificates(now, limit, tc.machines, tc.cas, "demo -n default")
			checkFindingSays(t, f, tc.result, tc.found, tc.do, tc.notInFound)
		})
	}
}

func certsLimitOr(d, or time.Duration) time.Duration {
	if d == 0 {
		return or
	}
	return d
}

// TestCertificatesReadsSecrets: the live check reads the cluster CA (and,
// with stacked etcd, the etcd CA) from the cluster's Secrets by CAPI's names
// and key, and leaves deleting machines out.
func TestCertificatesReadsSecrets(t *testing.T) {
	caSecret := func(name string, notAfter time.Time) *corev1.Secret {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
			NotBefore: cpBase.Add(-365 * 24 * time.Hour), NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Data: map[string][]byte{"tls.crt": certs.EncodeCertPEM(cert)}}
	}
	going := cpm("m1", "n1")
	going.DeletionTimestamp = ptr.To(metav1.NewTime(cpBase))
	going.Status.CertificatesExpiryDate = metav1.NewTime(cpBase.Add(time.Minute)) // would block, but it is going
	staying := cpm("m22", "n2")
	staying.Status.CertificatesExpiryDate = metav1.NewTime(cpBase.Add(400 * 24 * time.Hour))
	s := cpSnapshot([]*clusterv1.Machine{going, staying})
	s.Now = cpBase
	mgmt := fake.NewClientBuilder().WithObjects(caSecret("demo-etcd", cpBase.Add(3650*24*time.Hour))).Build()
	wl := &workload.Client{Config: &rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: caSecret("ca", cpBase.Add(10*24*time.Hour)).Data["tls.crt"]}}}
	f := certificates(t.Context(), &Cluster{Snapshot: s, Management: mgmt, Workload: wl, RunLimit: time.Hour})
	checkFindingSays(t, f, Warn, []string{"Secret default/demo-kubeconfig (cluster CA) expires 2026-03-11T00:00:00Z, in 10 days"},
		[]string{"outside this tool's scope"}, []string{"m1", "demo-etcd"})

	// External etcd: no etcd CA is asked for; a kubeconfig without the
	// cluster CA is said.
	s.EtcdManaged = false
	f = certificates(t.Context(), &Cluster{Snapshot: s, Management: fake.NewClientBuilder().Build(), Workload: &workload.Client{Config: &rest.Config{}}, RunLimit: time.Hour})
	checkFindingSays(t, f, Warn, []string{"not checked: Secret default/demo-kubeconfig (cluster CA)", "no certificate-authority-data"}, nil, []string{"demo-etcd"})
}
