package exitcode

import (
	"context"
	"errors"
	"net"
	"net/url"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// IsUnreachable reports whether err says that a request to an API server got
// no answer, or an answer that refuses who we are: the connection was
// refused, the name did not resolve, TLS failed (the server's certificate or
// ours), the dial or the response timed out, a credential plugin could not
// produce a token (all of which client-go returns inside a *url.Error, the
// transport's error for a request that got no response), or the server
// answered 401 Unauthorized. A request that was cancelled is not: the run was
// stopped, and its stop explains the error.
//
// It judges an error alone, not when it happened: only the first request of a
// run may be taken for Unreachable, since a connection lost later may leave
// things half-changed (see the callers in pkg/cli).
func IsUnreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if apierrors.IsUnauthorized(err) {
		return true
	}
	var (
		noResponse *url.Error
		dial       *net.OpError
		dns        *net.DNSError
	)
	// url.Parse's errors are *url.Error too; a URL that does not parse was
	// never sent.
	return errors.As(err, &noResponse) && noResponse.Op != "parse" ||
		errors.As(err, &dial) || errors.As(err, &dns)
}

// Cause is the part of an unreachable error that says what failed, for a
// one-line reason: the transport's own error without the request's method and
// URL around it (a *url.Error's Err), the API server's refusal without what
// was being read, or else err itself.
func Cause(err error) error {
	var (
		noResponse *url.Error
		status     apierrors.APIStatus
	)
	switch {
	case errors.As(err, &noResponse) && noResponse.Err != nil:
		return noResponse.Err
	case errors.As(err, &status):
		if e, ok := status.(error); ok {
			return e
		}
	}
	return err
}
