package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/version"
	"github.com/cp-rollout/cp-rollout/rollout"
)

// VersionOptions prints the build's identity.
type VersionOptions struct {
	output  printFlags
	Streams genericiooptions.IOStreams
}

// NewVersionOptions returns the version verb's defaults.
func NewVersionOptions(streams genericiooptions.IOStreams) *VersionOptions {
	return &VersionOptions{output: printFlags{Output: "text", values: versionOutputs}, Streams: streams}
}

// versionOutputs are the values of version's -o: it prints one object.
var versionOutputs = objectOutputs

// NewCmdVersion returns the version verb. runF, when set, replaces Run, so
// tests can see what the flags resolve to.
func NewCmdVersion(streams genericiooptions.IOStreams, runF func(*VersionOptions) error) *cobra.Command {
	o := NewVersionOptions(streams)
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and build date",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerb(cmd, args, o, runF)
		},
	}
	addOutputFlag(cmd, &o.output.Output, versionOutputs, "Output format: text (two lines: the build, then the KCP controller versions it is proven with), json (one object, {version, commit, buildDate, goVersion, platform, provenKCP}), yaml (that object), or jsonpath=TEMPLATE or go-template=TEMPLATE (read that object)")
	return cmd
}

// Complete has nothing to take in: version has no arguments.
func (o *VersionOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the flags; it reads nothing but the options.
func (o *VersionOptions) Validate() error {
	return o.output.complete()
}

// versionInfo is the build's identity and the KCP controllers it is proven
// with: which Cluster API releases a build may be used with is part of what
// it is.
type versionInfo struct {
	version.Info
	// ProvenKCP is a string, as every other field, so that the JSON stays
	// a flat object of strings for whoever reads it as one.
	ProvenKCP string `json:"provenKCP"`
}

// Run prints the version to stdout.
func (o *VersionOptions) Run(context.Context) error {
	info := versionInfo{Info: version.Get(), ProvenKCP: rollout.ProvenKCPRange()}
	return o.output.print(o.Streams.Out, info, false, func(tableOptions) error {
		// The proven range has a line of its own: scripts match the first
		// line's "kubectl-cp_rollout VERSION " (hack/release-check.sh).
		_, err := fmt.Fprintf(o.Streams.Out, "kubectl-cp_rollout %s (commit %s, built %s, %s %s)\nproven with Cluster API (KubeadmControlPlane controller) %s\n",
			info.Version, info.Commit, info.BuildDate, info.GoVersion, info.Platform, info.ProvenKCP)
		return err
	})
}

func (v versionInfo) docs() []doc   { return []doc{{"version", v}} }
func (v versionInfo) rowSet() []row { return nil } // no -o name or custom-columns
