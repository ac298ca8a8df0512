#!/usr/bin/env bash
# deploy/local/netns_cluster.sh for real: a job across hosts that are network
# namespaces on a bridge (each worker sees its own host's address), and a
# partition that cuts one host off the rendezvous and heals again. Cleans up
# its namespaces on any exit.
#   netns_test.sh SOURCE_DIR DDPRUN RENDEZVOUS [MNIST]     (root; 77 = skipped)
set -euo pipefail
source_dir=$1
export DDPRUN=$2 DDPRUN_RENDEZVOUS=$3
mnist=${4:-}
script=$source_dir/deploy/local/netns_cluster.sh
fail() { echo "FAIL: $*" >&2; exit 1; }
if [[ $(id -u) -ne 0 ]] || ! ip netns list >/dev/null 2>&1; then
  # Under CI=true nothing may skip.
  [[ ${CI:-} == true ]] && fail "network namespaces need root and iproute2 (CI=true: no skips)"
  echo "SKIP: network namespaces need root and iproute2" >&2
  exit 77
fi

work=$(mktemp -d)
name="ddpt$$"
rdzv_pid=
cleanup() {
  [[ -n $rdzv_pid ]] && { kill "$rdzv_pid" 2>/dev/null; wait "$rdzv_pid" 2>/dev/null; }
  "$script" down "$name" || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. A job across three hosts.
if [[ -n $mnist ]]; then
  program=("$mnist" --epochs 1 --data-dir "$source_dir/data/mnist"
           --train-limit 3000 --summary-json "$work/summary.json")
else
  printf '#!/bin/sh\necho "worker rank=$RANK world=$WORLD_SIZE addr=$DDPRUN_LOCAL_ADDR"\n' \
    >"$work/worker.sh"
  chmod +x "$work/worker.sh"
  program=("$work/worker.sh")
fi
start=$(date +%s.%N)
timeout 300 "$script" demo --hosts 3 --nproc-per-node 1 "${program[@]}" \
  >"$work/demo.out" 2>"$work/demo.err" ||
  { cat "$work/demo.err" >&2; fail "the demo job failed"; }
end=$(date +%s.%N)
if [[ -n $mnist ]]; then
  grep -q '"world_size": *3' "$work/summary.json" || fail "no MNIST summary for world 3"
else
  for host in 1 2 3; do
    grep -q "world=3 addr=10.253.0.1$host\$" "$work/demo.out" ||
      { cat "$work/demo.out" >&2; fail "no worker on host h$host (10.253.0.1$host)"; }
  done
  [[ $(grep -c '^worker rank=[012] world=3' "$work/demo.out") == 3 ]] ||
    fail "expected ranks 0..2 once each: $(cat "$work/demo.out")"
fi
ip netns list | grep -q '^ddpl' && fail "the demo left namespaces behind: $(ip netns list)"

# 2. Partition and heal, seen through the real client (the rendezvous and
# the client take the token from the environment).
DDPRUN_TOKEN=$(head -c 32 /dev/urandom | base64)
export DDPRUN_TOKEN
"$script" up "$name" 2 2>/dev/null
ip netns exec "$name-rdzv" "$DDPRUN_RENDEZVOUS" --host 10.253.0.1 --port 29400 --insecure \
  >"$work/rdzv.out" 2>&1 &
rdzv_pid=$!
reachable() {
  ip netns exec "$name-$1" "$DDPRUN" status --rdzv-endpoint 10.253.0.1:29400 \
    --timeout 1 >/dev/null 2>&1
}
deadline=$((SECONDS + 20))
until reachable h1; do
  ((SECONDS < deadline)) || fail "h1 never reached the rendezvous: $(cat "$work/rdzv.out")"
  sleep 0.1
done
"$script" partition "$name" h1
reachable h1 && fail "h1 still reaches the rendezvous while partitioned"
reachable h2 || fail "h2 lost the rendezvous when only h1 was partitioned"
"$script" heal "$name" h1
deadline=$((SECONDS + 20))
until reachable h1; do
  ((SECONDS < deadline)) || fail "h1 did not reach the rendezvous after heal"
  sleep 0.1
done
printf 'PASS: 3-host job across namespaces in %.1f s; partition and heal seen by ddprun status\n' \
  "$(awk -v a="$start" -v b="$end" 'BEGIN{print b - a}')"
