// Command peakrss runs a command and writes its peak resident memory, in
// kilobytes, to a file:
//
//	peakrss FILE COMMAND [ARG...]
//
// The command's output and exit code are its own.
//
// It exists because a large process cannot measure a small child's peak
// itself: Go starts a child with vfork, sharing the parent's memory until the
// child's exec, and Linux counts the memory a process had when it called exec
// into its peak (ru_maxrss). A child of a benchmark that holds a fleet of
// objects would report the benchmark's memory. Started from this small
// process, the command's peak is its own.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: peakrss FILE COMMAND [ARG...]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[2], os.Args[3:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	if cmd.ProcessState == nil {
		fmt.Fprintln(os.Stderr, "peakrss:", err)
		os.Exit(2)
	}
	// Linux reports ru_maxrss in kilobytes.
	kb := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
	if err := os.WriteFile(os.Args[1], []byte(strconv.FormatInt(kb, 10)+"\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "peakrss:", err)
		os.Exit(2)
	}
	os.Exit(cmd.ProcessState.ExitCode())
}
