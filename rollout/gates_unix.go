//go:build unix

package rollout

import (
	"os/exec"
	"syscall"
)

// startsGroup makes cmd lead a process group of its own and its cancellation
// kill that group: sh -c leaves what the command starts (a sleep, a kubectl
// wait) running when only sh is killed.
func startsGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
