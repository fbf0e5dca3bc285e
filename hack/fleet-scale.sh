#!/usr/bin/env bash
# hack/fleet-scale.sh: the largest fleet of simulated clusters this machine
# holds, upgraded in three stages. Figures into bench/fleet-sim.json (or $1).
#
# Starts the simulator with CLUSTERS clusters (default 32: 40 do not start on two cores) of one
# control-plane machine each on one management cluster, every one with its
# own workload API server and etcd member, labels them into three rings
# (the first 1/6 ring=0, the next 1/3 ring=1, the rest ring=2: a canary, an
# early ring, the main one), and runs
#   kubectl cp-rollout upgrade -A -l env=sim --version v1.36.3 \
#       --stages 'ring=0;ring=1;ring=2' --parallel PARALLEL --stage-soak 10s -o json
# then checks that every cluster reached the version, and writes the run's
# figures: how long the simulator took to start, the run's wall time, each
# cluster's duration (median, slowest), the machine's load and the memory of
# every process the simulator started.
#
# Environment: CLUSTERS=32, PARALLEL=4, KUBEBUILDER_ASSETS (default
# hack/envtest-binaries.sh's).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/bench/fleet-sim.json}
clusters=${CLUSTERS:-32}
parallel=${PARALLEL:-4}
version=v1.36.3
ns=scale

cd "$root"
make build >&2
export PATH="$root/bin:$PATH"
export KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$("$root/hack/envtest-binaries.sh")}
work=$(mktemp -d)
export KUBECONFIG="$work/kubeconfig"
export XDG_CONFIG_HOME="$work/config"

sim_pid=
cleanup() {
	if [[ -n "$sim_pid" ]] && kill -0 "$sim_pid" 2>/dev/null; then
		kill -INT "$sim_pid" 2>/dev/null || true
		for _ in $(seq 120); do kill -0 "$sim_pid" 2>/dev/null || break; sleep 0.5; done
		kill -KILL -- "-$sim_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "==> starting the simulator: $clusters clusters of 1 control-plane machine" >&2
began=$SECONDS
setsid cp-rollout-sim up --kubeconfig-out "$KUBECONFIG" --cluster demo --clusters "$clusters" --namespace "$ns" \
	--replicas 1 --version v1.35.2 --provision-delay 2s --delete-delay 1s >"$work/sim.log" 2>&1 &
sim_pid=$!
until grep -q '^ready' "$work/sim.log" 2>/dev/null; do
	if ! kill -0 "$sim_pid" 2>/dev/null; then
		cat "$work/sim.log" >&2
		exit 1
	fi
	sleep 1
done
started=$((SECONDS - began))
echo "==> ready after ${started}s" >&2

canary=$(((clusters + 5) / 6))
early=$((canary + (clusters + 2) / 3))
for i in $(seq 1 "$clusters"); do
	ring=2
	((i <= early)) && ring=1
	((i <= canary)) && ring=0
	kubectl -n "$ns" label --overwrite cluster "demo-$i" "ring=$ring" >/dev/null
done

# The memory of the simulator's process group, every API server and etcd.
rss_mib() { ps -o rss= -g "$sim_pid" | awk '{s += $1} END {printf "%d", s / 1024}'; }
idle_rss=$(rss_mib)
load_before=$(cut -d' ' -f1 /proc/loadavg)

echo "==> upgrading in three stages, --parallel $parallel" >&2
began=$SECONDS
code=0
kubectl cp-rollout upgrade -A -l env=sim --version "$version" --stages 'ring=0;ring=1;ring=2' \
	--parallel "$parallel" --stage-soak 10s -o json >"$work/events.jsonl" 2>"$work/stderr" || code=$?
took=$((SECONDS - began))
load_after=$(cut -d' ' -f1 /proc/loadavg)
peak_rss=$(rss_mib)
if ((code != 0)); then
	tail -20 "$work/stderr" >&2
	echo "the fleet run exited $code" >&2
	exit 1
fi

at=$(kubectl get kcp -n "$ns" -o jsonpath='{range .items[*]}{.status.version}{"\n"}{end}' | grep -c "^$version$" || true)
if ((at != clusters)); then
	echo "only $at of $clusters control planes report $version" >&2
	exit 1
fi

# Each cluster's duration, from the closing fleet event.
durations=$(grep '"action":"fleet"' "$work/events.jsonl" | tail -1 |
	python3 -c 'import json,sys; print(" ".join(str(c["durationMs"]) for c in json.load(sys.stdin)["clusters"]))')
read -r median slowest < <(tr ' ' '\n' <<<"$durations" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)], a[NR]}')

cat >"$out" <<EOF
{
  "what": "the largest fleet of simulated clusters this machine holds, upgraded in three stages by one fleet run",
  "command": "CLUSTERS=$clusters PARALLEL=$parallel hack/fleet-scale.sh",
  "fleetRun": "kubectl cp-rollout upgrade -A -l env=sim --version $version --stages 'ring=0;ring=1;ring=2' --parallel $parallel --stage-soak 10s -o json",
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "machine": {"cpus": $(nproc), "memoryGiB": $(awk '/MemTotal/ {printf "%d", $2 / 1048576}' /proc/meminfo)},
  "clusters": $clusters,
  "machinesPerCluster": 1,
  "rings": [$canary, $((early - canary)), $((clusters - early))],
  "simulatorStartSeconds": $started,
  "runSeconds": $took,
  "clusterMedianMs": $median,
  "clusterSlowestMs": $slowest,
  "simulatorRssMiB": {"idle": $idle_rss, "afterRun": $peak_rss},
  "loadAverage1m": {"before": $load_before, "after": $load_after},
  "allAtVersion": true
}
EOF
cat "$out"
