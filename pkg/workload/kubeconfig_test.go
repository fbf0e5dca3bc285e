package workload

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientcmdlatest "k8s.io/client-go/tools/clientcmd/api/latest"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// embeddedOnly is a kubeconfig as CAPI writes one, but whose current context
// is the second of each list, and whose first user and cluster, which no
// context in use names, hold what would be refused in the used ones.
func embeddedOnly() *clientcmdv1.Config {
	return &clientcmdv1.Config{
		Clusters: []clientcmdv1.NamedCluster{
			{Name: "elsewhere", Cluster: clientcmdv1.Cluster{Server: "http://elsewhere:6443", InsecureSkipTLSVerify: true, ProxyURL: "http://proxy:3128"}},
			{Name: "demo", Cluster: clientcmdv1.Cluster{Server: "https://127.0.0.1:6443", CertificateAuthorityData: []byte("ca")}},
		},
		AuthInfos: []clientcmdv1.NamedAuthInfo{
			{Name: "stranger", AuthInfo: clientcmdv1.AuthInfo{Exec: &clientcmdv1.ExecConfig{Command: "/bin/true"}, TokenFile: "/etc/token"}},
			{Name: "demo-admin", AuthInfo: clientcmdv1.AuthInfo{ClientCertificateData: []byte("crt"), ClientKeyData: []byte("key"), Token: "token"}},
		},
		Contexts: []clientcmdv1.NamedContext{
			{Name: "stranger@elsewhere", Context: clientcmdv1.Context{Cluster: "elsewhere", AuthInfo: "stranger"}},
			{Name: "demo-admin@demo", Context: clientcmdv1.Context{Cluster: "demo", AuthInfo: "demo-admin"}},
		},
		CurrentContext: "demo-admin@demo",
	}
}

// TestRefusedField: every field of the used user and cluster that would run
// something, read a local file, or send the credentials elsewhere or as
// someone else is named by its place in the Secret's kubeconfig; embedded
// credentials pass, and so does what the current context does not use.
func TestRefusedField(t *testing.T) {
	user := func(kc *clientcmdv1.Config) *clientcmdv1.AuthInfo { return &kc.AuthInfos[1].AuthInfo }
	cluster := func(kc *clientcmdv1.Config) *clientcmdv1.Cluster { return &kc.Clusters[1].Cluster }
	for _, tc := range []struct {
		name   string
		mutate func(*clientcmdv1.Config)
		want   string
	}{
		{"embedded credentials", func(*clientcmdv1.Config) {}, ""},
		{"basic auth", func(kc *clientcmdv1.Config) { user(kc).Username, user(kc).Password = "admin", "secret" }, ""},
		{"tls-server-name", func(kc *clientcmdv1.Config) { cluster(kc).TLSServerName = "kubernetes" }, ""},
		{"exec", func(kc *clientcmdv1.Config) {
			user(kc).Exec = &clientcmdv1.ExecConfig{Command: "sh", Args: []string{"-c", "touch /tmp/pwned"}, APIVersion: "client.authentication.k8s.io/v1"}
		}, "users[1].user.exec"},
		{"auth-provider", func(kc *clientcmdv1.Config) {
			user(kc).AuthProvider = &clientcmdv1.AuthProviderConfig{Name: "oidc", Config: map[string]string{"idp-issuer-url": "https://issuer"}}
		}, "users[1].user.auth-provider"},
		{"tokenFile", func(kc *clientcmdv1.Config) { user(kc).TokenFile = "/var/run/secrets/token" }, "users[1].user.tokenFile"},
		{"client-certificate", func(kc *clientcmdv1.Config) { user(kc).ClientCertificate = "/home/op/.ssh/id_rsa" }, "users[1].user.client-certificate"},
		{"client-key", func(kc *clientcmdv1.Config) { user(kc).ClientKey = "/home/op/.ssh/id_rsa" }, "users[1].user.client-key"},
		{"as", func(kc *clientcmdv1.Config) { user(kc).Impersonate = "system:admin" }, "users[1].user.as"},
		{"as-uid", func(kc *clientcmdv1.Config) { user(kc).ImpersonateUID = "1234" }, "users[1].user.as-uid"},
		{"as-groups", func(kc *clientcmdv1.Config) { user(kc).ImpersonateGroups = []string{"system:masters"} }, "users[1].user.as-groups"},
		{"as-user-extra", func(kc *clientcmdv1.Config) { user(kc).ImpersonateUserExtra = map[string][]string{"scopes": {"all"}} }, "users[1].user.as-user-extra"},
		// A token or a client certificate would cross the network in clear.
		{"http server", func(kc *clientcmdv1.Config) { cluster(kc).Server = "http://127.0.0.1:6443" }, "clusters[1].cluster.server"},
		{"server without a scheme", func(kc *clientcmdv1.Config) { cluster(kc).Server = "127.0.0.1:6443" }, "clusters[1].cluster.server"},
		{"server without a host", func(kc *clientcmdv1.Config) { cluster(kc).Server = "https://" }, "clusters[1].cluster.server"},
		{"no server", func(kc *clientcmdv1.Config) { cluster(kc).Server = "" }, "clusters[1].cluster.server"},
		{"ws server", func(kc *clientcmdv1.Config) { cluster(kc).Server = "ws://127.0.0.1:6443" }, "clusters[1].cluster.server"},
		{"https server in capitals", func(kc *clientcmdv1.Config) { cluster(kc).Server = "HTTPS://127.0.0.1:6443" }, ""},
		{"certificate-authority", func(kc *clientcmdv1.Config) { cluster(kc).CertificateAuthority = "/etc/kubernetes/pki/ca.crt" }, "clusters[1].cluster.certificate-authority"},
		{"proxy-url", func(kc *clientcmdv1.Config) { cluster(kc).ProxyURL = "http://attacker:3128" }, "clusters[1].cluster.proxy-url"},
		{"insecure-skip-tls-verify", func(kc *clientcmdv1.Config) { cluster(kc).InsecureSkipTLSVerify = true }, "clusters[1].cluster.insecure-skip-tls-verify"},
		{"the context in use is the one checked", func(kc *clientcmdv1.Config) { kc.CurrentContext = "stranger@elsewhere" }, "users[0].user.exec"},
		{"a user wrong and its cluster wrong: the user is named", func(kc *clientcmdv1.Config) {
			user(kc).TokenFile, cluster(kc).InsecureSkipTLSVerify = "/token", true
		}, "users[1].user.tokenFile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := embeddedOnly()
			tc.mutate(kc)
			field, why := refusedField(kc)
			if field != tc.want {
				t.Fatalf("refusedField = %q (%s), want %q", field, why, tc.want)
			}
			if (field == "") != (why == "") {
				t.Errorf("field %q comes with reason %q: a refusal needs both", field, why)
			}
		})
	}
}

// TestRestConfigRefusesBeforeClientcmdReadsFiles: clientcmd opens
// client-certificate while it builds a config, and would fail on a path that
// does not exist; the refusal comes first, as Unsafe, naming the Secret, the
// field and the fix.
func TestRestConfigRefusesBeforeClientcmdReadsFiles(t *testing.T) {
	from := client.ObjectKey{Namespace: "team-a", Name: "demo-kubeconfig"}
	kc := embeddedOnly()
	kc.AuthInfos[1].AuthInfo.ClientCertificate = t.TempDir() + "/no-such-file"
	_, err := restConfig(encode(t, kc), from)
	if code := exitcode.Of(err); code != exitcode.Unsafe {
		t.Fatalf("exit code %d (%v), want %d", code, err, exitcode.Unsafe)
	}
	msg := err.Error()
	for _, want := range []string{"Secret team-a/demo-kubeconfig", "users[1].user.client-certificate", "would read a file", "embedded credentials only"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("the refusal is not one line: %q", msg)
	}
}

// TestRestConfigRefusesPlainHTTPServer: a server that is not https is
// refused as Unsafe, naming the Secret, the field and what it would do, and
// a password in its URL is not repeated.
func TestRestConfigRefusesPlainHTTPServer(t *testing.T) {
	from := client.ObjectKey{Namespace: "team-a", Name: "demo-kubeconfig"}
	kc := embeddedOnly()
	kc.Clusters[1].Cluster.Server = "http://admin:hunter2@10.0.0.1:6443"
	_, err := restConfig(encode(t, kc), from)
	if code := exitcode.Of(err); code != exitcode.Unsafe {
		t.Fatalf("exit code %d (%v), want %d", code, err, exitcode.Unsafe)
	}
	msg := err.Error()
	for _, want := range []string{"Secret team-a/demo-kubeconfig", "clusters[1].cluster.server", "is not an https:// URL", "unencrypted"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "hunter2") || strings.Contains(msg, "\n") {
		t.Errorf("the refusal repeats the password or is not one line: %q", msg)
	}
}

// TestRestConfigFromEmbeddedCredentials: a clean kubeconfig gives the
// config of its current context, with Cluster API's request timeout and no
// credential plugin.
func TestRestConfigFromEmbeddedCredentials(t *testing.T) {
	rc, err := restConfig(encode(t, embeddedOnly()), client.ObjectKey{Namespace: "team-a", Name: "demo-kubeconfig"})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Host != "https://127.0.0.1:6443" || string(rc.CAData) != "ca" || string(rc.CertData) != "crt" || string(rc.KeyData) != "key" || rc.BearerToken != "token" {
		t.Errorf("not the current context's cluster and user: host %q, CA %q, cert %q, key %q, token %q", rc.Host, rc.CAData, rc.CertData, rc.KeyData, rc.BearerToken)
	}
	if rc.ExecProvider != nil || rc.AuthProvider != nil || rc.Insecure || rc.Proxy != nil {
		t.Errorf("the config reaches beyond its embedded credentials: %+v", rc)
	}
	if rc.Timeout != requestTimeout {
		t.Errorf("timeout %s, want %s", rc.Timeout, requestTimeout)
	}
}

// encode writes kc as the Secret's "value" holds it.
func encode(t *testing.T, kc *clientcmdv1.Config) []byte {
	t.Helper()
	kc.APIVersion, kc.Kind = "v1", "Config"
	data, err := runtime.Encode(clientcmdlatest.Codec, kc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
