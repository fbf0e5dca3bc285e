package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	yaml "go.yaml.in/yaml/v3"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/rollout"
)

const (
	envPrefix  = "CP_ROLLOUT"
	configFlag = "config"
)

// defaultConfigFile is $XDG_CONFIG_HOME/cp-rollout/config.yaml (or the
// platform's equivalent); empty when no config directory can be determined.
func defaultConfigFile() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "cp-rollout", "config.yaml")
}

// envName is the environment variable that configures a flag:
// --request-timeout is CP_ROLLOUT_REQUEST_TIMEOUT.
func envName(flag string) string {
	return envPrefix + "_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// configurable lists the only flags that the environment and the config file
// may set: which kubeconfig and which of its contexts, how output looks, and
// how long waits and requests may take. They are a person's or a site's
// settings, the same whatever is being rolled. Every other flag says what is
// acted on, as whom, or how (--version, --replicas, -A, -l, -n, --as,
// --token, --server, --force, --yes, --parallel, --dry-run, --max-surge …):
// those must be on the command line a person typed or a runbook wrote, where
// they are read before the command runs. A stray CP_ROLLOUT_VERSION in a
// shell, a CP_ROLLOUT_NAMESPACE=prod left from yesterday, or
// "all-namespaces: true" left in a file, would otherwise start an upgrade
// that the command line does not ask for, turn "upgrade demo" into prod/demo,
// or widen one to every cluster. A flag added later is refused here until it
// is listed.
var configurable = map[string]bool{
	// The kubeconfig and its context, as kubectl takes KUBECONFIG from the
	// environment: the kubeconfig, which a person chose and can read, names
	// the cluster, the namespace and the identity.
	"kubeconfig": true, "context": true,
	// How requests are made, never where to or as whom.
	"disable-compression": true, "request-timeout": true,
	// How etcd is reached is a property of the site's network. It does not
	// choose whose etcd answers: every member is verified against the
	// cluster's own etcd CA, read from the management cluster.
	"etcd-endpoint": true,
	// Display: the format of the output, and whether status shows etcd.
	"output": true, "etcd": true,
	// Wait limits: how slow this site's infrastructure may be. They bound
	// how long the tool waits, never what it changes.
	"timeout": true, "provision-timeout": true, "health-timeout": true, "delete-timeout": true,
	"soak": true, "handback-timeout": true, "no-wait": true, "workers-timeout": true, "unhealthy-grace": true,
	"topology-timeout": true, "gate-timeout": true, "stage-soak": true,
	// How long a machine takes here, which maintenance windows must hold,
	// and where the site records its fleet runs.
	"machine-time": true, "run-namespace": true,
	// --soak's former name, still read where a site's file has it.
	settleFlag: true,
}

// targetOrIdentity are kubectl's connection flags that choose, beside the
// kubeconfig, the management cluster (--server, --cluster, and what decides
// which server is trusted to be it), the namespace, or the identity the tool
// acts as (--user, credentials, impersonation). kubectl reads none of them
// from the environment; here they come from the command line only, like
// what is acted on, and are refused with a reason of their own.
var targetOrIdentity = map[string]bool{
	"namespace": true, "server": true, "cluster": true, "tls-server-name": true, "certificate-authority": true,
	"insecure-skip-tls-verify": true, "user": true, "client-certificate": true, "client-key": true, "token": true,
	"username": true, "password": true, "as": true, "as-group": true, "as-uid": true,
}

// credential are the flags whose value is a secret, never repeated in an
// error; --gate's command may hold one too (a token in a curl).
var credential = map[string]bool{"token": true, "password": true, "gate": true}

// runsCommand are the flags whose value the tool runs as the operator: only
// what the operator typed, or a runbook wrote on the command line, may name
// one, never a file or a variable left in a shell that nobody reads before
// the run.
var runsCommand = map[string]bool{"gate": true}

// notConfigurable explains a refused key or variable; flag is its name.
func notConfigurable(flag string) string {
	const may = "the config file and environment may set only the kubeconfig and context, and network, display and wait settings"
	if runsCommand[flag] {
		return fmt.Sprintf("--%s runs a command as you, so it comes only from the command line (pass --%s there); %s", flag, flag, may)
	}
	if targetOrIdentity[flag] {
		return fmt.Sprintf("the namespace, cluster and identity come only from the command line or the kubeconfig's context (pass --%s there); %s", flag, may)
	}
	return fmt.Sprintf("what to act on and how is given only on the command line (pass --%s there); %s", flag, may)
}

// checkEnvironment refuses a variable, among those naming a flag of the
// command tree, that sets a flag outside configurable. An empty variable sets
// nothing (viper ignores it too), so it is no reason to refuse.
func checkEnvironment(known map[string]bool) error {
	names := make([]string, 0, len(known))
	for name := range known {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if value := os.Getenv(envName(name)); value != "" && !configurable[name] {
			if credential[name] {
				value = "…" // an error line ends up in logs and tickets
			}
			return exitcode.Usagef("environment variable %s=%s is not allowed: %s%s", envName(name), value, notConfigurable(name), inGate(name))
		}
	}
	return nil
}

// inGate explains a refused variable that a --gate command was given, to
// one that runs the tool again (`kubectl cp-rollout status` as a check):
// the gate's environment names the cluster and namespace for its own use,
// and a variable of a flag's name would set that flag.
func inGate(flag string) string {
	gateSets := map[string]bool{rollout.GateEnvCluster: true, rollout.GateEnvNamespace: true}
	if os.Getenv(rollout.GateEnvStep) == "" || !gateSets[envName(flag)] {
		return ""
	}
	return fmt.Sprintf(" (it is set for a --gate command; unset it there before running kubectl cp-rollout: env -u %s -u %s kubectl cp-rollout …)",
		rollout.GateEnvCluster, rollout.GateEnvNamespace)
}

// applyConfig fills every flag the user did not give on the command line, first
// from the environment and then from the configuration file, so precedence is
// flag > environment > file. Keys in the file are flag names, and only those
// in configurable; any other, in either place, is refused before a flag is set.
func applyConfig(cmd *cobra.Command, file string) error {
	known := knownFlags(cmd.Root())
	if err := checkEnvironment(known); err != nil {
		return err
	}
	explicit := cmd.Flags().Changed(configFlag)
	if !explicit {
		if env, ok := os.LookupEnv(envName(configFlag)); ok {
			file, explicit = env, true
		}
	}

	v := viper.New()
	v.SetEnvPrefix(envPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer("-", "_"))
	v.AutomaticEnv()

	fromFile := false
	if file != "" {
		raw, err := os.ReadFile(file)
		switch {
		case errors.Is(err, fs.ErrNotExist) && !explicit:
			// No file at the default location is the normal case.
		case err != nil:
			return exitcode.Usagef("config file %s: %v", file, errors.Unwrap(err))
		default:
			if err := checkConfigKeys(file, raw, known); err != nil {
				return err
			}
			v.SetConfigType("yaml")
			if err := v.ReadConfig(strings.NewReader(string(raw))); err != nil {
				return exitcode.Usagef("config file %s: %s", file, yamlReason(err))
			}
			fromFile = true
		}
	}

	typed := map[string]bool{}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		typed[f.Name] = true
		_ = cmd.Flags().SetAnnotation(f.Name, typedAnnotation, []string{"true"})
	})
	var setErr error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if setErr != nil || f.Changed || !configurable[f.Name] || !v.IsSet(f.Name) {
			return
		}
		// The command line gave the flag under its other name.
		if alias, ok := aliasOf[f.Name]; ok && typed[alias] {
			return
		}
		source := "config file " + file
		if _, ok := os.LookupEnv(envName(f.Name)); ok || !fromFile {
			source = "environment variable " + envName(f.Name)
		}
		values := flagValues(v.Get(f.Name))
		if outputs, ok := f.Annotations[outputValuesAnnotation]; ok && len(values) == 1 && !acceptsOutput(outputs, values[0]) {
			// output is one setting for every verb, a site's default
			// for status, say (wide), that not every verb can print:
			// a value this verb does not take is not meant for it,
			// and is left out. Only a value no verb takes is a
			// mistake in the setting. Typed on the command line, it
			// is the verb's Validate that refuses it.
			if !acceptsOutput(everyOutput(cmd.Root()), values[0]) {
				setErr = exitcode.Usagef("%s: invalid value %q for --output: no verb prints it (the verbs' values are %s)",
					source, values[0], strings.Join(everyOutput(cmd.Root()), ", "))
			}
			return
		}
		for _, value := range values {
			if err := cmd.Flags().Set(f.Name, value); err != nil {
				setErr = exitcode.Usagef("%s: invalid value %q for --%s: %v", source, value, f.Name, err)
				return
			}
		}
	})
	return setErr
}

// typedAnnotation marks, on a flag, that the command line gave it: once the
// config file and the environment have filled flags in, Changed no longer
// tells.
const typedAnnotation = "cp-rollout.io/typed"

// typed reports whether the command line gave the flag name.
func typed(f *pflag.FlagSet, name string) bool {
	fl := f.Lookup(name)
	return fl != nil && fl.Changed && (len(fl.Annotations[typedAnnotation]) > 0 || !configurable[name])
}

// everyOutput is every value of -o that some verb takes, in the order the
// verbs list them.
func everyOutput(root *cobra.Command) []string {
	var all []string
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if f := c.Flags().Lookup("output"); f != nil {
			for _, v := range f.Annotations[outputValuesAnnotation] {
				if !slices.Contains(all, v) {
					all = append(all, v)
				}
			}
		}
		for _, child := range c.Commands() {
			walk(child)
		}
	}
	walk(root)
	return all
}

// flagValues turns a configured value into what pflag's Set accepts: lists
// (for repeatable flags such as --as-group) become one Set per element.
func flagValues(v any) []string {
	if list, ok := v.([]any); ok {
		out := make([]string, 0, len(list))
		for _, e := range list {
			out = append(out, fmt.Sprint(e))
		}
		return out
	}
	return []string{fmt.Sprint(v)}
}

// knownFlags lists every flag name used anywhere in the command tree: a key in
// the shared config file is valid if some verb understands it.
func knownFlags(root *cobra.Command) map[string]bool {
	known := map[string]bool{}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		add := func(f *pflag.Flag) { known[f.Name] = true }
		c.LocalFlags().VisitAll(add)
		c.PersistentFlags().VisitAll(add)
		for _, child := range c.Commands() {
			walk(child)
		}
	}
	walk(root)
	delete(known, configFlag)
	delete(known, "help")
	return known
}

// checkConfigKeys rejects a file that is not a flat mapping of configurable
// flag names, naming the line, so a typo such as "namspace:" is not silently
// ignored and a key such as "version:" is not silently obeyed.
// yaml.v3 is used directly because viper discards line numbers.
func checkConfigKeys(file string, raw []byte, known map[string]bool) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return exitcode.Usagef("config file %s: %s", file, yamlReason(err))
	}
	if len(doc.Content) == 0 {
		return nil // an empty file configures nothing
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return exitcode.Usagef("config file %s: line %d: expected a mapping of flag names to values", file, top.Line)
	}
	for i := 0; i < len(top.Content); i += 2 {
		key := top.Content[i]
		if !known[key.Value] {
			return exitcode.Usagef("config file %s: line %d: unknown key %q (keys are flag names, such as %s)",
				file, key.Line, key.Value, strings.Join(exampleKeys(known), ", "))
		}
		if !configurable[key.Value] {
			return exitcode.Usagef("config file %s: line %d: key %q is not allowed: %s", file, key.Line, key.Value, notConfigurable(key.Value))
		}
		if val := top.Content[i+1]; val.Kind == yaml.MappingNode {
			return exitcode.Usagef("config file %s: line %d: %q takes a value or a list, not a mapping", file, val.Line, key.Value)
		}
	}
	return nil
}

func exampleKeys(known map[string]bool) []string {
	var keys []string
	for _, k := range []string{"context", "kubeconfig", "output", "request-timeout"} {
		if known[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// yamlReason keeps the line-numbered part of a YAML error ("line 3: mapping
// values are not allowed in this context") and drops the library prefixes.
func yamlReason(err error) string {
	msg := err.Error()
	for _, prefix := range []string{"While parsing config: ", "yaml: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return strings.ReplaceAll(msg, "\n", "; ")
}
