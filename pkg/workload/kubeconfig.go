package workload

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clientcmdlatest "k8s.io/client-go/tools/clientcmd/api/latest"
	clientcmdv1 "k8s.io/client-go/tools/clientcmd/api/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/controllers/remote"
	"sigs.k8s.io/cluster-api/util/kubeconfig"
	"sigs.k8s.io/cluster-api/util/secret"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// requestTimeout bounds each request to the workload cluster, as Cluster
// API's remote.RESTConfig does for its controllers' workload clients.
const requestTimeout = 10 * time.Second

// restConfigFromSecret is the REST config of the workload cluster of
// namespace/cluster, built from its <cluster>-kubeconfig Secret.
//
// Whoever can write Secrets in the Cluster's namespace writes that
// kubeconfig, and the tool runs on an operator's workstation: a kubeconfig
// that names a command (exec, auth-provider) would run it there, one that
// names a local path (tokenFile, client-certificate, client-key,
// certificate-authority) would read the operator's files, a proxy-url or
// insecure-skip-tls-verify would send the workload cluster's admin
// credentials elsewhere, a server that is not https would send them in
// clear, and impersonation would act as someone else. So only
// embedded credentials are accepted, and the check comes before clientcmd
// sees the kubeconfig: its ClientConfig opens the certificate files and
// reads tokenFile while it builds the config. The Secret is read once, so
// what is checked is what is used.
func restConfigFromSecret(ctx context.Context, mgmt client.Reader, cluster client.ObjectKey) (*rest.Config, error) {
	data, err := kubeconfig.FromSecret(ctx, mgmt, cluster)
	if err != nil {
		return nil, fmt.Errorf("workload cluster %s: reading its kubeconfig Secret: %w", cluster, err)
	}
	return restConfig(data, client.ObjectKey{Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, secret.Kubeconfig)})
}

// restConfig builds a REST config from the kubeconfig data of the Secret
// named from, refusing one that holds anything but embedded credentials.
func restConfig(data []byte, from client.ObjectKey) (*rest.Config, error) {
	// Decoded to the serialized form (v1), as clientcmd.Load decodes it
	// before converting, because its lists keep the order the Secret has:
	// the refusal can name the field by its index there.
	kc := &clientcmdv1.Config{}
	gvk := &schema.GroupVersionKind{Version: clientcmdlatest.Version, Kind: "Config"}
	if _, _, err := clientcmdlatest.Codec.Decode(data, gvk, kc); err != nil {
		return nil, exitcode.Unsafef("kubeconfig Secret %s: %v", from, err)
	}
	if field, why := refusedField(kc); field != "" {
		return nil, exitcode.Unsafef("refusing the kubeconfig in Secret %s: %s %s; put a kubeconfig with embedded credentials only "+
			"(certificate-authority-data, client-certificate-data and client-key-data, or token) in its %q key", from, field, why, secret.KubeconfigDataName)
	}
	cfg := clientcmdapi.NewConfig()
	if err := clientcmdlatest.Scheme.Convert(kc, cfg, nil); err != nil {
		return nil, exitcode.Unsafef("kubeconfig Secret %s: %v", from, err)
	}
	// client-go's own guard against credential plugins, the exec plugin
	// policy, is set too, should clientcmd ever pick a user refusedField did
	// not look at. It cannot be the check itself: it covers exec alone, and
	// it refuses only when the plugin is about to run, at the first request,
	// with a message that names neither the Secret nor the field.
	for _, user := range cfg.AuthInfos {
		if user.Exec != nil {
			user.Exec.PluginPolicy = clientcmdapi.PluginPolicy{PolicyType: clientcmdapi.PluginPolicyDenyAll}
		}
	}
	rc, err := clientcmd.NewDefaultClientConfig(*cfg, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, exitcode.Unsafef("kubeconfig Secret %s: %v", from, err)
	}
	rc.UserAgent = remote.DefaultClusterAPIUserAgent("cp-rollout")
	rc.Timeout = requestTimeout
	return rc, nil
}

// refusedField names the first field of the kubeconfig's current context —
// its cluster and its user, the entries clientcmd builds a client from —
// that reaches beyond the credentials embedded in it, with what it would
// do; "" when there is none. Entries the context does not use are never
// read, so they are left alone.
func refusedField(kc *clientcmdv1.Config) (field, why string) {
	const (
		runs        = "would run a command on this machine"
		readsFile   = "would read a file on this machine"
		impersonate = "would act as another identity"
	)
	var current clientcmdv1.Context
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			current = c.Context
			break
		}
	}
	for i, u := range kc.AuthInfos {
		if u.Name == current.AuthInfo {
			user := u.AuthInfo
			if field, why := firstSet(fmt.Sprintf("users[%d].user.", i), []kubeconfigField{
				{user.Exec != nil, "exec", runs},
				{user.AuthProvider != nil, "auth-provider", "would run an authentication plugin on this machine"},
				{user.TokenFile != "", "tokenFile", readsFile},
				{user.ClientCertificate != "", "client-certificate", readsFile},
				{user.ClientKey != "", "client-key", readsFile},
				{user.Impersonate != "", "as", impersonate},
				{user.ImpersonateUID != "", "as-uid", impersonate},
				{len(user.ImpersonateGroups) > 0, "as-groups", impersonate},
				{len(user.ImpersonateUserExtra) > 0, "as-user-extra", impersonate},
			}); field != "" {
				return field, why
			}
			break
		}
	}
	for i, c := range kc.Clusters {
		if c.Name == current.Cluster {
			cluster := c.Cluster
			return firstSet(fmt.Sprintf("clusters[%d].cluster.", i), []kubeconfigField{
				{!isHTTPS(cluster.Server), "server", fmt.Sprintf("%q is not an https:// URL: it would send the admin credentials unencrypted", redacted(cluster.Server))},
				{cluster.CertificateAuthority != "", "certificate-authority", readsFile},
				{cluster.ProxyURL != "", "proxy-url", "would send the admin credentials through a proxy of the Secret's choosing"},
				{cluster.InsecureSkipTLSVerify, "insecure-skip-tls-verify", "would send the admin credentials to a server whose certificate is not verified"},
			})
		}
	}
	return "", ""
}

// isHTTPS reports whether server is an https URL with a host. client-go
// would speak plain HTTP to an http:// server, and to one without a scheme
// when the kubeconfig has no CA and no client certificate: a bearer token
// would then cross the network in clear.
func isHTTPS(server string) bool {
	u, err := url.Parse(server)
	return err == nil && u.Scheme == "https" && u.Host != ""
}

// redacted is server as an error may show it: without a password in it.
func redacted(server string) string {
	if u, err := url.Parse(server); err == nil {
		return u.Redacted()
	}
	return server
}

// kubeconfigField is one field refusedField looks at: whether it is set, its
// name in the kubeconfig, and what honouring it would do.
type kubeconfigField struct {
	set       bool
	name, why string
}

func firstSet(path string, fields []kubeconfigField) (field, why string) {
	for _, f := range fields {
		if f.set {
			return path + f.name, f.why
		}
	}
	return "", ""
}
