#!/usr/bin/env bash
# One command for the collectives' figures: builds ddprun, ddprun-mnist and
# ddprun-allreduce-bench (in DDPRUN_BUILD_DIR, default build/), then
#   1. allreduce latency and bandwidth, 4 KB ... 256 MB, world 2 and 4, one
#      node: libddp, ProcessGroupGloo (C++), torch.distributed (Python),
#      memcpy (compare.py);
#   2. DDP samples/s with ddprun-mnist at world 1, 2, 4 against Python DDP
#      (seed-style DataLoader and index_select batching; bench/worker).
#   bench/collectives/run.sh [--runs 3]      (passed to both)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$root/build}"
[ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja >/dev/null
ninja -C "$build" ddprun ddprun-mnist ddprun-allreduce-bench >/dev/null
export DDPRUN_BUILD_DIR="$build"
/usr/bin/python3 "$root/bench/collectives/compare.py" "$@"
/usr/bin/python3 "$root/bench/worker/compare.py" --worlds 1,2,4 "$@"
