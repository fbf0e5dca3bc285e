package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/cp-rollout/cp-rollout/pkg/version"
)

// VersionOptions prints the build's identity.
type VersionOptions struct {
	Output  string
	Streams genericiooptions.IOStreams
}

// NewCmdVersion returns the version verb.
func NewCmdVersion(streams genericiooptions.IOStreams) *cobra.Command {
	o := &VersionOptions{Output: "text", Streams: streams}
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and build date",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(*cobra.Command, []string) error {
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run()
		},
	}
	cmd.Flags().StringVarP(&o.Output, "output", "o", o.Output, "Output format: text or json")
	return cmd
}

// Validate checks the flags; it reads nothing but the options.
func (o *VersionOptions) Validate() error {
	return oneOf("output", o.Output, "text", "json")
}

// Run prints the version to stdout.
func (o *VersionOptions) Run() error {
	info := version.Get()
	if o.Output == "json" {
		enc := json.NewEncoder(o.Streams.Out)
		enc.SetIndent("", "  ")
		return enc.Encode(info)
	}
	_, err := fmt.Fprintf(o.Streams.Out, "kubectl-cp_rollout %s (commit %s, built %s, %s %s)\n",
		info.Version, info.Commit, info.BuildDate, info.GoVersion, info.Platform)
	return err
}
