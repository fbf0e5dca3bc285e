#!/usr/bin/env bash
# hack/board-capture.sh: captures the live board of a staged fleet run into
# docs/fleet-board.txt (or the file given as $1).
#
# Builds the plugin and the simulator (make build), starts the simulator
# with six clusters of one control-plane machine each on one management
# cluster (cp-rollout-sim up --clusters 6: demo-1 … demo-6 in namespace
# board, labelled env=sim), labels them into three rings (ring=0: demo-1,
# demo-2; ring=1: demo-3, demo-4; ring=2: demo-5, demo-6), and runs
#   kubectl cp-rollout upgrade -A -l env=sim --version v1.36.3 \
#       --stages 'ring=0;ring=1;ring=2' --parallel 2 --stage-soak 10s
# in a detached tmux session of 140x30 (a terminal, so the board is drawn).
# The pane is captured a few seconds (BOARD_SETTLE) into each stage's phase
# as the board's header line names it ("stage 2/3 soaking"), and once more
# when the run has ended; then the tmux server (a private one,
# -L cp-rollout-board-$$) and the simulator are stopped.
#
# Environment: BOARD_SOAK=10s, BOARD_SETTLE=4 (seconds into a phase),
# BOARD_TIMEOUT=900 (seconds the run may take), KUBEBUILDER_ASSETS (default
# hack/envtest-binaries.sh's).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/docs/fleet-board.txt}
settle=${BOARD_SETTLE:-4}
soak=${BOARD_SOAK:-10s}
timeout=${BOARD_TIMEOUT:-900}
version=v1.36.3
ns=board
run=board-$(date -u +%Y%m%d-%H%M%S)

cd "$root"
echo "==> make build" >&2
make build >&2
export PATH="$root/bin:$PATH"
export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$("$root/hack/envtest-binaries.sh")}
work=$(mktemp -d)
export KUBECONFIG="$work/kubeconfig"
export XDG_CONFIG_HOME="$work/config" # none of your own cp-rollout config
sock=cp-rollout-board-$$

sim_pid=
cleanup() {
	tmux -L "$sock" kill-server 2>/dev/null || true
	if [[ -n "$sim_pid" ]] && kill -0 "$sim_pid" 2>/dev/null; then
		echo "==> stopping the simulator" >&2
		kill -INT "$sim_pid" 2>/dev/null || true
		for _ in $(seq 120); do kill -0 "$sim_pid" 2>/dev/null || break; sleep 0.5; done
		# Its own process group (setsid): nothing it started outlives it.
		kill -KILL -- "-$sim_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "==> starting the simulator: 6 clusters of 1 control-plane machine at v1.35.2" >&2
setsid cp-rollout-sim up --kubeconfig-out "$KUBECONFIG" --cluster demo --clusters 6 --namespace "$ns" \
	--replicas 1 --version v1.35.2 --provision-delay 2s --delete-delay 1s >"$work/sim.log" 2>&1 &
sim_pid=$!
until grep -q '^ready' "$work/sim.log" 2>/dev/null; do
	if ! kill -0 "$sim_pid" 2>/dev/null; then
		cat "$work/sim.log" >&2
		exit 1
	fi
	sleep 1
done
grep '^ready' "$work/sim.log" >&2

kubectl -n "$ns" label --overwrite cluster demo-1 demo-2 ring=0 >&2
kubectl -n "$ns" label --overwrite cluster demo-3 demo-4 ring=1 >&2
kubectl -n "$ns" label --overwrite cluster demo-5 demo-6 ring=2 >&2

cmd="kubectl cp-rollout upgrade -A -l env=sim --version $version --stages 'ring=0;ring=1;ring=2' --parallel 2 --stage-soak $soak --run $run"
echo "==> in tmux (140x30): $cmd" >&2
# The pane's shell keeps the screen after the run, and says how it ended.
tmux -L "$sock" new-session -d -s board -x 140 -y 30 \
	"PATH='$PATH' KUBECONFIG='$KUBECONFIG' XDG_CONFIG_HOME='$XDG_CONFIG_HOME' $cmd; echo \"[exit \$?]\"; sleep 100000"

# trimmed drops a capture's trailing blank lines: tmux pads the pane to 30.
trimmed() { awk '{l[NR] = $0} END {n = NR; while (n > 0 && l[n] == "") n--; for (i = 1; i <= n; i++) print l[i]}'; }
capture() { # label
	{
		printf '\n----- %s -----\n' "$1"
		tmux -L "$sock" capture-pane -p -t board | trimmed
	} >>"$work/board.txt"
}
ended() { tmux -L "$sock" capture-pane -p -t board -S -200 | grep -q '^\[exit [0-9]*\]'; }

{
	echo "# The live board of a staged fleet run, captured by hack/board-capture.sh on $(date -u +%Y-%m-%d)."
	echo "# 6 simulated clusters of 1 control-plane machine (cp-rollout-sim up --clusters 6 --replicas 1),"
	echo "# in rings ring=0 (demo-1, demo-2), ring=1 (demo-3, demo-4), ring=2 (demo-5, demo-6); a 140x30 terminal:"
	echo "#   $cmd"
} >"$work/board.txt"

began=$SECONDS
seen=
until ended; do
	if ((SECONDS - began > timeout)); then
		capture "still running after ${timeout}s: given up"
		cp "$work/board.txt" "$out"
		echo "the run did not end within ${timeout}s; captures in $out" >&2
		exit 1
	fi
	# The board's header: "fleet run RUN · stage 2/3 soaking · …".
	phase=$(tmux -L "$sock" capture-pane -p -t board | grep -o 'stage [0-9]*/[0-9]* [a-z]*' | head -1 || true)
	if [[ -n "$phase" && "$phase" != *" done" && "|$seen|" != *"|$phase|"* ]]; then
		seen="$seen|$phase"
		sleep "$settle"
		ended && break
		capture "$phase, $((SECONDS - began))s after the start"
	fi
	sleep 0.5
done
sleep 1
{
	printf '\n----- the end, %ss after the start -----\n' "$((SECONDS - began))"
	# The closing table may have scrolled the board away: the pane's history too.
	tmux -L "$sock" capture-pane -p -t board -S -200 | trimmed
} >>"$work/board.txt"
echo "==> kubectl cp-rollout fleet status $run" >&2
kubectl cp-rollout fleet status "$run" >&2 || true

cp "$work/board.txt" "$out"
echo "==> captured into $out" >&2
