package cli

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// authorizer answers the preflight's reviews as an API server would for an
// identity that may do everything but read Secrets (when secrets is false).
func authorizer(secrets bool) client.Client {
	return fake.NewClientBuilder().WithScheme(controlplane.Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			switch review := obj.(type) {
			case *authorizationv1.SelfSubjectRulesReview:
				return errors.New("rules reviews are not served here: each permission is asked on its own")
			case *authorizationv1.SelfSubjectAccessReview:
				review.Status.Allowed = secrets || review.Spec.ResourceAttributes.Resource != "secrets"
			case *authenticationv1.SelfSubjectReview:
				review.Status.UserInfo.Username = "oncall"
			}
			return nil
		},
	}).Build()
}

// TestPreflightWithoutTheSecrets: an identity that may read everything on
// the management cluster but the cluster's two Secrets gets status's
// management half with one warning naming them, and a refusal of plan (exit
// 6) naming them and the Role that grants them; with the Secrets, neither.
func TestPreflightWithoutTheSecrets(t *testing.T) {
	c := &connection{Namespace: "capi-prod", Cluster: "eu1"}
	ctx := context.Background()

	var warnings bytes.Buffer
	workload, err := c.preflight(ctx, authorizer(false), viewOnly(&warnings), nil)
	want := "warning: showing the management cluster only: the workload cluster's nodes and etcd members need read access to Secrets eu1-kubeconfig and eu1-etcd in namespace capi-prod, which oncall lacks (Role cp-rollout-operate-eu1 grants it; `kubectl cp-rollout rbac eu1 -n capi-prod` prints it)\n"
	if workload || err != nil || warnings.String() != want {
		t.Errorf("status: workload %v, err %v, warnings:\n%s\nwant false, nil and\n%s", workload, err, warnings.String(), want)
	}

	warnings.Reset()
	workload, err = c.preflight(ctx, authorizer(false), readOnly(&warnings), nil)
	if workload || exitcode.Of(err) != exitcode.Forbidden || !strings.Contains(err.Error(), "oncall may not read Secrets eu1-kubeconfig and eu1-etcd in namespace capi-prod") ||
		!strings.Contains(err.Error(), "Role cp-rollout-operate-eu1") || warnings.Len() != 0 {
		t.Errorf("plan: workload %v, exit %d (%v), warnings %q: want a refusal naming the Secrets and the Role", workload, exitcode.Of(err), err, warnings.String())
	}

	for _, use := range []engineUse{viewOnly(&warnings), readOnly(&warnings)} {
		if workload, err := c.preflight(ctx, authorizer(true), use, nil); !workload || err != nil || warnings.Len() != 0 {
			t.Errorf("with the Secrets: workload %v, err %v, warnings %q", workload, err, warnings.String())
		}
	}
}

// TestFirstContactTimeoutIsUnreachable: an API server that accepts and never
// answers makes the first request time out, an error that also matches
// context.DeadlineExceeded; it is exit 7 (no answer), not 4 (a wait of the
// tool's that ran out).
func TestFirstContactTimeoutIsUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // accepted, never answered
		}
	}()
	_, err = (&http.Client{Timeout: 200 * time.Millisecond}).Get("http://" + l.Addr().String() + "/api")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request to a silent server: %v, want a timeout", err)
	}
	c := &connection{Management: newKubeconfigFlags()}
	if got := exitcode.Of(c.firstContact(context.Background(), err)); got != exitcode.Unreachable {
		t.Errorf("first contact timing out: exit %d, want %d", got, exitcode.Unreachable)
	}
}

// restConfigOf is a management connection as kubectl's flags would give it.
type restConfigOf rest.Config

func (r *restConfigOf) ToRESTConfig() (*rest.Config, error) {
	return rest.CopyConfig((*rest.Config)(r)), nil
}
func (r *restConfigOf) ToRawKubeConfigLoader() clientcmd.ClientConfig { return nil }

// TestManagementRequestsAreBounded: every request to the management cluster
// has a timeout, so that what a run does on its way out after Ctrl-C cannot
// hang on an API server that stopped answering; --request-timeout, when
// given, is kept.
func TestManagementRequestsAreBounded(t *testing.T) {
	for _, tc := range []struct {
		flag, want time.Duration
	}{{0, managementRequestTimeout}, {5 * time.Second, 5 * time.Second}} {
		c := &connection{Management: &restConfigOf{Host: "https://127.0.0.1:1", Timeout: tc.flag}}
		cfg, err := c.restConfig()
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Timeout != tc.want {
			t.Errorf("--request-timeout %s: requests bounded by %s, want %s", tc.flag, cfg.Timeout, tc.want)
		}
	}
}
