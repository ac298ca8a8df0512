#!/usr/bin/env bash
# Time lost per worker fault (kill -9, SIGSTOP) at a fixed world, by the
# agent's prewarming: the default, --no-prewarm and --prewarm, interleaved
# (one harness run of each in turn, ROUNDS times, so that the machine's
# drift hits all three alike), each run checked by the harness's
# invariants. Prints the median (and max) lost time per kind and setting,
# and the ratio of each to --no-prewarm's (or, without it, to the first
# setting's). DDPRUN_FAULT_SETTINGS replaces the
# three settings with others, ';' between them, e.g. the stopped bound's old
# default against its new one:
#
#   bench/fault/worker_faults.sh [ROUNDS] [extra fault_harness.py flags]
#   DDPRUN_FAULT_SETTINGS='default;--hang-bound stopped=0.1' \
#     bench/fault/worker_faults.sh 3
# Extra flags come last and win, e.g. deadlocks instead of kills and stops,
# found blocked (the default) or by the step's bound alone:
#   DDPRUN_FAULT_SETTINGS='default;--hang-bound blocked=0' \
#     bench/fault/worker_faults.sh 3 --kinds worker-block
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rounds=${1:-3}
shift || true
# DDPRUN_FAULT_OUT keeps each run's per-fault JSON there, as
# s<setting's index>.<round>.json.
if [[ -n ${DDPRUN_FAULT_OUT:-} ]]; then
  out=$DDPRUN_FAULT_OUT
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
IFS=';' read -r -a settings <<<"${DDPRUN_FAULT_SETTINGS:-default;--no-prewarm;--prewarm}"
for ((r = 0; r < rounds; r++)); do
  for i in "${!settings[@]}"; do
    s=${settings[$i]}
    flags=()
    [[ $s != default ]] && flags=("--agent-flags=$s")
    python3 "$root/tests/fault/fault_harness.py" \
      --build "${DDPRUN_BUILD_DIR:-$root/build}" \
      --data-dir "${DDPRUN_MNIST_DIR:-$root/data/mnist}" \
      --kinds worker-kill,worker-hang --faults 12 --epochs 120 \
      --seed $((7 + r)) "${flags[@]}" --json "$out/s$i.$r.json" "$@" |
      tail -n 1
  done
done
python3 - "$out" "${settings[@]}" <<'EOF'
import glob, json, os, statistics, sys
out, settings = sys.argv[1], sys.argv[2:]
base_setting = "--no-prewarm" if "--no-prewarm" in settings else settings[0]
lost = {}
for i, s in enumerate(settings):
    for path in glob.glob(os.path.join(out, "s%d.*.json" % i)):
        for f in json.load(open(path)):
            if f["lost_s"] is not None:
                lost.setdefault((s, f["kind"]), []).append(f["lost_s"])
for kind in sorted({k for (_, k) in lost}):
    base = statistics.median(lost.get((base_setting, kind), [float("nan")]))
    for s in settings:
        v = lost.get((s, kind), [])
        if not v:
            continue
        m = statistics.median(v)
        print("%-12s %-12s %3d faults  median %.3f s  max %.3f s  "
              "(x%.2f of %s)" % (kind, s, len(v), m, max(v), m / base, base_setting))
EOF
