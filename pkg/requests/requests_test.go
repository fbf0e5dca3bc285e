package requests

import (
	"net/http"
	"net/http/httptest"
	"testing"
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
