package sim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Nothing the simulator starts may outlive it, even when it is killed without
// running Stop (a test binary hitting -timeout, a SIGKILL): a leaked pair of
// kube-apiserver and etcd holds half a gigabyte and its ports. envtest starts
// its processes without a parent-death signal, so they start through
// setpriv(1), which sets one (SIGKILL) and then execs the real binary.
//
// The kernel sends that signal when the *thread* that forked the process ends,
// not the process; the clusters are therefore started from goroutines locked
// to their thread for the simulator's whole life (see startClusters).

// lifetimeBinaries writes wrappers for kube-apiserver and etcd into dir and
// returns their paths, or the plain binaries when setpriv is not installed.
func lifetimeBinaries(assets, dir string) (apiServer, etcd string, err error) {
	apiServer = filepath.Join(assets, "kube-apiserver")
	etcd = filepath.Join(assets, "etcd")
	setpriv, lookErr := exec.LookPath("setpriv")
	if lookErr != nil {
		return apiServer, etcd, nil
	}
	wrap := func(bin string) (string, error) {
		path := filepath.Join(dir, filepath.Base(bin))
		script := fmt.Sprintf("#!/bin/sh\nexec %q --pdeathsig KILL -- %q \"$@\"\n", setpriv, bin)
		return path, os.WriteFile(path, []byte(script), 0o755)
	}
	if apiServer, err = wrap(apiServer); err != nil {
		return "", "", err
	}
	if etcd, err = wrap(etcd); err != nil {
		return "", "", err
	}
	return apiServer, etcd, nil
}

// onOwnThread runs start on a goroutine locked to its OS thread and keeps that
// thread alive until release is closed, so processes start forks there keep
// their parent-death signal armed until then.
func onOwnThread(release <-chan struct{}, start func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		start()
		close(done)
		<-release
		// Returning while locked ends the thread, which is what we want once
		// the processes it started are gone.
	}()
	<-done
}
