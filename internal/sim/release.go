package sim

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// A Release is one Cluster API release's own controller binaries — the core,
// kubeadm bootstrap and kubeadm control plane managers — with that release's
// CRDs and webhook configurations, built from its module on the Go module
// proxy (BuildRelease). A simulator started with Options.CAPIVersion runs
// them as processes against its management API server, each serving its own
// admission and conversion webhooks, as a real management cluster runs them.
//
// Without a release the simulator runs Cluster API v1.14.2's controllers
// in-process, from the packages this module links: that starts in a fraction
// of the time (no three processes to start and no webhook round trips
// between processes) and needs no build, so it stays the default. A release
// answers what in-process code cannot: how another release's KCP decides.
type Release struct {
	Version string
	// Dir holds <provider>-manager for each provider and manifests/<provider>/
	// with the provider's crd/*.yaml and webhooks.yaml.
	Dir string
}

// releaseProvider is one of a release's three providers: the name of its
// manager binary and manifests, where its manager and config live in the
// cluster-api module, and the prefix a release's kustomize gives its
// webhook configurations (every provider calls its own
// "validating-webhook-configuration").
type releaseProvider struct {
	name, pkg, webhookPrefix string
	// groups are the API groups whose CRDs the provider converts.
	groups []string
}

// releaseProviders lists the providers in start order: the core provider
// first, whose webhooks admit the objects the other two write.
func releaseProviders(minor int) []releaseProvider {
	core := "." // v1.14 moved the core provider under core/
	if minor >= 14 {
		core = "core"
	}
	return []releaseProvider{
		{"core", core, "capi-", []string{"cluster.x-k8s.io", "addons.cluster.x-k8s.io", "ipam.cluster.x-k8s.io", "runtime.cluster.x-k8s.io"}},
		{"bootstrap", "bootstrap/kubeadm", "capi-kubeadm-bootstrap-", []string{"bootstrap.cluster.x-k8s.io"}},
		{"controlplane", "controlplane/kubeadm", "capi-kubeadm-control-plane-", []string{"controlplane.cluster.x-k8s.io"}},
	}
}

var releaseVersion = regexp.MustCompile(`^v1\.(\d+)\.\d+$`)

// releaseMinor returns the minor of a Cluster API release version such as
// v1.13.6.
func releaseMinor(version string) (int, error) {
	m := releaseVersion.FindStringSubmatch(version)
	if m == nil {
		return 0, fmt.Errorf("%q is not a Cluster API release such as v1.13.6", version)
	}
	return strconv.Atoi(m[1])
}

// ReleaseCacheDir is where BuildRelease keeps a release:
// $XDG_CACHE_HOME/cp-rollout/capi/<version> (~/.cache when unset), beside
// the API server's binaries, so fresh clones and CI runs on one machine
// reuse it.
func ReleaseCacheDir(version string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "cp-rollout", "capi", version), nil
}

// BuildRelease returns the release version from the cache, building its
// managers and copying its manifests first when they are not there. The
// first build of a release takes minutes on two cores; progress goes to
// progress.
func BuildRelease(ctx context.Context, version string, progress io.Writer) (*Release, error) {
	minor, err := releaseMinor(version)
	if err != nil {
		return nil, err
	}
	dir, err := ReleaseCacheDir(version)
	if err != nil {
		return nil, err
	}
	r := &Release{Version: version, Dir: dir}
	if r.complete(minor) {
		return r, nil
	}
	if _, err := exec.LookPath("go"); err != nil {
		return nil, fmt.Errorf("building Cluster API %s's controllers needs the go command: %w", version, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	src, err := downloadModule(ctx, "sigs.k8s.io/cluster-api@"+version)
	if err != nil {
		return nil, err
	}
	mod, err := buildModule(src, version, filepath.Join(dir, ".build"))
	if err != nil {
		return nil, err
	}
	ldflags := fmt.Sprintf("-X sigs.k8s.io/cluster-api/version.gitVersion=%s -X sigs.k8s.io/cluster-api/version.gitMajor=1 -X sigs.k8s.io/cluster-api/version.gitMinor=%d", version, minor)
	for _, p := range releaseProviders(minor) {
		bin := filepath.Join(dir, p.name+"-manager")
		if isExecutable(bin) {
			continue
		}
		pkg := strings.TrimSuffix("sigs.k8s.io/cluster-api/"+p.pkg, "/.")
		fmt.Fprintf(progress, "building Cluster API %s %s manager (%s) into %s\n", version, p.name, pkg, dir)
		// Build into a temporary name and rename, so an interrupted or
		// concurrent build never leaves a truncated binary behind.
		tmp := filepath.Join(dir, fmt.Sprintf(".%s-manager.%d", p.name, os.Getpid()))
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", tmp, pkg)
		cmd.Dir = mod
		cmd.Stdout, cmd.Stderr = progress, io.MultiWriter(progress, &out)
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
		if err := cmd.Run(); err != nil {
			_ = os.Remove(tmp)
			// go names the module it could not download in its last lines.
			return nil, fmt.Errorf("building %s of sigs.k8s.io/cluster-api@%s: %w: %s", pkg, version, err, lastLines(out.String(), 3))
		}
		if err := os.Rename(tmp, bin); err != nil {
			return nil, err
		}
	}
	if err := copyReleaseManifests(src, dir, minor); err != nil {
		return nil, err
	}
	return r, nil
}

// lastLines is the last n lines of s, joined by "; ".
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "; ")
}

func (r *Release) complete(minor int) bool {
	for _, p := range releaseProviders(minor) {
		if !isExecutable(filepath.Join(r.Dir, p.name+"-manager")) {
			return false
		}
		if _, err := os.Stat(filepath.Join(r.Dir, "manifests", p.name, "webhooks.yaml")); err != nil {
			return false
		}
	}
	return true
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// downloadModule fetches a module through the Go module proxy and returns its
// directory in the module cache.
func downloadModule(ctx context.Context, module string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module)
	cmd.Stderr = &stderr
	cmd.Dir = os.TempDir() // outside any module, whose go.mod would constrain it
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jsonErr := json.Unmarshal(out, &info); jsonErr == nil && info.Error != "" {
		return "", fmt.Errorf("the Go module proxy does not serve %s: %s", module, strings.Join(strings.Fields(info.Error), " "))
	}
	if err != nil || info.Dir == "" {
		return "", fmt.Errorf("downloading %s: %v: %s", module, err, strings.TrimSpace(stderr.String()))
	}
	return info.Dir, nil
}

// buildModule writes, into dir, a module that requires the release with the
// release's own requirements and checksums, so every dependency is at the
// version the release was tested with. Building inside the release's module
// would do the same, but from v1.14 its go.mod replaces
// sigs.k8s.io/cluster-api/api with a directory a module download does not
// contain; here that module comes from the proxy at the release's version.
func buildModule(src, version, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	goMod, err := os.ReadFile(filepath.Join(src, "go.mod"))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "module cp-rollout.local/capi-release\n\ngo 1.26\n\nrequire sigs.k8s.io/cluster-api %s\n\n", version)
	for line := range strings.Lines(string(goMod)) {
		switch f := strings.Fields(line); {
		case len(f) > 0 && slices.Contains([]string{"module", "go", "toolchain", "replace"}, f[0]):
		default:
			b.WriteString(line)
		}
	}
	if bytes.Contains(goMod, []byte("sigs.k8s.io/cluster-api/api ")) {
		fmt.Fprintf(&b, "\nreplace sigs.k8s.io/cluster-api/api => sigs.k8s.io/cluster-api/api %s\n", version)
	}
	sum, err := os.ReadFile(filepath.Join(src, "go.sum"))
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{"go.mod": []byte(b.String()), "go.sum": sum, "doc.go": []byte("package main\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// copyReleaseManifests copies each provider's CRD bases and webhook
// configurations (its kustomize bases, before kustomize) out of the module.
func copyReleaseManifests(src, dir string, minor int) error {
	tmp, err := os.MkdirTemp(dir, ".manifests-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	copyFile := func(from, to string) error {
		data, err := os.ReadFile(from)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, 0o644)
	}
	for _, p := range releaseProviders(minor) {
		config := filepath.Join(src, p.pkg, "config")
		crds, err := filepath.Glob(filepath.Join(config, "crd", "bases", "*.yaml"))
		if err != nil || len(crds) == 0 {
			return fmt.Errorf("no CRDs in %s/crd/bases: %v", config, err)
		}
		to := filepath.Join(tmp, p.name, "crd")
		if err := os.MkdirAll(to, 0o755); err != nil {
			return err
		}
		for _, crd := range crds {
			if err := copyFile(crd, filepath.Join(to, filepath.Base(crd))); err != nil {
				return err
			}
		}
		if err := copyFile(filepath.Join(config, "webhook", "manifests.yaml"), filepath.Join(tmp, p.name, "webhooks.yaml")); err != nil {
			return err
		}
	}
	final := filepath.Join(dir, "manifests")
	if err := os.RemoveAll(final); err != nil {
		return err
	}
	return os.Rename(tmp, final)
}

// CRDs returns the release's CRDs with the contract labels a release's
// kustomize adds (internal/sim/manifests/gen explains them) and no conversion
// webhook yet: the managers' ports are not chosen when the CRDs are
// installed (see serveConversions).
func (r *Release) CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) {
	minor, err := releaseMinor(r.Version)
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, p := range releaseProviders(minor) {
		files, err := filepath.Glob(filepath.Join(r.Dir, "manifests", p.name, "crd", "*.yaml"))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, err
			}
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := yaml.Unmarshal(data, crd); err != nil {
				return nil, fmt.Errorf("decoding %s: %w", f, err)
			}
			if crd.Labels == nil {
				crd.Labels = map[string]string{}
			}
			for _, v := range crd.Spec.Versions {
				if key := "cluster.x-k8s.io/" + v.Name; v.Served && (v.Name == "v1beta1" || v.Name == "v1beta2") && crd.Labels[key] == "" {
					crd.Labels[key] = v.Name
				}
			}
			crd.Spec.Conversion = nil
			out = append(out, crd)
		}
	}
	return out, nil
}

// CAPIVersion is the Cluster API release whose controllers the simulator
// runs: Options.CAPIVersion's binaries, or the in-process v1.14.2.
func (s *Sim) CAPIVersion() string {
	if s.opts.release != nil {
		return s.opts.release.Version
	}
	return inProcessCAPIVersion
}

// logWriter writes each line written to it as an entry of log.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		w.log.Info(strings.TrimRight(line, "\n"))
	}
	return len(p), nil
}

// releaseManager is one of a release's managers running as a process.
type releaseManager struct {
	provider releaseProvider
	port     int
	cmd      *exec.Cmd
	exited   chan struct{}
	err      error // why it exited, once exited is closed
}

// startRelease starts the release's three managers against the management
// cluster, each with leader election off and its webhooks on a port of its
// own served with envtest's certificate, then points the release's webhook
// configurations and CRD conversions at them and waits until each serves.
func (s *Sim) startRelease(startCtx, runCtx context.Context) error {
	r := s.opts.release
	minor, err := releaseMinor(r.Version)
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(s.binDir, "management.kubeconfig")
	if err := os.WriteFile(kubeconfig, s.mgmtKubeconfig, 0o600); err != nil {
		return err
	}
	hooks := &s.mgmtEnv.WebhookInstallOptions
	var managers []*releaseManager
	for _, p := range releaseProviders(minor) {
		port, err := freePort()
		if err != nil {
			return err
		}
		m := &releaseManager{provider: p, port: port, exited: make(chan struct{})}
		args := []string{
			"--kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			"--webhook-port=" + strconv.Itoa(port),
			"--webhook-cert-dir=" + hooks.LocalServingCertDir,
			"--health-addr=0",
			"--diagnostics-address=0",
			"--insecure-diagnostics=true",
			// ClusterClass users install Cluster API with this gate on.
			"--feature-gates=ClusterTopology=true",
		}
		if err := s.startReleaseManager(m, filepath.Join(r.Dir, p.name+"-manager"), args); err != nil {
			return err
		}
		managers = append(managers, m)
		s.goRun(p.name+"-manager "+r.Version, func() error { return m.run(runCtx) })
	}
	ca := hooks.LocalServingCAData
	if err := s.installReleaseWebhooks(startCtx, managers, ca); err != nil {
		return err
	}
	for _, m := range managers {
		if err := m.waitServing(startCtx); err != nil {
			return err
		}
	}
	if err := s.serveConversions(startCtx, managers, ca); err != nil {
		return err
	}
	return warmWatchCaches(startCtx, s.mgmtConfig, s.mgmtEnv.CRDs)
}

// startReleaseManager starts a manager through setpriv, from a thread kept
// until the simulator stops (onOwnThread, see lifetime.go), so that it dies
// with the simulator's process however that ends. Its output goes to the simulator's
// log, a line per entry.
func (s *Sim) startReleaseManager(m *releaseManager, bin string, args []string) error {
	name, argv := bin, args
	if setpriv, err := exec.LookPath("setpriv"); err == nil {
		name, argv = setpriv, append([]string{"--pdeathsig", "KILL", "--", bin}, args...)
	}
	m.cmd = exec.Command(name, argv...)
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	m.cmd.Stderr = m.cmd.Stdout
	var startErr error
	onOwnThread(s.threadsRelease, func() { startErr = m.cmd.Start() })
	if startErr != nil {
		return fmt.Errorf("starting Cluster API %s %s manager: %w", s.opts.release.Version, m.provider.name, startErr)
	}
	log := s.opts.Log.WithName(m.provider.name + "-manager")
	go func() {
		lines := bufio.NewScanner(out)
		lines.Buffer(make([]byte, 64*1024), 1024*1024)
		for lines.Scan() {
			log.V(1).Info(lines.Text())
		}
		m.err = m.cmd.Wait()
		close(m.exited)
	}()
	return nil
}

// run waits until ctx ends, then stops the manager as a Deployment's
// rollout would (SIGTERM, then SIGKILL after a grace period); a manager that
// exits on its own first is an error.
func (m *releaseManager) run(ctx context.Context) error {
	select {
	case <-m.exited:
		return fmt.Errorf("exited: %v", m.err)
	case <-ctx.Done():
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(15 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	return ctx.Err()
}

// waitServing returns once the manager's webhook server accepts TLS
// connections: until then the API server fails every write its webhooks
// check.
func (m *releaseManager) waitServing(ctx context.Context) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port))
	dialer := &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // only whether it serves is checked
	for {
		conn, err := dialer.DialContext(ctx, "tcp", addr)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-m.exited:
			return fmt.Errorf("Cluster API %s manager exited before serving its webhooks: %v", m.provider.name, m.err)
		case <-ctx.Done():
			return fmt.Errorf("Cluster API %s manager does not serve its webhooks on %s (%v): %w", m.provider.name, addr, err, context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// installReleaseWebhooks creates each provider's webhook configurations
// under the name its release gives them, each webhook pointing at the
// provider's manager, as a Service in front of the manager's pod would.
func (s *Sim) installReleaseWebhooks(ctx context.Context, managers []*releaseManager, ca []byte) error {
	for _, m := range managers {
		data, err := os.ReadFile(filepath.Join(s.opts.release.Dir, "manifests", m.provider.name, "webhooks.yaml"))
		if err != nil {
			return err
		}
		for doc := range strings.SplitSeq(string(data), "\n---") {
			var kind struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
				return err
			}
			var obj client.Object
			switch kind.Kind {
			case "MutatingWebhookConfiguration":
				c := &admissionv1.MutatingWebhookConfiguration{}
				if err := yaml.Unmarshal([]byte(doc), c); err != nil {
					return err
				}
				for i := range c.Webhooks {
					m.pointAt(&c.Webhooks[i].ClientConfig, ca)
				}
				obj = c
			case "ValidatingWebhookConfiguration":
				c := &admissionv1.ValidatingWebhookConfiguration{}
				if err := yaml.Unmarshal([]byte(doc), c); err != nil {
					return err
				}
				for i := range c.Webhooks {
					m.pointAt(&c.Webhooks[i].ClientConfig, ca)
				}
				obj = c
			default:
				continue
			}
			obj.SetName(m.provider.webhookPrefix + obj.GetName())
			if err := s.mgmt.Create(ctx, obj); err != nil {
				return fmt.Errorf("installing %s's webhook configuration %s: %w", m.provider.name, obj.GetName(), err)
			}
		}
	}
	return nil
}

func (m *releaseManager) pointAt(cc *admissionv1.WebhookClientConfig, ca []byte) {
	path := "/"
	if cc.Service != nil && cc.Service.Path != nil {
		path = *cc.Service.Path
	}
	cc.Service = nil
	cc.URL = ptr.To(fmt.Sprintf("https://127.0.0.1:%d%s", m.port, path))
	cc.CABundle = ca
}

// serveConversions points each CRD that serves more than one version at its
// provider's manager for conversion, as the release's kustomize patches do,
// once the managers serve.
func (s *Sim) serveConversions(ctx context.Context, managers []*releaseManager, ca []byte) error {
	for _, crd := range s.mgmtEnv.CRDs {
		var owner *releaseManager
		for _, m := range managers {
			if slices.Contains(m.provider.groups, crd.Spec.Group) {
				owner = m
			}
		}
		if owner == nil || len(crd.Spec.Versions) < 2 {
			continue
		}
		live := &apiextensionsv1.CustomResourceDefinition{}
		if err := s.mgmt.Get(ctx, client.ObjectKey{Name: crd.Name}, live); err != nil {
			return err
		}
		patch := client.MergeFrom(live.DeepCopy())
		cc := &admissionv1.WebhookClientConfig{}
		owner.pointAt(cc, ca)
		*cc.URL += "convert"
		live.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{
			Strategy: apiextensionsv1.WebhookConverter,
			Webhook: &apiextensionsv1.WebhookConversion{
				ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: cc.URL, CABundle: ca},
				ConversionReviewVersions: []string{"v1", "v1beta1"},
			},
		}
		if err := s.mgmt.Patch(ctx, live, patch); err != nil {
			return fmt.Errorf("pointing CRD %s's conversion at the %s manager: %w", crd.Name, owner.provider.name, err)
		}
	}
	return nil
}
