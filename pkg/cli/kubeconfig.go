package cli

import (
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeconfigFlags are kubectl's connection flags — --kubeconfig, --context,
// -n, --as, --request-timeout and the rest — bound with client-go's clientcmd,
// which kubectl's own flags are built on. cli-runtime's ConfigFlags would add
// kubectl's resource builder and kustomize to the binary: megabytes the tool
// never runs, and their package initialisation on every start.
type kubeconfigFlags struct {
	rules     *clientcmd.ClientConfigLoadingRules
	overrides clientcmd.ConfigOverrides
}

func newKubeconfigFlags() *kubeconfigFlags {
	return &kubeconfigFlags{rules: clientcmd.NewDefaultClientConfigLoadingRules()}
}

// AddFlags adds the flags to fs, named as kubectl names them.
func (f *kubeconfigFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.rules.ExplicitPath, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use for CLI requests.")
	names := clientcmd.RecommendedConfigOverrideFlags("")
	names.ClusterOverrideFlags.APIServer.ShortName = "s" // -s, --server, as in kubectl
	names.ClusterOverrideFlags.ProxyURL.LongName = ""    // not one of kubectl's flags: left unbound
	clientcmd.BindOverrideFlags(&f.overrides, fs, names)
}

// Namespace is the --namespace flag's value; empty when not given.
func (f *kubeconfigFlags) Namespace() string { return f.overrides.Context.Namespace }

// ToRawKubeConfigLoader is the kubeconfig as the flags select it.
func (f *kubeconfigFlags) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(f.rules, &f.overrides)
}

// ToRESTConfig is the management cluster's connection as the flags select it.
func (f *kubeconfigFlags) ToRESTConfig() (*rest.Config, error) {
	return f.ToRawKubeConfigLoader().ClientConfig()
}
