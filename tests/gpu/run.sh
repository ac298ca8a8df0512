#!/usr/bin/env bash
# GPU checks of libddp, one command for a machine with NVIDIA GPUs (CI has
# none; there scripts/test-debian13.sh compiles and links this NCCL path
# against Debian 13's CUDA LibTorch instead). World size = the GPUs seen.
#
# Builds the worker, the rendezvous and pg_helper against a CUDA LibTorch --
# the one inside an installed PyTorch (torch.utils.cmake_prefix_path), or
# LIBTORCH_DIR -- taking gRPC, protobuf, absl, spdlog, CLI11, GoogleTest and
# MNIST from the folder tests/gpu/make_carry.sh made (CARRY_DIR, default
# build-gpu-carry/) when the machine has none of its own; then:
#   1. ProcessGroupNCCL through the rendezvous's gRPC store, one rank per GPU,
#      a world of one included: NCCL's unique ID goes through the store (the
#      ranks check that the store holds keys after their collectives);
#   2. DDP equivalence on CUDA: with >= 2 GPUs, N ranks x batch 64/N against
#      one process x batch 64 (1e-5); with one GPU, CUDA against CPU for the
#      same run (1e-4: different kernels);
#   3. one full MNIST epoch on the GPUs: samples/s and accuracy (> 85 %);
#   4. the seed's run, ddprun-mnist's default 10 epochs: accuracy (> 92 %).
# Every step has a time limit; all of it stays within TIME_LIMIT seconds
# (default 460: a device call may run 8 minutes).
# Usage: tests/gpu/run.sh   (env: PYTHON, LIBTORCH_DIR, CARRY_DIR, BUILD_DIR,
#                             DATA_DIR, TIME_LIMIT, BUILD_LIMIT, JOBS, PREPARE_ONLY,
#                             CPU_ONLY)
# Where no GPU is (tests/gpu/test_carry.sh): PREPARE_ONLY=1 stops after the
# build; CPU_ONLY=1 leaves out only what needs CUDA: steps 1 and 3 run on
# Gloo in a world of one (the store path still forced), 2 and 4 are skipped.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
if [ -z "${DDPRUN_GPU_BOUNDED:-}" ]; then
  DDPRUN_GPU_BOUNDED=1 timeout --kill-after=10 "${TIME_LIMIT:-460}" bash "$0" "$@" && exit 0
  status=$?
  [ "$status" -ne 124 ] || echo "tests/gpu/run.sh: FAIL: over ${TIME_LIMIT:-460} s" >&2
  exit "$status"
fi
PYTHON=${PYTHON:-python3}
BUILD=${BUILD_DIR:-$root/build-gpu}
CARRY=${CARRY_DIR:-$root/build-gpu-carry}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "tests/gpu/run.sh: FAIL: $*" >&2; exit 1; }
started=$SECONDS
step() { echo "== [$((SECONDS - started)) s] $*"; }

# --- the carried dependencies (no GPU needed up to the build) -----------------
carry_env=()  # how the built programs run
build_env=()  # how cmake and ninja run
cmake_prefix=()
carry_flags=""
if [ -d "$CARRY/root/usr" ]; then
  usr=$CARRY/root/usr
  need=$(cat "$CARRY/glibc-required")
  have=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
  [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" = "$need" ] ||
    fail "the carried libraries (Debian 12's) need glibc >= $need; this machine has $have"
  # Runtime libraries the machine has itself (libssl, zlib, ...) stay its
  # own; the carried ones fill in only what it lacks.
  mkdir -p "$work/lib"
  for lib in "$usr"/lib/x86_64-linux-gnu/*.so.*; do
    name=$(basename "$lib")
    ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*$name " || ln -s "$lib" "$work/lib/$name"
  done
  build_env=(env "LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  # The built programs, though, load OpenSSL as one pair, the carried one
  # (what the carried gRPC was built against), first in the loader's path:
  # their RUNPATH names the carried folder, which gave them the carried
  # libcrypto (3.0) while the carried gRPC's libssl came from the machine
  # (Debian 13's 3.5, which needs a libcrypto >= 3.3). The build tools keep
  # the machine's pair (cmake's libcurl may need the newer one).
  mkdir -p "$work/pair"
  for name in libssl.so.3 libcrypto.so.3; do
    [ -e "$usr/lib/x86_64-linux-gnu/$name" ] || fail "the carry has no $name: run tests/gpu/make_carry.sh again"
    ln -s "$usr/lib/x86_64-linux-gnu/$name" "$work/pair/$name"
  done
  carry_env=(env "LD_LIBRARY_PATH=$work/pair:$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  export PATH=$usr/bin:$PATH
  export PKG_CONFIG_LIBDIR=$usr/lib/x86_64-linux-gnu/pkgconfig:$usr/share/pkgconfig
  cmake_prefix=("$usr")
  # Multiarch headers (OpenSSL's opensslconf.h) that a compiler finds only
  # under its own /usr/include/<triplet>.
  carry_flags="-isystem $usr/include/x86_64-linux-gnu"
  echo "carried: $(wc -l <"$CARRY/packages") Debian packages from $CARRY (glibc $have >= $need)"
fi
if [ -n "${DATA_DIR:-}" ]; then
  DATA=$DATA_DIR
elif [ -f "$root/data/mnist/train-images-idx3-ubyte" ]; then
  DATA=$root/data/mnist
elif [ -f "$CARRY/mnist/train-images-idx3-ubyte.gz" ]; then
  DATA=$work/mnist
  mkdir -p "$DATA"
  for f in "$CARRY"/mnist/*.gz; do gunzip -c "$f" >"$DATA/$(basename "$f" .gz)"; done
else
  fail "no MNIST: run scripts/setup.sh, set DATA_DIR, or carry tests/gpu/make_carry.sh's folder"
fi
[ -f "$DATA/train-images-idx3-ubyte" ] || fail "no MNIST in $DATA"

if [ -n "${LIBTORCH_DIR:-}" ]; then
  torch_prefix=$LIBTORCH_DIR
else
  torch_prefix=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)') ||
    fail "$PYTHON cannot import torch; install a CUDA PyTorch or set LIBTORCH_DIR"
  cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')
  [ -n "$cuda" ] || [ -n "${CPU_ONLY:-}${PREPARE_ONLY:-}" ] ||
    fail "the PyTorch of $PYTHON has no CUDA"
  abi=$("$PYTHON" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  # gRPC, absl and spdlog from Debian use the C++11 ABI; so must LibTorch.
  [ "$abi" = 1 ] || fail "this PyTorch uses the pre-C++11 ABI and cannot link \
with Debian's gRPC/absl; use PyTorch >= 2.7 or a cxx11-abi LibTorch via LIBTORCH_DIR"
fi
# pip's NCCL keeps nccl.h in its Python package (nvidia/nccl/include).
nccl_include=$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null || true)
# PREPARE_ONLY=1: configure and build only; CPU_ONLY=1: the steps that need
# no CUDA (tests/gpu/test_carry.sh, on a machine without GPU).
prepare_only=${PREPARE_ONLY:-}
cpu_only=${CPU_ONLY:-}
[ -n "$prepare_only$cpu_only" ] || command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  fail "LibTorch's CMake config needs the CUDA toolkit (nvcc); install it under /usr/local/cuda"
export PATH=$PATH:/usr/local/cuda/bin

step "build against $torch_prefix"
prefix_path=$(IFS=';'; echo "$torch_prefix${cmake_prefix[*]:+;${cmake_prefix[*]}}")
"${build_env[@]}" timeout 120 cmake -G Ninja -S "$root" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix_path" -DDDPRUN_BUILD_TESTS=ON \
  -DCMAKE_CXX_FLAGS="$carry_flags" -DCMAKE_C_FLAGS="$carry_flags" \
  ${nccl_include:+-DDDPRUN_NCCL_INCLUDE_DIR="$nccl_include"} >"$work/cmake.log" 2>&1 ||
  { tail -30 "$work/cmake.log"; fail "cmake"; }
[ -n "$prepare_only$cpu_only" ] || grep -q 'nccl_group.cc' "$BUILD/build.ninja" ||
  fail "configured without NCCL: this LibTorch has no torch_cuda target"
build_limit=${BUILD_LIMIT:-300}
"${build_env[@]}" timeout "$build_limit" ninja -C "$BUILD" ${JOBS:+-j "$JOBS"} \
  ddprun-mnist ddprun-rendezvous pg_helper >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; fail "build (or over $build_limit s)"; }
mnist=$BUILD/mnist/ddprun-mnist
helper=$BUILD/tests/worker/pg_helper
if [ -n "$prepare_only" ]; then
  "${carry_env[@]}" "$mnist" --help >/dev/null || fail "the built ddprun-mnist does not start"
  "${carry_env[@]}" "$BUILD/rendezvous/ddprun-rendezvous" --help >/dev/null ||
    fail "the built ddprun-rendezvous does not start"
  step "built and started (PREPARE_ONLY: no GPU step)"
  exit 0
fi

# --- the GPU steps ---------------------------------------------------------------
backend=nccl
if [ -n "$cpu_only" ]; then
  backend=gloo gpus=1
  echo "CPU_ONLY: Gloo in a world of one; the CUDA steps (2, 4) are skipped"
else
  command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this needs an NVIDIA GPU"
  gpus=$(nvidia-smi -L | grep -c '^GPU' || true)
  [ "$gpus" -ge 1 ] || fail "no GPU visible (nvidia-smi -L lists none)"
  echo "$(nvidia-smi -L | head -n 1), $gpus GPU(s)"
fi

# A rendezvous server for the ranks' store; its first line names the port.
"${carry_env[@]}" "$BUILD/rendezvous/ddprun-rendezvous" --port 0 >"$work/rdzv.out" 2>"$work/rdzv.err" &
pids+=($!)
for _ in $(seq 100); do grep -q 'listening on' "$work/rdzv.out" && break; sleep 0.1; done
endpoint=$(sed -n 's/^ddprun-rendezvous listening on //p' "$work/rdzv.out" | head -1)
[ -n "$endpoint" ] || fail "ddprun-rendezvous did not start: $(cat "$work/rdzv.err")"

# run_ranks N RUN LIMIT CMD...: ranks 0..N-1 of job RUN with ddprun's
# environment, one GPU each; waits for all (each bounded by LIMIT seconds).
run_ranks() {
  local n=$1 run=$2 limit=$3; shift 3
  local rank ranks=()
  for rank in $(seq 0 $((n - 1))); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n \
      DDPRUN_STORE_ENDPOINT=$endpoint DDPRUN_STORE_RUN_ID=$run DDPRUN_ROUND=0 \
      DDPRUN_LOCAL_ADDR=127.0.0.1 OMP_NUM_THREADS=1 \
      "${carry_env[@]}" timeout "$limit" "$@" >"$work/$run.$rank.out" 2>"$work/$run.$rank.err" &
    ranks+=($!)
  done
  local status=0
  for rank in "${!ranks[@]}"; do
    wait "${ranks[$rank]}" || { status=1; echo "rank $rank of $run failed:"; tail -20 "$work/$run.$rank.err"; }
  done
  return $status
}

# compare A.pt B.pt TOLERANCE: the largest parameter difference.
compare() {
  "$PYTHON" - "$@" <<'PY'
import sys, torch
load = lambda p: torch.load(p, map_location="cpu", weights_only=False)
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys(), (a.keys(), b.keys())
worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
print(f"max parameter difference {worst:.3g} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}

# summary FILE MIN-ACCURACY: prints samples/s and accuracy, checks the latter.
summary() {
  "$PYTHON" - "$@" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['samples_per_sec']:.0f} samples/s, test accuracy {100 * s['test_accuracy']:.2f} %")
sys.exit(0 if s["test_accuracy"] > float(sys.argv[2]) else 1)
PY
}

step "1. $backend, $gpus rank(s), one per GPU, through the gRPC store"
PG_HELPER_BACKEND=$backend PG_HELPER_EXPECT_STORE=1 run_ranks "$gpus" nccl-pg 120 "$helper" ||
  fail "$backend through the gRPC store"
cat "$work"/nccl-pg.*.out

common=(--data-dir "$DATA" --epochs 100 --max-steps 20 --train-limit 2048
        --test-limit 1000 --seed 3 --lr 0.05 --no-progress)
step "2. DDP equivalence on CUDA"
if [ -n "$cpu_only" ]; then
  echo "skipped (CPU_ONLY)"
elif [ "$gpus" -ge 2 ]; then
  n=2
  for m in 8 4; do [ "$gpus" -ge "$m" ] && { n=$m; break; }; done
  "${carry_env[@]}" timeout 120 "$mnist" "${common[@]}" --backend nccl --batch-size 64 \
    --save "$work/one.pt" >"$work/one.log" 2>&1 || { tail "$work/one.log"; fail "one process on CUDA"; }
  run_ranks "$n" nccl-ddp 120 "$mnist" "${common[@]}" --backend nccl --batch-size $((64 / n)) \
    --bucket-mb 0.05 --save "$work/many.pt" || fail "$n ranks on CUDA"
  compare "$work/one.pt" "$work/many.pt" 1e-5 || fail "$n CUDA ranks differ from one process"
else
  "${carry_env[@]}" timeout 120 "$mnist" "${common[@]}" --backend nccl --save "$work/cuda.pt" \
    >"$work/cuda.log" 2>&1 || { tail "$work/cuda.log"; fail "CUDA run"; }
  "${carry_env[@]}" timeout 120 "$mnist" "${common[@]}" --backend gloo --save "$work/cpu.pt" \
    >"$work/cpu.log" 2>&1 || { tail "$work/cpu.log"; fail "CPU run"; }
  compare "$work/cuda.pt" "$work/cpu.pt" 1e-4 || fail "CUDA differs from CPU"
fi

step "3. one full MNIST epoch on $gpus GPU(s)"
run_ranks "$gpus" nccl-epoch "${EPOCH_LIMIT:-120}" "$mnist" --data-dir "$DATA" --epochs 1 --backend "$backend" \
  --no-progress --save "" --summary-json "$work/epoch.json" || fail "one epoch"
summary "$work/epoch.json" 0.85 || fail "accuracy after one epoch"

step "4. the seed's run (10 epochs) on $gpus GPU(s)"
if [ -n "$cpu_only" ]; then
  echo "skipped (CPU_ONLY)"
  step "tests/gpu/run.sh: all checks but the CUDA ones passed (CPU_ONLY)"
  exit 0
fi
run_ranks "$gpus" nccl-seed 240 "$mnist" --data-dir "$DATA" --backend nccl \
  --no-progress --save "" --summary-json "$work/seed.json" || fail "10 epochs"
summary "$work/seed.json" 0.92 || fail "accuracy after 10 epochs"
step "tests/gpu/run.sh: all GPU checks passed"
