// Package simtest is the one harness the simulator's own tests, the etcd
// package's tests and the end-to-end tests share: a simulator started for a
// test (or shared by several) on a loopback /24 of its own, a polling helper,
// and the real plugin built once and run through the real kubectl, its JSON
// Lines events decoded. It is test support: the simulator does not import it.
package simtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/cp-rollout/cp-rollout/internal/sim"
)

// startTimeout bounds a simulator's start-up until ready: about half a minute
// on an idle two-core machine, several times that when the machine is busy
// (up to three minutes seen under make test for a cluster with workers).
const startTimeout = 6 * time.Minute

// startSlots admit two simulator start-ups at a time on the machine, across
// test binaries. Starting two API servers and their CRDs keeps both cores busy
// for several seconds, while a running scenario mostly waits: parallel tests
// overlap their scenarios, and this keeps a burst of them (`make test` runs
// test/e2e beside internal/sim) from starting a dozen API servers at once, each
// then too slow for its start-up timeout. A slot is held, like a /24, by
// listening on an address of its own, outside the range AddressPrefix hands
// out.
var startSlots = []string{"127.99.255.1:2379", "127.99.255.2:2379"}

// takeStartSlot waits for a free start-up slot and returns its release.
func takeStartSlot() func() {
	for {
		for _, addr := range startSlots {
			if ln, err := net.Listen("tcp", addr); err == nil {
				return func() { _ = ln.Close() }
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Env is a running simulator and a kubeconfig file for its management cluster
// whose current context is the Cluster's namespace, so kubectl and the plugin
// find the Cluster without flags.
type Env struct {
	Sim        *sim.Sim
	Kubeconfig string
	// AwaitKCP keeps the plugin's wait for KCP to agree after the hand-back.
	// Off by default: that wait is KCP's reconcile (2-3 s a run), not the
	// tool's, and most scenarios assert what the tool did before it. A
	// scenario about how a run ends, or a benchmark, turns it on.
	AwaitKCP bool
}

// Main runs a test binary's tests with the simulator's and controllers' logs
// going where SIM_LOG says (nowhere unless set), and releases what the tests
// shared (simulators, the plugin binary) when they are done. A package's
// TestMain is `func TestMain(m *testing.M) { simtest.Main(m) }`.
func Main(m *testing.M) {
	logger := Logger()
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	code := m.Run()
	teardown()
	os.Exit(code)
}

// Logger is where simulators started here log: stderr with timestamps when
// SIM_LOG is set, nowhere otherwise.
func Logger() logr.Logger {
	if os.Getenv("SIM_LOG") == "" {
		return logr.Discard()
	}
	return funcr.New(func(prefix, args string) {
		fmt.Fprintf(os.Stderr, "%s %s %s\n", time.Now().Format("15:04:05.000"), prefix, args)
	}, funcr.Options{})
}

var teardowns struct {
	sync.Mutex
	fns []func()
}

func atTeardown(fn func()) {
	teardowns.Lock()
	defer teardowns.Unlock()
	teardowns.fns = append(teardowns.fns, fn)
}

func teardown() {
	teardowns.Lock()
	defer teardowns.Unlock()
	for i := len(teardowns.fns) - 1; i >= 0; i-- {
		teardowns.fns[i]()
	}
	teardowns.fns = nil
}

// Start starts a simulator for the test, on a loopback /24 of its own unless
// opts names one, waits until its control plane is ready, and stops it when
// the test ends. Its Cluster lives in a namespace of its own on the test
// binary's shared management cluster (see management), whose controllers
// serve every simulator on it, unless the test needs one of its own: for an
// audit log of its own, to run without the KCP controller, or to run a
// Cluster API release's own binaries (Options.CAPIVersion). Missing
// binaries fail the test: a skipped simulator proves nothing.
func Start(t testing.TB, opts sim.Options) *Env {
	t.Helper()
	return startFor(t, opts, opts.AuditLog == "" && !opts.WithoutKCP && opts.CAPIVersion == "")
}

// StartOwn is Start with a management cluster of the simulator's own, for a
// scenario that restarts its API server.
func StartOwn(t testing.TB, opts sim.Options) *Env {
	t.Helper()
	return startFor(t, opts, false)
}

func startFor(t testing.TB, opts sim.Options, share bool) *Env {
	t.Helper()
	if share {
		m, err := management()
		if err != nil {
			t.Fatal(err)
		}
		opts.Management = m
	}
	e, stop, err := start(t, opts, t.TempDir())
	if stop != nil {
		t.Cleanup(func() {
			if err := stop(); err != nil {
				t.Errorf("stopping the simulator: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// shared is the test binary's management cluster, started by the first
// simulator that shares it and stopped after every simulator (see Main).
var shared struct {
	sync.Mutex
	m          *sim.Management
	err        error
	namespaces int
}

// management returns the shared management cluster, starting it first.
func management() (*sim.Management, error) {
	shared.Lock()
	defer shared.Unlock()
	if shared.m == nil && shared.err == nil {
		release := takeStartSlot()
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		shared.m, shared.err = sim.StartManagement(ctx, "", Logger())
		cancel()
		release()
		if shared.err != nil {
			shared.err = fmt.Errorf("starting the shared management cluster: %w", shared.err)
		} else {
			m := shared.m
			atTeardown(func() {
				if err := m.Stop(); err != nil {
					fmt.Fprintf(os.Stderr, "stopping the shared management cluster: %v\n", err)
				}
			})
		}
	}
	return shared.m, shared.err
}

// namespace names the next simulator's namespace on the shared management
// cluster: never one an earlier simulator used, whose objects remain.
func namespace() string {
	shared.Lock()
	defer shared.Unlock()
	shared.namespaces++
	return fmt.Sprintf("sim-%d", shared.namespaces)
}

func start(t testing.TB, opts sim.Options, dir string) (*Env, func() error, error) {
	t.Helper()
	if opts.AddressPrefix == "" {
		prefix, err := claimPrefix()
		if err != nil {
			return nil, nil, err
		}
		opts.AddressPrefix = prefix
	}
	if opts.Management != nil && opts.Namespace == "" {
		opts.Namespace = namespace()
	}
	if opts.Log.GetSink() == nil {
		opts.Log = Logger()
	}
	release := takeStartSlot()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	began := time.Now()
	s, err := sim.Start(ctx, opts)
	release()
	if err != nil {
		return nil, nil, fmt.Errorf("starting the simulator: %w", err)
	}
	if err := s.WaitReady(ctx); err != nil {
		return nil, s.Stop, err
	}
	raw, err := s.ManagementKubeconfig()
	if err != nil {
		return nil, s.Stop, err
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		return nil, s.Stop, err
	}
	t.Logf("simulator with %d replicas on %s.x, namespace %s, ready in %.1fs", s.Options().Replicas, opts.AddressPrefix, s.Options().Namespace, time.Since(began).Seconds())
	return &Env{Sim: s, Kubeconfig: path}, s.Stop, nil
}

// Shared is one simulator several tests use in turn, started by the first
// that asks and stopped when the test binary ends (see Main). Only scenarios
// that leave the control plane as they found it may share one; each takes it
// for its whole run, so they never overlap.
type Shared struct {
	opts sim.Options
	busy sync.Mutex

	once sync.Once
	env  *Env
	err  error
}

// NewShared describes a shared simulator; nothing starts until Use.
func NewShared(opts sim.Options) *Shared { return &Shared{opts: opts} }

// Use returns the shared simulator, started on first use, and holds it for
// the test until the test ends.
func (s *Shared) Use(t testing.TB) *Env {
	t.Helper()
	s.busy.Lock()
	t.Cleanup(s.busy.Unlock)
	s.once.Do(func() {
		dir, err := os.MkdirTemp("", "cp-rollout-shared-sim-")
		if err != nil {
			s.err = err
			return
		}
		opts := s.opts
		if opts.Management, s.err = management(); s.err != nil {
			return
		}
		var stop func() error
		s.env, stop, s.err = start(t, opts, dir)
		atTeardown(func() {
			if stop != nil {
				if err := stop(); err != nil {
					fmt.Fprintf(os.Stderr, "stopping the shared simulator: %v\n", err)
				}
			}
			_ = os.RemoveAll(dir)
		})
	})
	if s.err != nil {
		t.Fatalf("the shared simulator did not start: %v", s.err)
	}
	return s.env
}
