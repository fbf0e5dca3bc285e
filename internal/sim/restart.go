package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RestartManagementAPIServer stops the management kube-apiserver and starts it
// again with the same flags, certificates and etcd, as an operator's control
// plane upgrade or a crash would: clients see connection errors for a few
// seconds, then the same API with the same data. It returns once the API
// server accepts connections again.
//
// envtest's own Stop/Start would mint a new CA and admin credentials, which
// no client holding the old kubeconfig survives, so the process is restarted
// here from its command line.
func (s *Sim) RestartManagementAPIServer(ctx context.Context) error {
	if s.mgmtEnv == nil {
		return errors.New("the management cluster is shared: only a simulator with one of its own may restart its API server")
	}
	s.restartMu.Lock()
	defer s.restartMu.Unlock()
	port := s.mgmtEnv.ControlPlane.APIServer.SecureServing.Port
	addr := net.JoinHostPort(s.mgmtEnv.ControlPlane.APIServer.SecureServing.Address, port)

	var path string
	var args []string
	var stop func() error
	if s.restarted != nil {
		path, args = s.restarted.Path, s.restarted.Args[1:]
		cmd := s.restarted
		stop = func() error { return stopCmd(cmd) }
	} else {
		pid, cmdline, err := findChild("kube-apiserver", "--secure-port="+port)
		if err != nil {
			return err
		}
		path, args = cmdline[0], cmdline[1:]
		stop = func() error {
			if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
				return err
			}
			// envtest's goroutine reaps it; wait for the port to close.
			return waitPort(ctx, addr, false)
		}
	}
	if err := stop(); err != nil {
		return fmt.Errorf("stopping the management API server: %w", err)
	}
	cmd := exec.Command(path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var startErr error
	onOwnThread(s.threadsRelease, func() { startErr = cmd.Start() })
	if startErr != nil {
		return fmt.Errorf("starting the management API server again: %w", startErr)
	}
	s.restarted = cmd
	return waitPort(ctx, addr, true)
}

// stopRestarted stops an API server RestartManagementAPIServer started.
func (s *Sim) stopRestarted() error {
	s.restartMu.Lock()
	defer s.restartMu.Unlock()
	if s.restarted == nil {
		return nil
	}
	err := stopCmd(s.restarted)
	s.restarted = nil
	return err
}

func stopCmd(cmd *exec.Cmd) error {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
		return nil
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return errors.New("API server did not stop within 20s; killed")
	}
}

// findChild finds this process's child running the named binary with an
// argument, returning its pid and command line.
func findChild(binary, arg string) (int, []string, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, nil, err
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state, ppid, ...
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		fields := strings.Fields(string(rest))
		if len(fields) < 2 || fields[1] != strconv.Itoa(self) {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		cmdline := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if filepath.Base(cmdline[0]) != binary {
			continue
		}
		for _, a := range cmdline[1:] {
			if a == arg {
				return pid, cmdline, nil
			}
		}
	}
	return 0, nil, fmt.Errorf("no %s child process with %s", binary, arg)
}

// waitPort waits until addr accepts connections (open) or refuses them.
func waitPort(ctx context.Context, addr string, open bool) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		if (err == nil) == open {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: still %s after 60s", addr, map[bool]string{true: "closed", false: "open"}[open])
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
