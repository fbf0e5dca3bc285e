#!/usr/bin/env bash
# release-check: prove that a release installs the way users install it.
#
#   1. goreleaser check, then a snapshot release for this machine's platform
#      (the .goreleaser.yaml a tagged release uses, built for one target),
#      with a CycloneDX SBOM of the binary listed in checksums.txt;
#   2. the krew manifest goreleaser generated from it passes krew's own
#      validator and names this platform's archive with its sha256;
#   3. the real krew installs it from the local archive into a throw-away
#      KREW_ROOT, extracting the LICENSE as krew-index requires;
#   4. `kubectl cp-rollout version`, run through krew's link, prints the
#      snapshot's version.
#
# Offline apart from the Go module proxy: `krew install --manifest` never
# reads krew's plugin index, KREW_NO_UPGRADE_CHECK stops its GitHub release
# check, and --archive replaces the download of the manifest's uri.
#
# Quiet on success (one line); on failure, the failing step and its output.
#
# Usage: hack/release-check.sh GORELEASER KREW_DIR
#   KREW_DIR holds kubectl-krew and validate-krew-manifest.
set -euo pipefail

goreleaser=$1
krew_dir=$2
cd "$(dirname "$0")/.."

work=$(mktemp -d "${TMPDIR:-/tmp}/cp-rollout-release-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
log=$work/log

# run STEP CMD...: run CMD with its output in the log; on failure say which
# step failed and show what it printed.
run() {
	local step=$1
	shift
	if ! "$@" >"$log" 2>&1; then
		echo "release-check: $step failed: $*" >&2
		sed 's/^/    /' "$log" >&2
		exit 1
	fi
}
fail() {
	echo "release-check: $*" >&2
	exit 1
}

run "goreleaser check" "$goreleaser" check

# Only this machine's platform: cross-building all six takes several times as
# long. `goreleaser release` has no --single-target (only `build` has), so the
# snapshot is made from a copy of .goreleaser.yaml whose build lists just this
# GOOS and GOARCH; everything else (archives, checksums, krew manifest) is the
# configuration a tagged release uses.
os=$(go env GOOS)
arch=$(go env GOARCH)
config=$work/goreleaser.yaml
sed -e "s/^    goos: \[.*\]\$/    goos: [$os]/" -e "s/^    goarch: \[.*\]\$/    goarch: [$arch]/" .goreleaser.yaml >"$config"
[ "$(grep -cxE "    goos: \[$os\]|    goarch: \[$arch\]" "$config")" = 2 ] ||
	fail "could not restrict .goreleaser.yaml's build to $os/$arch: expected one 'goos: [...]' and one 'goarch: [...]' line under builds"
run "snapshot release" "$goreleaser" release --snapshot --clean --config "$config"

ext=tar.gz
[ "$os" = windows ] && ext=zip
archive=dist/kubectl-cp_rollout_${os}_${arch}.${ext}
manifest=dist/krew/cp-rollout.yaml
[ -f "$archive" ] || fail "snapshot release made no $archive (dist/ holds: $(ls dist | tr '\n' ' '))"
[ -f "$manifest" ] || fail "snapshot release made no krew manifest $manifest (is the krews: section of .goreleaser.yaml intact?)"

# The binary's SBOM names the module and the Cluster API it was built with,
# and checksums.txt covers it.
sbom=dist/kubectl-cp_rollout_${os}_${arch}.cdx.json
[ -f "$sbom" ] || fail "snapshot release made no SBOM $sbom (dist/ holds: $(ls dist | tr '\n' ' '))"
grep -q '"bomFormat": *"CycloneDX"' "$sbom" || fail "$sbom is not a CycloneDX document"
grep -q 'pkg:golang/sigs.k8s.io/cluster-api@v' "$sbom" || fail "$sbom does not list sigs.k8s.io/cluster-api"
grep -q " $(basename "$sbom")\$" dist/checksums.txt || fail "dist/checksums.txt has no line for $(basename "$sbom")"

# krew's validator: structure, plugin name = file name, semantic version,
# platform selectors that match supported platforms and do not overlap.
# -skip-install because its install step would download the manifest's uri,
# which exists only once the release is published; the real install follows.
run "validate-krew-manifest" "$krew_dir/validate-krew-manifest" -manifest "$manifest" -skip-install

# The manifest must carry this archive's checksum, as checksums.txt has it.
sum=$(awk -v f="$(basename "$archive")" '$2 == f { print $1 }' dist/checksums.txt)
[ -n "$sum" ] || fail "dist/checksums.txt has no line for $(basename "$archive")"
grep -q "sha256: $sum" "$manifest" || fail "$manifest does not carry $(basename "$archive")'s sha256 $sum"
version=$(sed -n 's/^  version: *//p' "$manifest" | tr -d '"')
[ -n "$version" ] || fail "$manifest has no spec.version"

# Install with the real krew into a throw-away KREW_ROOT. kubectl finds krew
# as kubectl-krew on PATH, and the plugin as krew's link in $KREW_ROOT/bin,
# which comes first so no other kubectl-cp_rollout on PATH can answer.
export KREW_ROOT=$work/krew KREW_NO_UPGRADE_CHECK=1
export PATH=$KREW_ROOT/bin:$krew_dir:$PATH
run "krew install" kubectl krew install --manifest="$manifest" --archive="$archive"

link=$(command -v kubectl-cp_rollout || true)
[ "$link" = "$KREW_ROOT/bin/kubectl-cp_rollout" ] || fail "after krew install, kubectl-cp_rollout resolves to '${link}', not krew's link in $KREW_ROOT/bin"
installed=$KREW_ROOT/store/cp-rollout/$version
[ -f "$installed/LICENSE" ] || fail "krew did not extract a LICENSE into $installed (krew-index requires one): $(ls "$installed" | tr '\n' ' ')"

run "kubectl cp-rollout version" kubectl cp-rollout version
out=$(cat "$log")
case "$out" in
"kubectl-cp_rollout ${version#v} "*) ;;
*) fail "kubectl cp-rollout version through krew printed '$out', expected version ${version#v}" ;;
esac

echo "release-check: $version ($os/$arch) built, manifest valid, installed by krew, 'kubectl cp-rollout version' OK"
