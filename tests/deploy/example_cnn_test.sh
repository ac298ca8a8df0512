#!/usr/bin/env bash
# examples/dist_cnn, a user's CNN (pytorch/examples' dist-mnist), built out of
# tree against the installed package (find_package(ddp)) and run under the
# installed ddprun with libddp's defaults:
# - equivalence: world 2 and 3 end with the parameters of one process
#   trained on the same global batches (dropout off: masks differ per
#   process), within float rounding (measured: 3e-8 at world 2, 1e-5 at
#   world 3, whose average divides by 3 each step);
# - the fast path ran: every bucket of every step summed in shared memory
#   where backward left it (DataParallel::GradientStats), none copied;
# - buffers: with a BatchNorm, every rank ends with rank 0's buffers and
#   parameters, bit for bit.
#   example_cnn_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir=$1
source_dir=$2
mnist_dir=${DDPRUN_MNIST_DIR:-$source_dir/data/mnist}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

[[ -f $mnist_dir/train-images-idx3-ubyte ]] || fail "no MNIST in $mnist_dir"
cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install into $prefix"; }
launcher=$(sed -n 's/^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
cp -r "$source_dir/examples/dist_cnn" "$work/src"
export CCACHE_BASEDIR=$work
cmake -S "$work/src" -B "$work/cnn" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" \
  >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring examples/dist_cnn"; }
cmake --build "$work/cnn" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "building examples/dist_cnn"; }
cnn=$work/cnn/dist-cnn
# --mkldnn 0: LibTorch's own convolutions, not oneDNN's. Debian 13's
# LibTorch 2.6 (oneDNN 3.7.2) on this CI's 2-core VM now and then computes
# a NaN into one rank's own gradients, in conv1's backward, before any sync:
# at world 3, 30 steps, 9 of 30 runs under torchrun with the process group
# (no libddp path involved), and about 1 in 7 under ddprun on every gradient
# path; none at world 1, none with oneDNN off (bench/examples/README.md,
# wave 21). This test checks libddp's sums; it takes convolutions that
# compute the same on every run.
common=(--data-dir "$mnist_dir" --steps 30 --batch-size 32 --mkldnn 0)

# run WORLD OUT ARGS...: the example under the installed ddprun.
run() {
  local world=$1 out=$2
  shift 2
  OMP_NUM_THREADS=1 "$prefix/bin/ddprun" --standalone --nproc-per-node "$world" \
    "$cnn" "${common[@]}" "$@" >"$out" 2>"$out.err" ||
    { cat "$out" "$out.err" >&2; fail "world $world: $*"; }
}
# max_diff A B: the largest absolute difference between two dumps, or
# "non-finite" when either holds a NaN or an infinity (awk's comparisons
# with a NaN are all false: it would vanish from the maximum).
max_diff() {
  paste -d'\n' "$1" "$2" | awk '
    { for (i = 2; i <= NF; ++i) if (tolower($i) ~ /nan|inf/) { bad = "non-finite"; exit } }
    NR % 2 == 1 { n = split($0, a, " "); name = a[1]; next }
    { m = split($0, b, " ");
      if (b[1] != name || m != n) { bad = "layout"; exit }
      for (i = 2; i <= n; ++i) { d = a[i] - b[i]; if (d < 0) d = -d; if (d > max) max = d } }
    END { if (bad != "") print bad; else printf "%.3g\n", max + 0 }'
}

for world in 2 3; do
  run 1 "$work/ref$world.out" --dropout 0 --reference-replicas "$world" \
    --dump "$work/ref$world"
  run "$world" "$work/w$world.out" --dropout 0 --dump "$work/w$world"
  line=$(grep '^gradient path ' "$work/w$world.out") ||
    fail "world $world printed no counters: $(cat "$work/w$world.out")"
  read -r _ _ path _ buckets _ in_place _ copied _ group <<<"$line"
  [[ $path == shared-memory ]] || fail "world $world took $path: $line"
  ((in_place == 30 * buckets && copied == 0 && group == 0)) ||
    fail "world $world: not every bucket summed in place: $line"
  diff=$(max_diff "$work/ref$world.0" "$work/w$world.0")
  awk -v d="$diff" 'BEGIN { exit !(d ~ /^[0-9.e+-]+$/ && d <= 5e-5) }' || {
    cat "$work/w$world.out" "$work/w$world.out.err" >&2
    fail "world $world differs from one process by $diff"
  }
  # Training moved the parameters.
  run 1 "$work/init.out" --steps 0 --dump "$work/init"
  moved=$(max_diff "$work/init.0" "$work/w$world.0")
  awk -v d="$moved" 'BEGIN { exit !(d ~ /^[0-9.e+-]+$/ && d > 1e-3) }' ||
    fail "training moved nothing ($moved)"
  echo "world $world: $line; max difference from one process $diff"
done

run 2 "$work/bn.out" --batchnorm 1 --dump "$work/bn"
grep -q '^buffer.bn.running_mean ' "$work/bn.0" || fail "no BatchNorm buffers dumped"
# A dump against itself: 0, or "non-finite".
[[ $(max_diff "$work/bn.0" "$work/bn.0") == 0 ]] ||
  fail "the BatchNorm run ended with non-finite parameters or buffers"
cmp -s "$work/bn.0" "$work/bn.1" || fail "ranks end with different parameters or buffers"
echo "PASS: examples/dist_cnn built against $prefix, equivalent and in place"
