package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/cp-rollout/cp-rollout/internal/sim"
	"github.com/cp-rollout/cp-rollout/internal/sim/simtest"
	"github.com/cp-rollout/cp-rollout/pkg/runlock"
)

// inContainer runs cmd as it would run in a container of its own: PID 1 in
// a new PID namespace, on a host named host in a new UTS namespace. Two such
// commands share user, host name and PID, as CI runners and cloned VMs do.
func inContainer(t *testing.T, cmd *exec.Cmd, host string) *exec.Cmd {
	t.Helper()
	if err := exec.Command("unshare", "--pid", "--uts", "--fork", "true").Run(); err != nil {
		t.Skipf("cannot make PID and UTS namespaces here (needs root and util-linux's unshare): %v", err)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatal(err)
	}
	// sh is PID 1 and execs kubectl, which execs the plugin: the plugin is PID 1.
	cmd.Args = append([]string{"unshare", "--pid", "--uts", "--fork", "--kill-child",
		"sh", "-c", `hostname "$0" && exec "$@"`, host}, cmd.Args...)
	cmd.Path = unshare
	return cmd
}

// Two runs with one user, host name and PID: the second is refused, exit 5,
// naming the first, which finishes undisturbed.
func TestSecondRunLockedSameHostAndPID(t *testing.T) {
	t.Parallel()
	e := simtest.Start(t, sim.Options{Replicas: 3, Version: from, ProvisionDelay: 3 * time.Second, DeleteDelay: time.Second})
	mon := watchInvariants(t, e, 4, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{"upgrade", "demo", "--version", to, "-o", "json"}
	first := simtest.StartCommand(t, inContainer(t, e.Command(t, context.Background(), args...), "ci-runner"), args)
	first.Until(t, isAction("create", "done"))

	lease := &coordinationv1.Lease{}
	if err := e.Sim.ManagementClient().Get(ctx, client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: runlock.LeaseName("demo")}, lease); err != nil {
		t.Fatal(err)
	}
	holder := ptr.Deref(lease.Spec.HolderIdentity, "")
	if !strings.Contains(holder, "@ci-runner/pid-1-") {
		t.Fatalf("the first run holds the lock as %q: want it on host ci-runner as PID 1", holder)
	}
	second := simtest.Run(t, inContainer(t, e.Command(t, ctx, "upgrade", "demo", "--version", to), "ci-runner"), []string{"upgrade", "demo"})
	if second.Code != 5 || !strings.Contains(second.Stderr, holder) {
		t.Errorf("second run on the same host as the same PID: exit %d, stderr %q; want exit 5 naming %s", second.Code, second.Stderr, holder)
	}
	if strings.Contains(second.Stderr, "remove-orphan") {
		t.Errorf("the second run removed the first's pieces as orphans:\n%s", second.Stderr)
	}
	if code := first.Wait(); code != 0 {
		t.Fatalf("first run: exit %d", code)
	}
	mon.check(t)
	assertConverged(t, e, 3, to)
}

// A holder whose clock is 20 s behind this one still renews its Lease every
// 5 s: its renew time always looks expired here, yet it is alive. upgrade and
// handback both refuse (exit 5) and change nothing; once the holder stops
// renewing, handback waits out the Lease's duration and breaks it.
func TestSecondRunLockedSkewedClock(t *testing.T) {
	t.Parallel()
	e := fastSim(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const holder = "ops@bastion/pid-4242-skew0"
	c := e.Sim.ManagementClient()
	key := client.ObjectKey{Namespace: e.Sim.ClusterKey().Namespace, Name: runlock.LeaseName("demo")}
	behind := func() *metav1.MicroTime { t := metav1.NewMicroTime(time.Now().Add(-20 * time.Second)); return &t }
	if err := c.Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: behind(),
			LeaseDurationSeconds: ptr.To(int32(runlock.LeaseDuration / time.Second))},
	}); err != nil {
		t.Fatal(err)
	}
	renewCtx, stopRenewing := context.WithCancel(ctx)
	renewing := make(chan struct{})
	go func() {
		defer close(renewing)
		for renewCtx.Err() == nil {
			select {
			case <-renewCtx.Done():
				return
			case <-time.After(5 * time.Second):
			}
			_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				l := &coordinationv1.Lease{}
				if err := c.Get(renewCtx, key, l); err != nil {
					return err
				}
				l.Spec.RenewTime = behind()
				return c.Update(renewCtx, l)
			})
		}
	}()
	defer func() { stopRenewing(); <-renewing }()

	before := quietVersions(t, e)
	for _, args := range [][]string{{"upgrade", "demo", "--version", to}, {"handback", "demo"}} {
		r := e.Plugin(t, ctx, args...)
		if r.Code != 5 || !strings.Contains(r.Stderr, holder) {
			t.Errorf("%s while %s renews: exit %d, stderr %q; want exit 5 naming it", args[0], holder, r.Code, r.Stderr)
		}
	}
	assertUnchanged(t, before, versions(t, e))
	lease := &coordinationv1.Lease{}
	if err := c.Get(ctx, key, lease); err != nil || ptr.Deref(lease.Spec.HolderIdentity, "") != holder {
		t.Fatalf("the live holder's Lease is gone or changed: %v %v", err, lease.Spec.HolderIdentity)
	}

	stopRenewing()
	<-renewing
	r := e.Plugin(t, ctx, "handback", "demo")
	if r.Code != 0 || !strings.Contains(r.Stdout, "released the lock held by "+holder) {
		t.Fatalf("handback once the holder stopped: exit %d, stdout %q", r.Code, r.Stdout)
	}
	if r.Took < runlock.LeaseDuration {
		t.Errorf("handback broke the lock %s after it started, before it could have watched it for %s", r.Took.Round(time.Second), runlock.LeaseDuration)
	}
	if err := c.Get(ctx, key, lease); err == nil {
		t.Errorf("the Lease is still there after handback: %s", runlock.Holder(lease))
	}
}
