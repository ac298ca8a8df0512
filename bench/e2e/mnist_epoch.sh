#!/usr/bin/env bash
# The figures of the end-to-end issue: full MNIST, 1 epoch, 2 workers under
# `ddprun --standalone`: test accuracy, wall time of the whole command, time
# from launch to the first training step, samples/s. Median of RUNS runs.
#
#   bench/e2e/mnist_epoch.sh [RUNS]        (default 3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$root/build}"
runs="${1:-3}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for i in $(seq 1 "$runs"); do
  start=$(date +%s.%N)
  "$build/launcher/ddprun" --standalone --nproc-per-node 2 \
    "$build/mnist/ddprun-mnist" --epochs 1 --data-dir "$root/data/mnist" \
    --summary-json "$out/summary$i.json" --save "$out/model.pt" \
    >"$out/log$i" 2>&1
  end=$(date +%s.%N)
  echo "$start $end" >"$out/times$i"
done

/usr/bin/python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
rows = []
for i in range(1, runs + 1):
    s = json.load(open(f"{out}/summary{i}.json"))
    start, end = map(float, open(f"{out}/times{i}").read().split())
    s["command_wall_seconds"] = end - start
    # From the ddprun command's start, not the worker's: what a user waits.
    s["launch_to_first_step"] = s["first_step_unix_seconds"] - start
    rows.append(s)
def med(k):
    return statistics.median(r[k] for r in rows)
print(f"full MNIST, 1 epoch, ddprun --standalone --nproc-per-node 2, median of {runs}")
print(f"  test accuracy            {med('test_accuracy'):.4f}")
print(f"  wall time (command)      {med('command_wall_seconds'):.2f} s")
print(f"  launch -> first step     {med('launch_to_first_step'):.3f} s (ddprun start to rank 0's first step)")
print(f"  worker exec -> first step {med('time_to_first_step_seconds'):.3f} s")
print(f"  samples/s (training)     {med('samples_per_sec'):.0f}")
PY
