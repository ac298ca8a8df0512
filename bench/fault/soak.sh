#!/usr/bin/env bash
# The soak: the fault harness (tests/fault/fault_harness.py) for 30
# minutes, faulted run after faulted run with successive seeds, hundreds of
# faults of every kind, each run checked against the fault-free reference
# (bit-identical model, no stall, no lost step, nothing left behind). Prints
# the time lost per fault, by kind (median and max), and writes every
# fault's figure to bench/fault/soak.json.
#
#   bench/fault/soak.sh [SECONDS] [extra fault_harness.py flags]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
seconds=${1:-1800}
shift || true
exec python3 "$root/tests/fault/fault_harness.py" \
  --build "${DDPRUN_BUILD_DIR:-$root/build}" \
  --data-dir "${DDPRUN_MNIST_DIR:-$root/data/mnist}" \
  --faults 12 --epochs 60 --soak-seconds "$seconds" \
  --json "$root/bench/fault/soak.json" "$@"
