#!/usr/bin/env bash
# make demo: the main job on the embedded simulator. Starts a simulated
# management + workload cluster (3 control-plane machines at v1.35.2), runs
#   kubectl cp-rollout upgrade demo --version v1.36.3
# through the real kubectl so you watch the progress, shows the machines and
# etcd members afterwards, and shuts the simulator down.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="$root/bin:$PATH"
export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$("$root/hack/envtest-binaries.sh")}
work=$(mktemp -d)
export KUBECONFIG="$work/kubeconfig"
export XDG_CONFIG_HOME="$work/config" # the demo ignores your own cp-rollout config

sim_pid=
stop_sim() {
	if [[ -n "$sim_pid" ]] && kill -0 "$sim_pid" 2>/dev/null; then
		echo "==> stopping the simulator"
		kill -INT "$sim_pid" 2>/dev/null || true
		for _ in $(seq 60); do kill -0 "$sim_pid" 2>/dev/null || break; sleep 0.5; done
		# Its own process group: nothing it started outlives the demo.
		kill -KILL -- "-$sim_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap stop_sim EXIT

echo "==> starting the simulator (3 control-plane machines at v1.35.2)"
setsid cp-rollout-sim up --kubeconfig-out "$KUBECONFIG" --cluster demo --replicas 3 --version v1.35.2 >"$work/sim.log" 2>&1 &
sim_pid=$!
until grep -q '^ready' "$work/sim.log" 2>/dev/null; do
	if ! kill -0 "$sim_pid" 2>/dev/null; then
		cat "$work/sim.log" >&2
		exit 1
	fi
	sleep 0.5
done
grep '^ready' "$work/sim.log"

echo
echo "==> kubectl cp-rollout status demo"
kubectl cp-rollout status demo
echo
echo "==> kubectl cp-rollout plan demo --version v1.36.3"
kubectl cp-rollout plan demo --version v1.36.3
echo
echo "==> kubectl cp-rollout upgrade demo --version v1.36.3"
kubectl cp-rollout upgrade demo --version v1.36.3
echo
echo "==> kubectl cp-rollout status demo"
kubectl cp-rollout status demo
