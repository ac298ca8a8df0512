#!/usr/bin/env bash
# One command: builds ddprun and ddprun-mnist (in DDPRUN_BUILD_DIR, default
# build/) and compares them with torchrun + Python DDP; see compare.py.
#   bench/worker/run.sh [--runs 3] [--worlds 1,2,4]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$root/build}"
[ -f "$build/build.ninja" ] || cmake -S "$root" -B "$build" -G Ninja >/dev/null
ninja -C "$build" ddprun ddprun-mnist >/dev/null
DDPRUN_BUILD_DIR="$build" exec /usr/bin/python3 "$root/bench/worker/compare.py" "$@"
