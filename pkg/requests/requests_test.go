package requests

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/transport"
	"k8s.io/klog/v2"
)

// TestWrapCountsEachRequest: every request through the wrapped transport is
// counted once, whatever its answer.
func TestWrapCountsEachRequest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	var c Counter
	client := &http.Client{Transport: c.Wrap(http.DefaultTransport)}
	for _, path := range []string{"/", "/missing", "/"} {
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	if got := c.Load(); got != 3 {
		t.Errorf("counted %d requests, want 3", got)
	}
}

// TestClientGoCancelsThroughTheCounter: client-go cancels a request (a
// timeout, a closed watch) by walking its chain of round trippers; a link it
// cannot see through makes it log a warning on the user's terminal.
func TestClientGoCancelsThroughTheCounter(t *testing.T) {
	var c Counter
	rt, err := transport.HTTPWrappersForConfig(&transport.Config{UserAgent: "cp-rollout-test"}, c.Wrap(http.DefaultTransport))
	if err != nil {
		t.Fatal(err)
	}
	canceler, ok := rt.(interface{ CancelRequest(*http.Request) })
	if !ok {
		t.Fatalf("client-go's chain %T no longer cancels requests this way; this test needs another look", rt)
	}
	var logged []string
	log := funcr.New(func(prefix, args string) { logged = append(logged, args) }, funcr.Options{Verbosity: 10})
	req := httptest.NewRequest(http.MethodGet, "https://example.invalid/", nil).WithContext(klog.NewContext(context.Background(), log))
	canceler.CancelRequest(req)
	if len(logged) > 0 {
		t.Errorf("client-go logged on cancelling through the counter: %v", logged)
	}
}
