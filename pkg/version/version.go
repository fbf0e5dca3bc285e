// Package version holds the build's identity, injected at link time by the
// Makefile and goreleaser (-X github.com/cp-rollout/cp-rollout/pkg/version.version=…).
package version

import (
	"fmt"
	"runtime"
)

// Set by -ldflags -X; the defaults mark a build made without them.
var (
	version = "dev"
	commit  = "unknown"
	date    = "unknown"
)

// Info is the build's identity; its JSON shape is printed by `version -o json`.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	BuildDate string `json:"buildDate"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the identity of the running binary.
func Get() Info {
	return Info{
		Version:   version,
		Commit:    commit,
		BuildDate: date,
		GoVersion: runtime.Version(),
		Platform:  fmt.Sprintf("%s/%s", runtime.GOOS, runtime.GOARCH),
	}
}
