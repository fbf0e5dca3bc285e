#!/usr/bin/env bash
# make bench: put the latest results table (bench/results.md) into
# docs/performance.md, between its bench:begin and bench:end markers.
set -euo pipefail
table=$1 doc=$2
grep -q '^<!-- bench:begin -->$' "$doc" && grep -q '^<!-- bench:end -->$' "$doc" || {
	echo "$doc has no bench:begin / bench:end markers" >&2
	exit 1
}
awk -v table="$table" '
	/^<!-- bench:begin -->$/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
	/^<!-- bench:end -->$/ { skip = 0 }
	!skip { print }
' "$doc" >"$doc.tmp"
mv "$doc.tmp" "$doc"
echo "docs/performance.md updated from $table"
