#!/usr/bin/env bash
# Repository checks CI runs before the tests: no build output or other large
# file is tracked, and both Go modules are tidy (go.mod says which
# dependencies are direct, and go.sum holds exactly what they need).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The largest file a source tree needs here is a generated CRD (~360 KB); a
# compiled binary is 50-100 MB. 1 MiB separates the two.
limit=$((1024 * 1024))
big=$(git ls-files -z | xargs -0 stat -c '%s %n' 2>/dev/null | awk -v limit="$limit" '$1 > limit')
if [[ -n "$big" ]]; then
	echo "tracked files over 1 MiB (build output? add it to .gitignore and git rm --cached it):" >&2
	echo "$big" >&2
	exit 1
fi

for dir in . hack/tools; do
	if ! diff=$(cd "$dir" && go mod tidy -diff 2>&1); then
		echo "$dir/go.mod is not tidy; run (cd $dir && go mod tidy) and commit the result:" >&2
		echo "$diff" >&2
		exit 1
	fi
done
