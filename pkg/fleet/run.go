package fleet

import (
	"context"
	"sync"
	"time"
)

// Limits bound a fleet run: at most Parallel clusters in flight, and no new
// cluster started once more than MaxFailures have failed.
type Limits struct {
	Parallel    int
	MaxFailures int
}

// Result is how one cluster's operation ended.
type Result struct {
	Cluster
	// Started is false for a cluster the run never began: the failure budget
	// was spent, or the run was stopped, before its turn.
	Started  bool
	Err      error
	Began    time.Time
	Duration time.Duration
}

// Run runs do for each cluster, in order, at most limits.Parallel at once.
// Once more than limits.MaxFailures have failed, no new cluster starts;
// those in flight finish. When ctx ends, none starts and those in flight see
// their ctx end (each stops as a one-cluster run does: resumable). Run
// returns one Result per cluster, in the clusters' order, once every started
// one has finished.
func Run(ctx context.Context, clusters []Cluster, limits Limits, do func(context.Context, Cluster) error) []Result {
	return runGated(ctx, clusters, limits, nil, do)
}

// runGated is Run, asking mayStart (when not nil) before each cluster
// starts: a false starts no more.
func runGated(ctx context.Context, clusters []Cluster, limits Limits, mayStart func(context.Context) bool, do func(context.Context, Cluster) error) []Result {
	results := make([]Result, len(clusters))
	slots := make(chan struct{}, max(limits.Parallel, 1))
	var (
		mu     sync.Mutex
		failed int
		wg     sync.WaitGroup
	)
	budgetSpent := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return failed > limits.MaxFailures
	}
	for i, c := range clusters {
		results[i].Cluster = c
	}
	for i, c := range clusters {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		// A slot and the end of ctx may both be ready; the end wins.
		if ctx.Err() != nil || budgetSpent() || (mayStart != nil && !mayStart(ctx)) {
			break
		}
		results[i].Started, results[i].Began = true, time.Now()
		wg.Go(func() {
			defer func() { <-slots }()
			err := do(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			results[i].Err, results[i].Duration = err, time.Since(results[i].Began)
			if err != nil {
				failed++
			}
		})
	}
	wg.Wait()
	return results
}
