package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cp-rollout/cp-rollout/pkg/exitcode"
)

// Staged is a fleet run in rings: the stages go in order, each cluster of a
// stage as Run runs them, and a stage's soak must pass before the next
// stage starts. Every cluster's state is written to the run's record as it
// changes, so that the run can be watched from anywhere and resumed.
type Staged struct {
	Record *Recorder
	Stages int
	Limits Limits
	// Soak is how long a finished stage's clusters must stay healthy before
	// the next stage starts, read again every SoakEvery.
	Soak, SoakEvery time.Duration
	// MachineTime is how long one machine's replacement takes: a cluster
	// with a window starts only when its replicas times this fits in it.
	MachineTime time.Duration
	Now         func() time.Time

	// Do runs one cluster's operation and says what it did to the machines.
	Do func(context.Context, Member) (machines string, err error)
	// Healthy reads a cluster live and says what is wrong with it, if
	// anything: the soak's test.
	Healthy func(context.Context, Cluster) error
	// Watch is told of the stages and of the clusters skipped for their
	// windows; may be nil.
	Watch Watcher
	// StopStarting, once closed, starts no new cluster: the board's key.
	StopStarting <-chan struct{}
}

// Watcher is told how a staged run goes, beside each cluster's own events.
type Watcher interface {
	Stage(n int, state, message string)
	Skipped(namespace, cluster, why string)
}

// The states of a stage.
const (
	StagePending = "pending"
	StageRunning = "running"
	StageSoaking = "soaking"
	StageDone    = "done"
	StageFailed  = "failed"
)

// errUnhealthy marks a soak's finding, so that the run's end names it.
var errUnhealthy = errors.New("unhealthy during the soak")

// Run runs the stages of members (placed by Place, or read from a record
// being resumed) in order. Clusters the record already has done are not run
// again. How each cluster ended is in the record; the error is the soak's
// finding alone, which is the run's rather than a cluster's.
func (s *Staged) Run(ctx context.Context, members []Member) error {
	failed, aborted := 0, ""
	mayStart := func(ctx context.Context) bool {
		select {
		case <-s.StopStarting:
			aborted = "the board's s key"
			return false
		default:
		}
		who, err := s.Record.AbortRequested(ctx)
		if err == nil && who != "" {
			aborted = "fleet abort " + who
		}
		// A record that cannot be read is not an abort: the rollouts
		// themselves read live before each step, and the next start asks
		// again.
		return aborted == ""
	}
	var runErr error
	for n := 1; n <= s.Stages; n++ {
		stage := membersOf(members, n)
		if why := held(ctx, aborted, runErr, failed, s.Limits.MaxFailures); why != "" {
			s.notStarted(ctx, stage, why)
			continue
		}
		soaked := s.recordedStage(n) == StageDone // by an earlier attempt
		s.stage(ctx, n, StageRunning, fmt.Sprintf("%d clusters", len(stage)))
		torun, ran := s.due(ctx, stage)
		limits := Limits{Parallel: s.Limits.Parallel, MaxFailures: s.Limits.MaxFailures - failed}
		results := runGated(ctx, clusterList(torun), limits, mayStart, func(ctx context.Context, c Cluster) error {
			return s.one(ctx, torun[c])
		})
		var stageFailed []string
		for _, r := range results {
			switch {
			case !r.Started:
				s.notStarted(ctx, []Member{torun[r.Cluster]}, held(ctx, aborted, nil, failed, s.Limits.MaxFailures))
			case r.Err != nil:
				failed++
				stageFailed = append(stageFailed, r.Cluster.String())
			default:
				ran = append(ran, torun[r.Cluster])
			}
		}
		switch {
		case ctx.Err() != nil:
			s.stage(ctx, n, StageFailed, "stopped")
			continue
		case aborted != "":
			s.stage(ctx, n, StageFailed, "aborted by "+aborted)
			continue
		case failed > s.Limits.MaxFailures:
			s.stage(ctx, n, StageFailed, fmt.Sprintf("%s failed, beyond --max-failures %d", strings.Join(stageFailed, ", "), s.Limits.MaxFailures))
			continue
		}
		// Failures within the budget hold nothing back; the clusters that
		// are done soak all the same.
		message := ""
		if len(stageFailed) > 0 {
			message = fmt.Sprintf("%s failed, within --max-failures %d", strings.Join(stageFailed, ", "), s.Limits.MaxFailures)
		}
		if n < s.Stages && s.Soak > 0 {
			soak := s.Soak
			if soaked && len(torun) == 0 {
				// An earlier attempt soaked this stage and nothing in it ran
				// since: one live read shows it still healthy.
				soak = 0
			}
			if err := s.soak(ctx, n, ran, soak); err != nil {
				runErr = err
				continue
			}
		}
		s.stage(ctx, n, StageDone, message)
	}
	return s.end(ctx, runErr, aborted)
}

// held says why no more clusters start, if none do: the run was stopped or
// aborted, a soak found a cluster unhealthy, or the failures went beyond
// the budget.
func held(ctx context.Context, aborted string, soakErr error, failed, maxFailures int) string {
	switch {
	case ctx.Err() != nil:
		return "stopped"
	case aborted != "":
		return "aborted by " + aborted
	case soakErr != nil:
		return "a cluster of an earlier stage was unhealthy during its soak"
	case failed > maxFailures:
		return fmt.Sprintf("--max-failures %d", maxFailures)
	}
	return ""
}

// one runs a cluster and records how it ended.
func (s *Staged) one(ctx context.Context, m Member) error {
	began := s.Now()
	s.write(ctx, m.Cluster, func(c *ClusterRecord) {
		c.State, c.Attempts, c.Started, c.Ended, c.ExitCode, c.Message = Running, c.Attempts+1, &began, nil, nil, ""
	})
	machines, err := s.Do(ctx, m)
	ended := s.Now()
	code := exitcode.Of(err)
	s.write(ctx, m.Cluster, func(c *ClusterRecord) {
		c.Ended, c.ExitCode, c.Machines, c.State = &ended, &code, machines, Done
		switch {
		case err != nil && ctx.Err() != nil:
			c.State, c.Message = Stopped, err.Error()
		case err != nil:
			c.State, c.Message = Failed, err.Error()
		}
	})
	return err
}

// due splits a stage into the clusters to run now and those the record has
// done already; the others wait for their windows, recorded and told.
func (s *Staged) due(ctx context.Context, stage []Member) (torun map[Cluster]Member, done []Member) {
	torun = map[Cluster]Member{}
	now := s.Now()
	for _, m := range stage {
		if s.Record.Cluster(m.Cluster).State == Done {
			done = append(done, m)
			continue
		}
		replicas := max(m.Replicas, 1)
		d := m.Window.Decide(now, time.Duration(replicas)*s.MachineTime)
		if d.Now {
			torun[m.Cluster] = m
			continue
		}
		why := OutsideWindow + ": " + d.Why
		if !d.Next.Start.IsZero() {
			why += "; " + d.When(now)
		}
		s.write(ctx, m.Cluster, func(c *ClusterRecord) { c.State, c.Message = OutsideWindow, why })
		if s.Watch != nil {
			s.Watch.Skipped(m.Namespace, m.Name, why)
		}
	}
	return torun, done
}

// soak waits soak after stage n, reading each of its clusters live every
// SoakEvery and once more at the end. The first that is unhealthy ends the
// soak, naming it.
func (s *Staged) soak(ctx context.Context, n int, clusters []Member, soak time.Duration) error {
	s.stage(ctx, n, StageSoaking, "until "+s.Now().Add(soak).Format("15:04:05"))
	until := s.Now().Add(soak) // from after the write, so that the soak reads its clusters throughout
	for {
		for _, m := range clusters {
			if err := s.Healthy(ctx, m.Cluster); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				err = exitcode.New(exitcode.Unsafe, fmt.Errorf("%w: stage %d's cluster %s: %w; no cluster of a later stage was started: "+
					"mend it, then continue with --resume %s", errUnhealthy, n, m.Cluster, err, s.Record.run.Name))
				s.stage(ctx, n, StageFailed, err.Error())
				return err
			}
		}
		left := until.Sub(s.Now())
		if left <= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			s.stage(ctx, n, StageFailed, "stopped during the soak")
			return ctx.Err()
		case <-time.After(min(left, s.SoakEvery)):
		}
	}
}

// notStarted records clusters the run did not start; those waiting for
// their windows stay so.
func (s *Staged) notStarted(ctx context.Context, members []Member, why string) {
	var clusters []Cluster
	for _, m := range members {
		if st := s.Record.Cluster(m.Cluster).State; st != Done && st != OutsideWindow {
			clusters = append(clusters, m.Cluster)
		}
	}
	_ = s.Record.UpdateClusters(context.WithoutCancel(ctx), clusters, func(c *ClusterRecord) { c.State, c.Message = NotStarted, why })
}

// end records the run's state and returns its error.
func (s *Staged) end(ctx context.Context, soakErr error, aborted string) error {
	count := s.Record.Run().Count()
	state, msg := RunDone, ""
	var err error
	switch {
	case soakErr != nil && ctx.Err() == nil:
		state, msg, err = RunFailed, soakErr.Error(), soakErr
	case ctx.Err() != nil:
		state, msg = RunStopped, "stopped"
	case count[Failed] > 0:
		state, msg = RunFailed, fmt.Sprintf("%d clusters failed", count[Failed])
	case aborted != "":
		state, msg = RunAborted, "aborted by "+aborted
	case count[OutsideWindow] > 0:
		msg = fmt.Sprintf("%d clusters wait for their windows: continue with --resume %s when they open", count[OutsideWindow], s.Record.run.Name)
	}
	// The record's last word is written even when ctx ended: a stopped run
	// says so to whoever reads it next.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = s.Record.UpdateRun(wctx, func(r *RunRecord) { r.State, r.Message, r.Holder = state, msg, "" })
	return err
}

// recordedStage is stage n's state as the record has it.
func (s *Staged) recordedStage(n int) string {
	if stages := s.Record.Run().Stages; n-1 < len(stages) {
		return stages[n-1].State
	}
	return ""
}

func (s *Staged) stage(ctx context.Context, n int, state, message string) {
	_ = s.Record.UpdateRun(context.WithoutCancel(ctx), func(r *RunRecord) {
		if n-1 < len(r.Stages) {
			r.Stages[n-1].State, r.Stages[n-1].Message = state, message
		}
	})
	if s.Watch != nil {
		s.Watch.Stage(n, state, message)
	}
}

// write records a cluster's change. A record that cannot be written does not
// stop the cluster's rollout: the rollout's own record on its
// KubeadmControlPlane is what a re-run resumes from.
func (s *Staged) write(ctx context.Context, c Cluster, change func(*ClusterRecord)) {
	_ = s.Record.UpdateCluster(context.WithoutCancel(ctx), c, change)
}

func membersOf(members []Member, stage int) []Member {
	var out []Member
	for _, m := range members {
		if m.Stage == stage {
			out = append(out, m)
		}
	}
	return out
}

// clusterList is the clusters of torun in name order, Run's order.
func clusterList(torun map[Cluster]Member) []Cluster {
	var out []Cluster
	for c := range torun {
		out = append(out, c)
	}
	sortClusters(out)
	return out
}

func sortClusters(cs []Cluster) {
	slices.SortFunc(cs, func(a, b Cluster) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
}
