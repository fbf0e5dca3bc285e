//go:build !unix

package rollout

import "os/exec"

// startsGroup leaves cmd as it is where there are no process groups to
// kill: its cancellation kills the shell alone.
func startsGroup(*exec.Cmd) {}
