package sim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// Certificate expiry, made rehearsable. KCP reads each machine's API server
// serving certificate through a port-forward (here: the one certificate the
// simulator's stand-in serves, valid a year) and records its expiry once, in
// the machine.cluster.x-k8s.io/certificates-expiry annotation of the
// machine's KubeadmConfig; it never overwrites a recorded value
// (reconcileCertificateExpiries). The Machine controller copies the record
// into Machine status.certificatesExpiryDate, and KCP's UpToDate rolls out a
// machine whose date falls within spec.rollout.before.certificatesExpiryDays.
// Writing that record is therefore all it takes to make a machine's
// certificates "expire soon", paused KCP or not.

// SetCertificatesExpiry records expiry as the API server certificate expiry
// of the named control-plane Machine, where KCP records it: the
// certificates-expiry annotation of the Machine's KubeadmConfig.
func (s *Sim) SetCertificatesExpiry(ctx context.Context, machine string, expiry time.Time) error {
	return s.recordCertificatesExpiry(ctx, machine, expiry)
}

// ResetCertificatesExpiry records the expiry of the certificate the
// machine's kube-apiserver serves, the value KCP itself records, undoing
// SetCertificatesExpiry without waiting for KCP (which records nothing while
// paused).
func (s *Sim) ResetCertificatesExpiry(ctx context.Context, machine string) error {
	return s.recordCertificatesExpiry(ctx, machine, s.APIServerCertificateExpiry())
}

// APIServerCertificateExpiry is when the serving certificate KCP reads for
// every simulated control-plane node expires.
func (s *Sim) APIServerCertificateExpiry() time.Time {
	return s.provider.apiServerCert.notAfter
}

func (s *Sim) recordCertificatesExpiry(ctx context.Context, machine string, expiry time.Time) error {
	m := &clusterv1.Machine{}
	if err := s.mgmt.Get(ctx, client.ObjectKey{Namespace: s.opts.Namespace, Name: machine}, m); err != nil {
		return err
	}
	ref := m.Spec.Bootstrap.ConfigRef
	if ref.Kind != "KubeadmConfig" || ref.APIGroup != bootstrapv1.GroupVersion.Group {
		return fmt.Errorf("machine %s has no KubeadmConfig (bootstrap %s %s)", machine, ref.Kind, ref.Name)
	}
	config := &bootstrapv1.KubeadmConfig{}
	config.Namespace, config.Name = m.Namespace, ref.Name
	// A merge patch of the one annotation, as KCP writes it: the rest of the
	// KubeadmConfig stays its owners'. RFC 3339 in UTC is KCP's format.
	patch := AnnotationPatch(clusterv1.MachineCertificatesExpiryDateAnnotation, expiry.UTC().Format(time.RFC3339))
	if err := s.mgmt.Patch(ctx, config, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("recording the certificates expiry of machine %s on KubeadmConfig %s: %w", machine, ref.Name, err)
	}
	return nil
}

// ParseExpiresIn reads the value of the certs-expire-in fault: whole days
// as <n>d ("10d"), or a Go duration ("36h", "90m"); "0" or a negative value
// means expired already.
func ParseExpiresIn(value string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(value, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil {
			return 0, fmt.Errorf("%q: want whole days (10d) or a Go duration (36h)", value)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(value)
	if err != nil {
		return 0, fmt.Errorf("%q: want whole days (10d) or a Go duration (36h)", value)
	}
	return d, nil
}
