#!/usr/bin/env bash
# Time lost per worker fault (kill -9, SIGSTOP) at a fixed world, by the
# agent's prewarming: the default, --no-prewarm and --prewarm, interleaved
# (one harness run of each in turn, ROUNDS times, so that the machine's
# drift hits all three alike), each run checked by the harness's
# invariants. Prints the median (and max) lost time per kind and setting,
# and the ratio of each to --no-prewarm's.
#
#   bench/fault/worker_faults.sh [ROUNDS] [extra fault_harness.py flags]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rounds=${1:-3}
shift || true
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
settings=(default --no-prewarm --prewarm)
for ((r = 0; r < rounds; r++)); do
  for s in "${settings[@]}"; do
    flags=()
    [[ $s != default ]] && flags=("--agent-flags=$s")
    python3 "$root/tests/fault/fault_harness.py" \
      --build "${DDPRUN_BUILD_DIR:-$root/build}" \
      --data-dir "${DDPRUN_MNIST_DIR:-$root/data/mnist}" \
      --kinds worker-kill,worker-hang --faults 12 --epochs 120 \
      --seed $((7 + r)) "${flags[@]}" --json "$out/$s.$r.json" "$@" |
      tail -n 1
  done
done
python3 - "$out" "${settings[@]}" <<'EOF'
import glob, json, os, statistics, sys
out, settings = sys.argv[1], sys.argv[2:]
lost = {}
for s in settings:
    for path in glob.glob(os.path.join(out, s + ".*.json")):
        for f in json.load(open(path)):
            if f["lost_s"] is not None:
                lost.setdefault((s, f["kind"]), []).append(f["lost_s"])
for kind in ("worker-kill", "worker-hang"):
    base = statistics.median(lost.get(("--no-prewarm", kind), [float("nan")]))
    for s in settings:
        v = lost.get((s, kind), [])
        if not v:
            continue
        m = statistics.median(v)
        print("%-12s %-12s %3d faults  median %.3f s  max %.3f s  "
              "(x%.2f of --no-prewarm)" % (kind, s, len(v), m, max(v), m / base))
EOF
