#!/usr/bin/env bash
# The README's snippet in a user's CNN (examples/dist_cnn, built out of tree
# against this build installed in a temporary prefix, as a user would) at
# world 2 under `ddprun --standalone`: libddp's default path (no option set)
# against the same program on its own process-group path
# (`--gradient-sync process-group`, GradientSync::kProcessGroup), and the
# default path with glibc malloc's own thresholds (`--tune-malloc 0`, as
# before libddp fixed them: DataParallelOptions::tune_malloc). Runs are
# interleaved rounds (default, process group, untuned default, ceiling, ...)
# so that load from elsewhere hits all alike. The ceiling: two
# world-1 jobs of the same program at once, their samples/s summed (no
# gradient path can beat two processes that never wait for each other).
# Prints each round's samples/s and the medians of the per-round ratios.
#
#   bench/examples/cnn_paths.sh [ROUNDS] [STEPS]   (default 7 rounds, 300 steps)
#
# Needs the install targets built in DDPRUN_BUILD_DIR (default build/):
#   cmake --build build --target ddprun ddprun-rendezvous ddprun-relay ddprun-mnist libddp
set -euo pipefail
unset OMP_NUM_THREADS  # ddprun's defaults: 1 per worker when a node runs several
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${DDPRUN_BUILD_DIR:-$root/build}"
mnist_dir="${DDPRUN_MNIST_DIR:-$root/data/mnist}"
rounds="${1:-7}"
steps="${2:-300}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >"$work/install.log"
launcher=$(sed -n 's/^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=//p' "$build/CMakeCache.txt")
cmake -S "$root/examples/dist_cnn" -B "$work/cnn" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" >"$work/configure.log"
cmake --build "$work/cnn" >"$work/build.log"

# one PATH_ARGS...: samples/s of one world-2 run (ddprun's defaults).
one() {
  world 2 one "$@"
}
# world N NAME PATH_ARGS...: samples/s of one world-N run, its output in NAME.
world() {
  local n=$1 name=$2
  shift 2
  "$prefix/bin/ddprun" --standalone --nproc-per-node "$n" "$work/cnn/dist-cnn" \
    --data-dir "$mnist_dir" --steps "$steps" "$@" >"$work/$name.out" \
    2>"$work/$name.err" ||
    { cat "$work/$name.out" "$work/$name.err" >&2; exit 1; }
  grep -q '^gradient path' "$work/$name.out"
  sed -n 's/^samples_per_sec //p' "$work/$name.out"
}
# The ceiling: two world-1 runs at once, samples/s summed.
ceiling() {
  world 1 a >"$work/a.rate" &
  local pid=$!
  world 1 b >"$work/b.rate"
  wait "$pid"
  awk '{ s += $1 } END { print s }' "$work/a.rate" "$work/b.rate"
}

echo "examples/dist_cnn, world 2, $steps steps of 64 per rank, $rounds interleaved rounds ($(date -u +%H:%M) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))"
ratios=()
untuned_ratios=()
ceiling_ratios=()
ceiling_pg_ratios=()
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
for i in $(seq 1 "$rounds"); do
  fast=$(one)
  slow=$(one --gradient-sync process-group)
  untuned=$(one --tune-malloc 0)
  top=$(ceiling)
  ratio=$(div "$fast" "$slow")
  ratios+=("$ratio")
  untuned_ratios+=("$(div "$untuned" "$slow")")
  ceiling_ratios+=("$(div "$fast" "$top")")
  ceiling_pg_ratios+=("$(div "$top" "$slow")")
  printf '  round %d: default %.0f  process group %.0f  untuned default %.0f  ceiling %.0f samples/s  ratio %s\n' \
    "$i" "$fast" "$slow" "$untuned" "$top" "$ratio"
done
median() {
  sort -g | awk -v what="$1" '
    { r[NR] = $1 } END {
      m = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
      printf "median %s: %.2fx (min %.2fx, max %.2fx)\n", what, m, r[1], r[NR] }'
}
printf '%s\n' "${ratios[@]}" | median "default / process group"
printf '%s\n' "${untuned_ratios[@]}" | median "untuned default / process group"
printf '%s\n' "${ceiling_ratios[@]}" | median "default / ceiling"
printf '%s\n' "${ceiling_pg_ratios[@]}" | median "ceiling / process group"
