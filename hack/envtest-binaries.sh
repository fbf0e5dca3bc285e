#!/usr/bin/env bash
# Builds the kube-apiserver and etcd binaries that envtest (internal/sim and the
# end-to-end tests) runs, from the Go module proxy via the hack/tools module,
# and prints the directory holding them. Nothing is built when both binaries are
# already cached, so `make test` can call this every time.
#
# The cache lives outside the checkout, keyed by Kubernetes version, so fresh
# clones and CI runs on the same machine reuse it (kube-apiserver takes several
# minutes to build on two cores).
set -euo pipefail

KUBE_VERSION=v1.36.3
KUBE_MINOR=36

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$root/hack/tools"
dir="${XDG_CACHE_HOME:-$HOME/.cache}/cp-rollout/envtest/$KUBE_VERSION"
mkdir -p "$dir"

# Build into a temporary name in the same directory and rename, so an
# interrupted or concurrent build never leaves a truncated binary that a test
# would then try to run.
build() { # name package [go build flags...]
	local name=$1 pkg=$2
	shift 2
	[[ -x "$dir/$name" ]] && return 0
	echo "building $name ($pkg) into $dir" >&2
	local tmp
	tmp=$(mktemp "$dir/.$name.XXXXXX")
	if ! go build -C "$tools" "$@" -o "$tmp" "$pkg" >&2; then
		rm -f "$tmp"
		return 1
	fi
	chmod 0755 "$tmp"
	mv -f "$tmp" "$dir/$name"
}

build etcd ./etcd
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
	-ldflags "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$KUBE_MINOR"

echo "$dir"
