package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// TestBodyLevelIsClientGos: bodyLevel is where client-go starts logging
// bodies, and from there on every level logs them, so a Secret the tool
// reads is in the log: at 8 its beginning, at 9 more, from 10 all of it.
// Checked against client-go itself, reading a Secret at each level.
func TestBodyLevelIsClientGos(t *testing.T) {
	const begins, ends = "BEGINSWITHKEY", "ENDSWITHKEY" // base64, 4n long with the As
	secret := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"demo-etcd","namespace":"default"},"data":{"tls.key":"` +
		begins + strings.Repeat("A", 20000) + ends + `"}}`
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(secret))
	}))
	t.Cleanup(api.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	for level := bodyLevel - 2; level <= 12; level++ {
		var log bytes.Buffer
		logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(level), textlogger.Output(&log)))
		ctx := klog.NewContext(context.Background(), logger)
		if _, err := client.CoreV1().Secrets("default").Get(ctx, "demo-etcd", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		logged, whole := strings.Contains(log.String(), begins), strings.Contains(log.String(), ends)
		if logged != (level >= bodyLevel) {
			t.Errorf("-v %d: client-go logged the Secret's body: %v; bodyLevel is %d", level, logged, bodyLevel)
		}
		if whole != (level >= 10) {
			t.Errorf("-v %d: client-go logged the Secret's whole body: %v, want it from 10 on", level, whole)
		}
		if warned := bodyWarning(level) != ""; warned != logged {
			t.Errorf("-v %d: warning %v, but bodies logged %v", level, warned, logged)
		}
	}
}

// TestVerbosityWarnsOfSecrets: the help says that every level from
// bodyLevel on logs bodies with Secrets in them, and a run at such a level
// says so on stderr before it starts; below it, nothing is said.
func TestVerbosityWarnsOfSecrets(t *testing.T) {
	t.Cleanup(func() { setKlogVerbosity(t, 0) })
	isolate(t)
	help := NewRootCmd(genericiooptions.IOStreams{}).PersistentFlags().Lookup("v").Usage
	for _, want := range []string{"8 and above also log bodies", "all from 10", "Secrets", "etcd CA key"} {
		if !strings.Contains(help, want) {
			t.Errorf("-v help %q lacks %q", help, want)
		}
	}
	for _, level := range []int{0, 6, 7, 8, 9, 10, 11} {
		r := run(t, "version", "-v", strconv.Itoa(level))
		if r.err != nil {
			t.Fatalf("-v %d: %v", level, r.err)
		}
		warned := strings.Contains(r.log, "warning: -v "+strconv.Itoa(level)+" logs the body of each request and response")
		if warned != (level >= bodyLevel) {
			t.Errorf("-v %d: warned %v, want %v (stderr %q)", level, warned, level >= bodyLevel, r.log)
		}
		if warned && (!strings.Contains(r.log, "Secrets") || strings.Count(r.log, "\n") != 1) {
			t.Errorf("-v %d: the warning is not one line naming the Secrets: %q", level, r.log)
		}
	}
}
