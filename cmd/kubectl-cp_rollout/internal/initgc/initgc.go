// Package initgc turns the garbage collector off while the binary's packages
// initialise, and package main's init turns it back on.
//
// The Kubernetes, Cluster API and etcd packages the tool links allocate about
// 10 MB in their init functions (schemes, inflection tables, protobuf
// descriptors), nearly all of it kept: collecting in between frees little
// and costs start-up time, which is most of what `kubectl cp-rollout version`
// or a shell completion takes.
//
// Go initialises, among the packages whose imports are done, the one with the
// lexically lowest import path first. This package's own path sorts early, but
// it waits for runtime/debug, which sorts after every github.com, go.*,
// golang.org and k8s.io package that is ready before it, so it runs about
// 16 ms into a 37 ms initialisation (GODEBUG=inittrace=1), after two of the
// four collections that used to run. Saving the other two took `version`
// from 41.3 to 38.7 ms (median of six alternating sets of ten runs' medians),
// and its peak memory from 45 to 42 MB.
package initgc

import "runtime/debug"

// percent is the collector's setting before this package turned it off:
// GOGC's, 100 when it is unset.
var percent = debug.SetGCPercent(-1)

// Restore gives the collector its setting back. Package main's init calls
// it: Go runs it after every imported package's.
func Restore() { debug.SetGCPercent(percent) }
