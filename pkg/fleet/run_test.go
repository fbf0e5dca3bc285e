package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func clusters(n int) []Cluster {
	out := make([]Cluster, n)
	for i := range out {
		out[i] = Cluster{Namespace: "default", Name: fmt.Sprintf("demo-%d", i+1)}
	}
	return out
}

func TestRunKeepsAtMostParallelInFlight(t *testing.T) {
	var inFlight, most atomic.Int32
	results := Run(context.Background(), clusters(7), Limits{Parallel: 3}, func(context.Context, Cluster) error {
		n := inFlight.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		inFlight.Add(-1)
		return nil
	})
	if got := most.Load(); got != 3 {
		t.Errorf("at most %d clusters were in flight at once, want 3", got)
	}
	for _, r := range results {
		if !r.Started || r.Err != nil || r.Duration <= 0 {
			t.Errorf("%s: started %v, err %v, duration %s: want started, no error, a duration", r.Cluster, r.Started, r.Err, r.Duration)
		}
	}
}

// With --max-failures K, the (K+1)th failure stops new starts, while the
// clusters already in flight finish.
func TestRunStopsStartingOnceTheFailureBudgetIsSpent(t *testing.T) {
	for _, tc := range []struct {
		maxFailures int
		wantStarted int
	}{
		// demo-2 fails while demo-1 is in flight: demo-1 finishes, nothing
		// else starts.
		{maxFailures: 0, wantStarted: 2},
		// One failure is allowed: all start.
		{maxFailures: 1, wantStarted: 5},
	} {
		t.Run(fmt.Sprintf("max-failures %d", tc.maxFailures), func(t *testing.T) {
			results := Run(context.Background(), clusters(5), Limits{Parallel: 2, MaxFailures: tc.maxFailures}, func(_ context.Context, c Cluster) error {
				switch c.Name {
				case "demo-1":
					// Still in flight when demo-2 fails at once; its slot is
					// the next free one.
					time.Sleep(200 * time.Millisecond)
				case "demo-2":
					return errors.New("etcd member stopped")
				}
				return nil
			})
			started := 0
			for _, r := range results {
				if r.Started {
					started++
				}
			}
			if started != tc.wantStarted {
				t.Errorf("%d clusters started, want %d: %+v", started, tc.wantStarted, results)
			}
			if !results[0].Started || results[0].Err != nil {
				t.Errorf("demo-1, in flight when demo-2 failed, did not finish: %+v", results[0])
			}
			if results[1].Err == nil {
				t.Errorf("demo-2's failure was not recorded")
			}
		})
	}
}

func TestRunStartsNothingOnceStopped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var seen []string
	var mu sync.Mutex
	results := Run(ctx, clusters(4), Limits{Parallel: 1}, func(ctx context.Context, c Cluster) error {
		mu.Lock()
		seen = append(seen, c.Name)
		mu.Unlock()
		cancel() // Ctrl-C during the first cluster
		<-ctx.Done()
		return ctx.Err()
	})
	if len(seen) != 1 {
		t.Fatalf("clusters run after the stop: %v", seen)
	}
	if !errors.Is(results[0].Err, context.Canceled) {
		t.Errorf("the cluster in flight ended with %v, want its stop", results[0].Err)
	}
	for _, r := range results[1:] {
		if r.Started {
			t.Errorf("%s started after the stop", r.Cluster)
		}
	}
}
