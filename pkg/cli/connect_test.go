package cli

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// authorizer answers the preflight's reviews as an API server would for an
// identity that may do everything but read Secrets (when secrets is false).
func authorizer(secrets bool) client.Client {
	return authorizerFor(func(a *authorizationv1.ResourceAttributes) bool { return secrets || a.Resource != "secrets" })
}

// authorizerFor answers the preflight's reviews as an API server would for
// the identity "oncall", which may do what allowed says, and serves objs.
func authorizerFor(allowed func(*authorizationv1.ResourceAttributes) bool, objs ...client.Object) client.Client {
	return fake.NewClientBuilder().WithScheme(controlplane.Scheme()).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			switch review := obj.(type) {
			case *authorizationv1.SelfSubjectRulesReview:
				return errors.New("rules reviews are not served here: each permission is asked on its own")
			case *authorizationv1.SelfSubjectAccessReview:
				review.Status.Allowed = allowed(review.Spec.ResourceAttributes)
			case *authenticationv1.SelfSubjectReview:
				review.Status.UserInfo.Username = "oncall"
			}
			return nil
		},
	}).Build()
}

// anything and readOnlyAccess are identities for authorizerFor: one that may
// do everything, and one that may only read (cp-rollout-view and the
// cluster's Secrets, say), which a run refuses.
func anything(*authorizationv1.ResourceAttributes) bool { return true }
func readOnlyAccess(a *authorizationv1.ResourceAttributes) bool {
	return a.Verb == "get" || a.Verb == "list" || a.Verb == "watch"
}

// kcpControllerAt is the KCP controller's Deployment as clusterctl installs
// it, running version.
func kcpControllerAt(version string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: controlplane.KCPControllerNamespace, Name: controlplane.KCPControllerDeployment},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "manager", Image: "registry.k8s.io/cluster-api/kubeadm-control-plane-controller:" + version}}}}},
	}
}

// TestRunChecks: what a run checks after its first read and before anything
// is locked or written, which connect refuses a run on and plan reports. An
// unproven --kcp-version is refused first, before any permission is asked,
// as the run's Validate refuses it before any read; then the operate roles'
// permissions, each missing one named; then the KCP controller's version as
// its Deployment says, which a proven --kcp-version spares.
func TestRunChecks(t *testing.T) {
	kcp := &controlplanev1.KubeadmControlPlane{}
	for _, tc := range []struct {
		name       string
		kcpVersion string
		allowed    func(*authorizationv1.ResourceAttributes) bool
		objs       []client.Object
		code       int
		says       []string
	}{
		{name: "proven controller, every permission", allowed: anything, objs: []client.Object{kcpControllerAt("v1.14.2")}},
		{name: "proven --kcp-version, no Deployment to read", kcpVersion: "v1.13.6",
			allowed: func(a *authorizationv1.ResourceAttributes) bool { return a.Resource != "deployments" }},
		{name: "unproven --kcp-version", kcpVersion: "v1.12.4", allowed: anything, objs: []client.Object{kcpControllerAt("v1.14.2")},
			code: exitcode.Unsafe, says: []string{"KCP controller is v1.12.4", "proven with KCP " + rollout.ProvenKCPRange()}},
		{name: "unproven --kcp-version before the permissions", kcpVersion: "v1.12.4", allowed: readOnlyAccess,
			code: exitcode.Unsafe, says: []string{"KCP controller is v1.12.4"}},
		{name: "unproven controller", allowed: anything, objs: []client.Object{kcpControllerAt("v1.15.0")},
			code: exitcode.Unsafe, says: []string{"KCP controller is v1.15.0", "name a proven version with --kcp-version"}},
		{name: "no controller found", allowed: anything,
			code: exitcode.Unsafe, says: []string{"no KubeadmControlPlane controller Deployment", "pass --kcp-version"}},
		{name: "read-only identity", allowed: readOnlyAccess, objs: []client.Object{kcpControllerAt("v1.14.2")},
			code: exitcode.Forbidden, says: []string{
				"oncall lacks", "that a rollout needs on the management cluster",
				"cannot patch kubeadmcontrolplanes.controlplane.cluster.x-k8s.io in namespace capi-prod",
				"cannot update leases.coordination.k8s.io cp-rollout-eu1 in namespace capi-prod",
				"Role cp-rollout-operate-eu1",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &connection{Namespace: "capi-prod", Cluster: "eu1", KCPVersion: tc.kcpVersion}
			err := c.runChecks(context.Background(), controlplane.New(authorizerFor(tc.allowed, tc.objs...), c.Namespace, c.Cluster), kcp)
			if got := exitcode.Of(err); got != tc.code {
				t.Fatalf("exit %d (%v), want %d", got, err, tc.code)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("the refusal does not say %q:\n%v", s, err)
				}
			}
		})
	}
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
	_, err := (&http.Client{Timeout: 200 * time.Millisecond}).Get("http://" + silentServer(t) + "/api")
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

// silentServer is the address of a server that accepts connections and never
// answers, until the test ends.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // accepted, never answered
		}
	}()
	return l.Addr().String()
}

// TestFirstReadOfWhatIsNotThere: the verb's first read finding no Cluster
// of the name given, or a server the kubeconfig points at that is no Cluster
// API management cluster, is bad input (exit 2) saying where to look, not an
// unsafe cluster (exit 3) or a failure (exit 1). The same Cluster gone
// later in a run stays exit 3.
func TestFirstReadOfWhatIsNotThere(t *testing.T) {
	ctx := context.Background()
	t.Run("no such cluster", func(t *testing.T) {
		// An API server with Cluster API, and no Cluster demo.
		mapper := meta.NewDefaultRESTMapper(nil)
		mapper.Add(clusterv1.GroupVersion.WithKind("Cluster"), meta.RESTScopeNamespace)
		kube := fake.NewClientBuilder().WithScheme(controlplane.Scheme()).WithRESTMapper(mapper).Build()
		c := &connection{Management: &restConfigOf{}, Namespace: "default", Cluster: "demo"}
		_, _, err := controlplane.New(kube, c.Namespace, c.Cluster).ReadKCP(ctx)
		if got := exitcode.Of(err); got != exitcode.Unsafe {
			t.Fatalf("mid-run, a Cluster gone: exit %d (%v), want %d", got, err, exitcode.Unsafe)
		}
		err = c.notThere(kube, "https://mgmt", err)
		for _, want := range []string{"cluster default/demo not found", "-n NAMESPACE", "-A", "kubectl get clusters -A"} {
			if exitcode.Of(err) != exitcode.Usage || !strings.Contains(err.Error(), want) {
				t.Errorf("first read, no Cluster: exit %d (%v), want %d saying %q", exitcode.Of(err), err, exitcode.Usage, want)
			}
		}
	})

	for _, tc := range []struct {
		name   string
		server http.Handler
		want   string
	}{
		{"not a Kubernetes API server", http.NotFoundHandler(), "does not answer as a Kubernetes API server"},
		{"Kubernetes without Cluster API", kubernetesWithoutClusterAPI(), "serves no Cluster API (no kind Cluster in cluster.x-k8s.io)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server := httptest.NewServer(tc.server)
			t.Cleanup(server.Close)
			c := &connection{Management: &restConfigOf{Host: server.URL}, Namespace: "default", Cluster: "demo"}
			_, err := c.connectManagement(ctx, noLoop)
			if exitcode.Of(err) != exitcode.Usage || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), server.URL) || !strings.Contains(err.Error(), "does not point at a Cluster API management cluster") {
				t.Errorf("exit %d (%v), want %d naming %s and saying %q", exitcode.Of(err), err, exitcode.Usage, server.URL, tc.want)
			}
		})
	}
}

// kubernetesWithoutClusterAPI answers discovery as an API server with the
// core and apps groups alone would, and 404 to anything else.
func kubernetesWithoutClusterAPI() http.Handler {
	answers := map[string]string{
		"/api":          `{"kind":"APIVersions","versions":["v1"]}`,
		"/apis":         `{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}],"preferredVersion":{"groupVersion":"apps/v1","version":"v1"}}]}`,
		"/api/v1":       `{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"pods","singularName":"pod","namespaced":true,"kind":"Pod","verbs":["get","list"]}]}`,
		"/apis/apps/v1": `{"kind":"APIResourceList","groupVersion":"apps/v1","resources":[{"name":"deployments","singularName":"deployment","namespaced":true,"kind":"Deployment","verbs":["get","list"]}]}`,
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := answers[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(body))
	})
}

// TestKubeconfigClusterFlagIsNotTheClusterArgument: --cluster naming no
// entry of the kubeconfig is told what --cluster is, and that the Cluster
// API cluster is the CLUSTER argument (exit 2); one it has is no error.
func TestKubeconfigClusterFlagIsNotTheClusterArgument(t *testing.T) {
	isolate(t)
	r := run(t, "status", "demo", "--cluster", "demo")
	for _, want := range []string{`the kubeconfig has no cluster entry "demo" (it has: nowhere)`, "not the Cluster API cluster, which is the CLUSTER argument"} {
		if r.code != exitcode.Usage || !strings.Contains(r.err.Error(), want) || strings.Contains(r.err.Error(), "\n") {
			t.Errorf("status demo --cluster demo: exit %d (%v), want %d, one line saying %q", r.code, r.err, exitcode.Usage, want)
		}
	}
	// The kubeconfig's own entry: the tool goes on to dial it (no one there).
	if r := run(t, "status", "demo", "--cluster", "nowhere"); r.code != exitcode.Unreachable {
		t.Errorf("status demo --cluster nowhere: exit %d (%v), want %d", r.code, r.err, exitcode.Unreachable)
	}
}
