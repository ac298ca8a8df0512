#!/usr/bin/env bash
# Two builds against each other on the same faults, interleaved: ROUNDS
# times a soak of SECONDS with build A, then one with build B (the same
# seeds), so that the machine's drift hits both alike. By default the pair
# of worker faults that opens every soak run (a kill at a step, a hang at
# the round change it opens), in short jobs. Prints the median and max lost
# time past each fault's own length, by kind and moment, for each build.
#
#   bench/fault/builds_ab.sh BUILD_A BUILD_B [ROUNDS] [SECONDS] [harness flags]
#
# Also the median of each kind over all its moments, and, fault by fault on
# the same seeds, how many of A's cost more than B's. DDPRUN_FAULT_OUT=DIR
# keeps each run's per-fault JSON there (<build's index>.<round>.json).
#
# A build folder needs launcher/ddprun, rendezvous/ddprun-rendezvous and
# mnist/ddprun-mnist (copy them out of a build to keep one while the other
# is rebuilt).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if (($# < 2)); then
  sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
builds=("$1" "$2")
rounds=${3:-2}
seconds=${4:-150}
shift $(($# < 4 ? $# : 4))
if [[ -n ${DDPRUN_FAULT_OUT:-} ]]; then
  out=$DDPRUN_FAULT_OUT
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
for ((r = 0; r < rounds; r++)); do
  for b in 0 1; do
    python3 "$root/tests/fault/fault_harness.py" \
      --build "${builds[$b]}" \
      --data-dir "${DDPRUN_MNIST_DIR:-$root/data/mnist}" \
      --kinds worker-kill,worker-hang --faults 2 --epochs 20 \
      --soak-seconds "$seconds" --seed $((7100 + 100 * r)) \
      --json "$out/$b.$r.json" "$@" | tail -n 1 |
      sed "s|^|round $r, ${builds[$b]}: |"
  done
done
python3 - "$out" "${builds[@]}" <<'PY'
import collections, glob, json, os, statistics, sys
out, builds = sys.argv[1], sys.argv[2:]
for b, build in enumerate(builds):
    lost = collections.defaultdict(list)
    for path in glob.glob(os.path.join(out, "%d.*.json" % b)):
        for f in json.load(open(path)):
            if f["lost_s"] is not None:
                lost[(f["kind"], f["moment"])].append(
                    f["lost_s"] - (f.get("own_s") or 0))
    for (kind, moment), v in sorted(lost.items()):
        print("%s: %-15s %-12s %3d faults, past its own length: "
              "median %.3f s, max %.3f s"
              % (build, kind, moment, len(v), statistics.median(v), max(v)))
    by_kind = collections.defaultdict(list)
    for (kind, moment), v in lost.items():
        by_kind[kind].extend(v)
    for kind, v in sorted(by_kind.items()):
        print("%s: %-15s %-12s %3d faults, past its own length: "
              "median %.3f s, max %.3f s"
              % (build, kind, "(all)", len(v), statistics.median(v), max(v)))
# The same seed's faults, in order, are the same plan for both builds.
pairs = collections.defaultdict(lambda: [0, 0, 0])
for path in glob.glob(os.path.join(out, "0.*.json")):
    other = path[:-len(os.path.basename(path))] + "1" + os.path.basename(path)[1:]
    if not os.path.exists(other):
        continue
    for a, b in zip(json.load(open(path)), json.load(open(other))):
        if a["lost_s"] is None or b["lost_s"] is None or a["kind"] != b["kind"]:
            continue
        d = a["lost_s"] - b["lost_s"]
        pairs[a["kind"]][0 if d > 0 else 1 if d < 0 else 2] += 1
for kind, (a_more, b_more, equal) in sorted(pairs.items()):
    print("%-15s paired by seed and fault: %s lost more in %d, %s in %d, "
          "equal %d" % (kind, builds[0], a_more, builds[1], b_more, equal))
PY
