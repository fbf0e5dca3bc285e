package readiness

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/certs"
	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/cp-rollout/cp-rollout/rollout"
)

// certsWarnWithin is how soon an expiry is worth a warning: KCP's own
// spec.rollout.before.certificatesExpiryDays is commonly set to about this,
// and it leaves a month to act on it.
const certsWarnWithin = 30 * 24 * time.Hour

// caCert is a CA certificate of the cluster, as read from its Secret.
type caCert struct {
	// secret is namespace/name, what says which CA it is.
	secret, what string
	notAfter     time.Time
	// err is why it could not be read; the other certificates are judged
	// all the same.
	err error
}

// certificates judges the control-plane machines' certificate expiry dates
// and the cluster's CAs against the run's time limit.
func certificates(ctx context.Context, c *Cluster) Finding {
	s := c.Snapshot
	// The cluster CA signs the API servers' certificates and every kubelet's;
	// the etcd CA signs the members' and the client certificate this tool
	// mints for itself (stacked etcd only). The cluster CA's certificate is
	// read from the workload cluster's kubeconfig (Secret <cluster>-kubeconfig,
	// its certificate-authority-data), not from Secret <cluster>-ca: that
	// Secret holds the CA's private key too, which no role of this tool may
	// read. The etcd CA's Secret is read already to mint the etcd client
	// certificate.
	key := client.ObjectKeyFromObject(s.CP.Cluster)
	cluster := caCert{secret: key.Namespace + "/" + secret.Name(key.Name, secret.Kubeconfig), what: "cluster CA"}
	if c.Workload == nil || len(c.Workload.Config.CAData) == 0 {
		cluster.err = fmt.Errorf("the workload kubeconfig names no certificate-authority-data")
	} else {
		cluster.notAfter, cluster.err = caNotAfter(c.Workload.Config.CAData)
	}
	cas := []caCert{cluster}
	if s.EtcdManaged {
		etcdCA := caCert{secret: key.Namespace + "/" + secret.Name(key.Name, secret.EtcdCA), what: "etcd CA"}
		if sec, err := secret.Get(ctx, c.Management, key, secret.EtcdCA); err != nil {
			etcdCA.err = err
		} else {
			etcdCA.notAfter, etcdCA.err = caNotAfter(sec.Data[secret.TLSCrtDataName])
		}
		cas = append(cas, etcdCA)
	}
	// The guard's own selection: a deleting machine is going, and its
	// certificates go with it.
	machines := s.CP.Machines.Difference(rollout.Deleting(s)).SortedByCreationTimestamp()
	return judgeCertificates(s.Now, c.RunLimit, machines, cas, clusterArgsOf(s))
}

// judgeCertificates judges the certificates at now: one that expires before
// the run can finish (now + runLimit) blocks, since the run may reach its
// machine only after it lapsed; one within certsWarnWithin warns; a machine
// without a known expiry date is said and passes. A machine's date is its
// status.certificatesExpiryDate, which the Machine controller copies from the
// machine's machine.cluster.x-k8s.io/certificates-expiry annotation or else
// its KubeadmConfig's, where KCP records the expiry of the node's API server
// certificate once the node is up (CAPI v1.14.2,
// core/reconcilers/machine/machine_controller_phases.go,
// reconcileCertificateExpiry; KCP's reconcileCertificateExpiries).
func judgeCertificates(now time.Time, runLimit time.Duration, machines []*clusterv1.Machine, cas []caCert, cluster string) Finding {
	finish := now.Add(runLimit)
	soon := now.Add(certsWarnWithin)
	result := Pass
	raise := func(r Result) {
		if r == Block || result == Pass {
			result = r
		}
	}
	var found, do, unknown []string
	var earliest *clusterv1.Machine
	machineDue := false
	for _, m := range machines {
		expiry := m.Status.CertificatesExpiryDate.Time
		switch {
		case expiry.IsZero():
			unknown = append(unknown, m.Name)
			continue
		case expiry.Before(finish):
			raise(Block)
			found = append(found, fmt.Sprintf("machine %s: certificates %s, before the run can finish (it may take %s)", m.Name, certsWhen(now, expiry, "expire"), certsSpan(runLimit)))
			machineDue = true
		case expiry.Before(soon):
			raise(Warn)
			found = append(found, fmt.Sprintf("machine %s: certificates %s", m.Name, certsWhen(now, expiry, "expire")))
			machineDue = true
		}
		if earliest == nil || expiry.Before(earliest.Status.CertificatesExpiryDate.Time) {
			earliest = m
		}
	}
	if machineDue {
		// KCP's own rule for certificatesExpiryDays, which the tool's flag
		// follows: expiring within the window. 30 days covers every warning;
		// a run limit beyond that needs a longer window to cover its blocks.
		days := max(int(math.Ceil(certsWarnWithin.Hours()/24)), int(math.Ceil(runLimit.Hours()/24)))
		do = append(do, fmt.Sprintf("replace those machines first: `kubectl cp-rollout rollout %s --certificates-expiring-within %dd`", cluster, days))
	}
	caDue := false
	for _, ca := range cas {
		switch {
		case ca.err != nil:
			raise(Warn)
			found = append(found, fmt.Sprintf("not checked: Secret %s (%s): %v", ca.secret, ca.what, ca.err))
			do = append(do, fmt.Sprintf("make Secret %s readable (get) and run `kubectl cp-rollout check` again", ca.secret))
		case ca.notAfter.Before(finish):
			raise(Block)
			found = append(found, fmt.Sprintf("Secret %s (%s) %s, before the run can finish (it may take %s)", ca.secret, ca.what, certsWhen(now, ca.notAfter, "expires"), certsSpan(runLimit)))
			caDue = true
		case ca.notAfter.Before(soon):
			raise(Warn)
			found = append(found, fmt.Sprintf("Secret %s (%s) %s", ca.secret, ca.what, certsWhen(now, ca.notAfter, "expires")))
			caDue = true
		}
	}
	if caDue {
		// A replacement machine's certificates are signed by the CA as it is,
		// so no rollout renews a CA: it needs a rotation of its own.
		do = append(do, "rotating a CA is outside this tool's scope (replacing machines does not renew it): rotate it with Cluster API's and kubeadm's CA rotation procedure before upgrading")
	}
	if len(unknown) > 0 {
		found = append(found, fmt.Sprintf("expiry not known for machine %s (KCP records it once a machine's node is up; not judged)", strings.Join(unknown, ", ")))
	}
	if result == Pass {
		var pass []string
		if earliest != nil {
			pass = append(pass, fmt.Sprintf("earliest machine certificates (%s) %s", earliest.Name, certsWhen(now, earliest.Status.CertificatesExpiryDate.Time, "expire")))
		}
		for _, ca := range cas {
			pass = append(pass, fmt.Sprintf("Secret %s (%s) %s", ca.secret, ca.what, certsWhen(now, ca.notAfter, "expires")))
		}
		if len(machines) == 0 {
			pass = append(pass, "no control-plane machine")
		}
		return Finding{Result: Pass, Found: strings.Join(append(pass, found...), "; ")}
	}
	return Finding{Result: result, Found: strings.Join(found, "; "), Do: strings.Join(do, "; ")}
}

// caNotAfter is when the first certificate of pemData expires: CAPI's own
// decoding, the certificate its controllers sign with.
func caNotAfter(pemData []byte) (time.Time, error) {
	cert, err := certs.DecodeCertPEM(pemData)
	switch {
	case err != nil:
		return time.Time{}, err
	case cert == nil:
		return time.Time{}, fmt.Errorf("no certificate")
	}
	return cert.NotAfter, nil
}

// certsWhen says when a certificate expires, seen from now, with verb
// ("expire" or "expires") for one that has not yet.
func certsWhen(now, expiry time.Time, verb string) string {
	date := expiry.UTC().Format(time.RFC3339)
	left := expiry.Sub(now)
	switch {
	case left <= 0:
		return "expired " + date
	}
	return fmt.Sprintf("%s %s, in %s", verb, date, certsSpan(left))
}

// certsSpan writes a span as a person reads it: days from two days on,
// hours and minutes below.
func certsSpan(d time.Duration) string {
	if d >= 48*time.Hour {
		return fmt.Sprintf("%d days", int(d.Hours()/24))
	}
	h, m := int(d.Hours()), int(d.Minutes())%60
	switch {
	case h == 0:
		return fmt.Sprintf("%dm", m)
	case m == 0:
		return fmt.Sprintf("%dh", h)
	}
	return fmt.Sprintf("%dh%dm", h, m)
}
