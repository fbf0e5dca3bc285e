package cli

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/etcd"
	"github.com/cp-rollout/cp-rollout/pkg/changes"
	"github.com/cp-rollout/cp-rollout/pkg/controlplane"
	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
	"github.com/cp-rollout/cp-rollout/pkg/progress"
	"github.com/cp-rollout/cp-rollout/pkg/workload"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// connection holds the clients a verb works with: the management cluster, the
// workload cluster and its etcd, with the flags that shape them.
type connection struct {
	Cluster      string
	Namespace    string
	EtcdEndpoint string // direct etcd endpoint template; empty = port-forward
	KCPVersion   string // override for the KCP controller version check
}

// connect builds the rollout engine for one cluster: an uncached management
// client, the workload client from the cluster's kubeconfig Secret and an etcd
// client with credentials minted from the cluster's etcd CA.
//
// Verbs that change the control plane (change) also check the KCP controller's
// version and start the watches the loop waits on; read-only verbs skip both.
func (c *connection) connect(ctx context.Context, flags *genericclioptions.ConfigFlags, reporter progress.Reporter, change bool) (*rollout.Engine, func(), error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, nil, exitcode.Usagef("management cluster: %v", err)
	}
	if c.Namespace == "" {
		ns, _, err := flags.ToRawKubeConfigLoader().Namespace()
		if err != nil {
			return nil, nil, exitcode.Usagef("namespace: %v", err)
		}
		c.Namespace = ns
	}
	// A snapshot is a dozen reads; client-go's default of 5 requests a second
	// would make every step wait on the client-side limiter.
	cfg.QPS, cfg.Burst = 50, 100
	mgmt, err := client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	if err != nil {
		return nil, nil, fmt.Errorf("management cluster: %w", err)
	}
	cp := controlplane.New(mgmt, c.Namespace, c.Cluster)
	state, err := cp.Read(ctx)
	if err != nil {
		return nil, nil, err
	}

	if change {
		version := c.KCPVersion
		if version == "" {
			if version, err = cp.KCPControllerVersion(ctx); err != nil {
				return nil, nil, err
			}
		}
		if err := rollout.CheckKCPVersion(version); err != nil {
			return nil, nil, err
		}
	}

	wl, err := workload.New(ctx, mgmt, c.Namespace, c.Cluster)
	if err != nil {
		return nil, nil, exitcode.New(exitcode.Unsafe, err)
	}
	engine := &rollout.Engine{ControlPlane: cp, Workload: wl, Reporter: reporter, Timeouts: rollout.DefaultTimeouts}
	closers := []func(){}
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}

	creds, err := etcd.LoadCredentials(ctx, mgmt, client.ObjectKeyFromObject(state.Cluster), state.KCP)
	switch {
	case errors.Is(err, etcd.ErrNotManaged):
		// External etcd: the loop takes no etcd steps.
	case err != nil:
		return nil, nil, exitcode.New(exitcode.Unsafe, err)
	default:
		var dialer etcd.Dialer
		if c.EtcdEndpoint != "" {
			if dialer, err = etcd.NewDirectDialer(c.EtcdEndpoint); err != nil {
				return nil, nil, exitcode.Usagef("--etcd-endpoint: %v", err)
			}
		} else if dialer, err = etcd.NewPortForwardDialer(wl.Config); err != nil {
			return nil, nil, err
		}
		ec, err := etcd.New(etcd.Config{Dialer: dialer, Credentials: creds})
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, func() { _ = ec.Close() })
		engine.Etcd = ec
	}

	if !change {
		return engine, cleanup, nil
	}
	watchCtx, stop := context.WithCancel(ctx)
	closers = append(closers, stop)
	engine.Changes, err = changes.Watch(watchCtx, cfg, c.Namespace, c.Cluster, wl.Kube)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return engine, cleanup, nil
}
