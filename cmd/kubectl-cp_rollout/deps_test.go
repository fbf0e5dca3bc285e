package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryLinksNoWebhookValidation: the release binary links none of the
// packages Cluster API's core webhooks bring (CEL, the API server's schema
// validation, OpenTelemetry's exporters), which once grew it by 9 MB through
// one import for a three-line default. A new import that brings them back
// fails here, with the package that pulled them in to be found by `go mod why`.
func TestBinaryLinksNoWebhookValidation(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "grpcnotrace", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, heavy := range []string{"sigs.k8s.io/cluster-api/core/webhooks/", "github.com/google/cel-go/", "go.opentelemetry.io/otel/sdk"} {
			if strings.HasPrefix(dep, heavy) {
				t.Errorf("the binary links %s", dep)
			}
		}
	}
}
