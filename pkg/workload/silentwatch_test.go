package workload

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"k8s.io/client-go/rest"
)

// silentWatches puts a proxy in front of cfg's API server and returns a
// configuration that goes through it. The proxy passes every request on but
// a watch's: that one the API server accepts (its status and headers are
// passed back), and then the proxy holds the stream open and sends nothing
// of it until the client hangs up, as a proxy that drops watch events does,
// or an API server that does not serve watches of what is asked. Lists and
// writes are answered as the API server answers them.
func silentWatches(t *testing.T, cfg *rest.Config) *rest.Config {
	t.Helper()
	upstream, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(upstream)
	proxy.Transport = rt
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query().Get("watch"); q != "true" && q != "1" {
			proxy.ServeHTTP(w, r)
			return
		}
		out := r.Clone(r.Context())
		out.URL.Scheme, out.URL.Host, out.Host, out.RequestURI = upstream.Scheme, upstream.Host, "", ""
		resp, err := rt.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(func() {
		// A watch still open would hold Close until its client hangs up.
		srv.CloseClientConnections()
		srv.Close()
	})
	silent := rest.AnonymousClientConfig(cfg)
	silent.Host = srv.URL
	silent.TLSClientConfig = rest.TLSClientConfig{}
	return silent
}
