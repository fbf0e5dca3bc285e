package member

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// stopGrace is how long Stop lets etcd shut down on SIGTERM (it hands leadership over
// first, bounded by its request timeout) before it kills it.
const stopGrace = 10 * time.Second

// tailLines is how many of etcd's last log lines an error about a failed start quotes.
const tailLines = 20

// process is one run of the etcd binary for a member.
type process struct {
	cmd  *exec.Cmd
	logs *logLines
	// done is closed once the process has exited, for whatever reason, and been reaped.
	done chan struct{}
	// err is what Wait reported; read it only after done is closed.
	err error
}

// startProcess starts etcd with args. The member runs in a process of its own, as the
// static pod does on a node, so that etcd failing — it panics on some requests that
// reach a member just removed from the cluster — takes down that member only, never the
// simulator or test that started it.
func startProcess(bin string, args []string, logger *zap.Logger) (*process, error) {
	p := &process{logs: &logLines{logger: logger}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = childEnv()
	p.cmd.Stderr = p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: a terminal's Ctrl-C reaches the parent only, which stops
		// its members in its own order.
		Setpgid: true,
		// Nothing outlives the parent, even one killed with SIGKILL that ran no cleanup.
		Pdeathsig: syscall.SIGKILL,
	}
	started := make(chan error, 1)
	go func() {
		// The kernel sends Pdeathsig when the thread that forked the child ends, not the
		// process. Keeping this goroutine locked to that thread for the child's whole
		// life stops the Go runtime from retiring the thread (which would kill a healthy
		// member) or lending it to other goroutines. The thread ends with the goroutine.
		runtime.LockOSThread()
		if err := p.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = p.cmd.Wait()
		p.logs.flush()
		p.logs.logger.Info("etcd exited", zap.Error(p.err))
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// exited describes how the process ended, quoting its last log lines; call it only
// after done is closed.
func (p *process) exited() error {
	status := "exited"
	if p.err != nil {
		status = p.err.Error()
	}
	return fmt.Errorf("etcd %s; last output:\n%s", status, p.logs.tail())
}

// stop asks etcd to shut down as the kubelet does, kills it when it takes longer than
// the grace period, and returns once it is gone.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	// After the process has been reaped Signal reports ErrProcessDone instead of
	// reaching a process that reused the pid.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		_ = p.cmd.Process.Kill()
	}
	timer := time.NewTimer(stopGrace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// childEnv is the parent's environment without ETCD_* variables, which etcd would read
// as flags and which belong to whoever runs the simulator, not to its members.
func childEnv() []string {
	return slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "ETCD_") })
}

// logLines receives etcd's stderr: it forwards each line to the member's logger and
// keeps the last few for error messages.
type logLines struct {
	logger *zap.Logger

	mu      sync.Mutex
	partial []byte
	last    []string
}

func (l *logLines) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, b...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.line(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
	}
	return len(b), nil
}

// flush hands on an unterminated last line, such as the end of a crash.
func (l *logLines) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.line(string(l.partial))
		l.partial = nil
	}
}

func (l *logLines) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}

func (l *logLines) line(s string) {
	if s == "" {
		return
	}
	if len(l.last) == tailLines {
		l.last = slices.Delete(l.last, 0, 1)
	}
	l.last = append(l.last, s)
	// Error is the highest level forwarded: a logger that takes none takes nothing.
	if l.logger.Core().Enabled(zapcore.ErrorLevel) {
		forward(l.logger, s)
	}
}

// forward logs one line of etcd's JSON log as the entry it was, with etcd's level and
// fields; anything else (a panic and its stack) is logged as an error line.
func forward(logger *zap.Logger, s string) {
	var entry map[string]any
	if json.Unmarshal([]byte(s), &entry) != nil {
		logger.Error(s)
		return
	}
	msg, _ := entry["msg"].(string)
	level, err := zapcore.ParseLevel(fmt.Sprint(entry["level"]))
	// etcd's panic and fatal entries describe the child's crash; at their own level
	// they would make the parent's logger panic or exit too.
	if err != nil || level > zapcore.ErrorLevel {
		level = zapcore.ErrorLevel
	}
	ce := logger.Check(level, msg)
	if ce == nil {
		return
	}
	delete(entry, "msg")
	delete(entry, "level")
	delete(entry, "ts")
	delete(entry, "caller")
	keys := make([]string, 0, len(entry))
	for k := range entry {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fields := make([]zap.Field, 0, len(keys))
	for _, k := range keys {
		fields = append(fields, zap.Any(k, entry[k]))
	}
	ce.Write(fields...)
}
