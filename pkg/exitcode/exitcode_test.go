package exitcode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestWorstFollowsTheDocumentedOrder(t *testing.T) {
	for _, tc := range []struct {
		codes []int
		want  int
	}{
		{nil, OK},
		{[]int{OK, OK}, OK},
		{[]int{OK, Usage}, Usage},
		{[]int{Usage, Unreachable}, Unreachable},
		{[]int{Unreachable, Forbidden}, Forbidden},
		{[]int{Locked, Unreachable}, Locked},
		{[]int{Locked, Forbidden}, Locked},
		{[]int{Unsafe, Locked}, Unsafe},
		{[]int{Unsafe, Timeout}, Timeout},
		{[]int{Timeout, Failure, Unsafe}, Failure},
		{[]int{Failure, Interrupted, OK}, Interrupted},
		{[]int{Failure, Terminated, Unreachable}, Terminated},
		{[]int{Terminated, Interrupted}, Terminated}, // the same rank: the first stays
		{[]int{Interrupted, Terminated}, Interrupted},
		{[]int{Unsafe, 42}, 42}, // unknown: ranks as a failure
		{[]int{42, Failure}, 42},
	} {
		if got := Worst(tc.codes...); got != tc.want {
			t.Errorf("Worst(%v) = %d, want %d", tc.codes, got, tc.want)
		}
	}
}

// get is a request's error as client-go returns it when the transport got no
// response: the method and URL around what failed.
func get(err error) error {
	return &url.Error{Op: "Get", URL: "https://10.0.0.1:6443/api", Err: err}
}

// asRead wraps err as the tool's reads do (controlplane.Read around
// controller-runtime's discovery), so the classification sees real depth.
func asRead(err error) error {
	return fmt.Errorf("reading cluster default/demo: %w", fmt.Errorf("failed to get server groups: %w", err))
}

func TestIsUnreachable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 6443}, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	cluster := schema.GroupResource{Group: "cluster.x-k8s.io", Resource: "clusters"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", asRead(get(refused)), true},
		{"no such host", asRead(get(&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "mgmt.example", IsNotFound: true}})), true},
		{"DNS error alone", &net.DNSError{Err: "server misbehaving", Name: "mgmt.example"}, true},
		{"dial error alone", refused, true},
		{"unknown certificate authority", asRead(get(&tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})), true},
		{"certificate for another host", get(x509.HostnameError{Host: "10.0.0.1", Certificate: &x509.Certificate{}}), true},
		{"client certificate refused", get(tls.AlertError(42)), true},
		{"TLS handshake timeout", get(timeoutError{}), true},
		{"--request-timeout", get(fmt.Errorf("%w (Client.Timeout exceeded while awaiting headers)", context.DeadlineExceeded)), true},
		{"credential plugin failed", get(errors.New("getting credentials: exec: executable kubelogin not found")), true},
		{"401 Unauthorized", asRead(apierrors.NewUnauthorized("Unauthorized")), true},

		{"nil", nil, false},
		{"cancelled while dialling", asRead(get(context.Canceled)), false},
		{"cancelled by a signal while dialling", get(Stopped(syscall.SIGTERM)), false},
		{"403 Forbidden", asRead(apierrors.NewForbidden(cluster, "demo", errors.New("no"))), false},
		{"404 Not Found", asRead(apierrors.NewNotFound(cluster, "demo")), false},
		{"500 from the API server", apierrors.NewInternalError(errors.New("etcdserver: leader changed")), false},
		{"a URL that does not parse", &url.Error{Op: "parse", URL: "https://[::1", Err: errors.New("missing ']' in host")}, false},
		{"a wait that ran out", fmt.Errorf("waiting: %w", context.DeadlineExceeded), false},
		{"anything else", errors.New("the KubeadmControlPlane has no version"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsUnreachable(tc.err); got != tc.want {
				t.Errorf("IsUnreachable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "net/http: TLS handshake timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func TestCauseDropsTheRequestAroundIt(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{asRead(get(refused)), "dial tcp: connect: connection refused"},
		{asRead(apierrors.NewUnauthorized("Unauthorized")), "Unauthorized"},
		{errors.New("plain"), "plain"},
	} {
		if got := Cause(tc.err).Error(); got != tc.want {
			t.Errorf("Cause(%q) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestStoppedCarriesTheSignalsCode(t *testing.T) {
	for _, tc := range []struct {
		sig  os.Signal
		code int
		name string
	}{
		{os.Interrupt, Interrupted, "SIGINT"},
		{syscall.SIGTERM, Terminated, "SIGTERM"},
	} {
		err := fmt.Errorf("awaiting the replacement: %w", Stopped(tc.sig))
		if got := Of(err); got != tc.code {
			t.Errorf("%s: code %d, want %d", tc.name, got, tc.code)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v is not context.Canceled", tc.name, err)
		}
		if got := Class(Of(err)); got != "interrupted" {
			t.Errorf("%s: class %q, want interrupted", tc.name, got)
		}
	}
}

func TestClassNamesEveryCode(t *testing.T) {
	for code, want := range map[int]string{
		Failure: "failure", Usage: "usage", Unsafe: "unsafe", Timeout: "timeout", Locked: "locked",
		Forbidden: "forbidden", Unreachable: "unreachable", Interrupted: "interrupted", Terminated: "interrupted", 42: "failure",
	} {
		if got := Class(code); got != want {
			t.Errorf("Class(%d) = %q, want %q", code, got, want)
		}
	}
}
