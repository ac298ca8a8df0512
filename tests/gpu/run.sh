#!/usr/bin/env bash
# GPU checks of libddp, for a machine with NVIDIA GPUs (CI has none: Debian's
# LibTorch has no CUDA, so there the NCCL path is compiled out).
#
# Builds the worker against a CUDA LibTorch -- the one inside an installed
# PyTorch (torch.utils.cmake_prefix_path), or LIBTORCH_DIR -- then checks:
#   1. ProcessGroupNCCL, one rank per GPU: world size 1 on GPU 0 (in-process
#      store), and with >= 2 GPUs one rank per GPU through the rendezvous's
#      gRPC store (the ncclUniqueId travels through it);
#   2. DDP equivalence on CUDA: with >= 2 GPUs, 2 ranks x batch 32 against
#      one process x batch 64 (1e-5); with one GPU, CUDA against CPU for the
#      same run (1e-4: different kernels);
#   3. one full MNIST epoch on the GPU(s), printing samples/s and accuracy.
# DirectAllreduce (CPU) is built off: PyTorch's wheels keep their own Gloo,
# and a second copy from the system must not meet it in one process.
# Usage: tests/gpu/run.sh   (env: PYTHON, LIBTORCH_DIR, BUILD_DIR, DATA_DIR)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
PYTHON=${PYTHON:-python3}
BUILD=${BUILD_DIR:-$root/build-gpu}
DATA=${DATA_DIR:-$root/data/mnist}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "tests/gpu/run.sh: FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this needs an NVIDIA GPU"
gpus=$(nvidia-smi -L | grep -c '^GPU' || true)
[ "$gpus" -ge 1 ] || fail "no GPU visible (nvidia-smi -L lists none)"
[ -f "$DATA/train-images-idx3-ubyte" ] || fail "no MNIST in $DATA; run scripts/setup.sh or set DATA_DIR"

if [ -n "${LIBTORCH_DIR:-}" ]; then
  prefix=$LIBTORCH_DIR
else
  prefix=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)') ||
    fail "$PYTHON cannot import torch; install a CUDA PyTorch or set LIBTORCH_DIR"
  cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")')
  [ -n "$cuda" ] || fail "the PyTorch of $PYTHON has no CUDA"
  abi=$("$PYTHON" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  # gRPC, absl and spdlog from Debian use the C++11 ABI; so must LibTorch.
  [ "$abi" = 1 ] || fail "this PyTorch uses the pre-C++11 ABI and cannot link \
with Debian's gRPC/absl; use PyTorch >= 2.7 or a cxx11-abi LibTorch via LIBTORCH_DIR"
fi
nccl_include=$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "include"))' 2>/dev/null || true)
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  fail "LibTorch's CMake config needs the CUDA toolkit (nvcc); install it under /usr/local/cuda"
export PATH=$PATH:/usr/local/cuda/bin

step "build against $prefix ($gpus GPU(s))"
cmake -G Ninja -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DDDPRUN_BUILD_TESTS=ON \
  -DDDPRUN_GLOO_DIRECT=OFF \
  ${nccl_include:+-DDDPRUN_NCCL_INCLUDE_DIR="$nccl_include"} >"$work/cmake.log" 2>&1 ||
  { tail -30 "$work/cmake.log"; fail "cmake"; }
grep -q 'nccl_group.cc' "$BUILD/build.ninja" ||
  fail "configured without NCCL: this LibTorch has no torch_cuda target"
ninja -C "$BUILD" ddprun-mnist ddprun-rendezvous pg_helper >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log"; fail "build"; }
mnist=$BUILD/mnist/ddprun-mnist
helper=$BUILD/tests/worker/pg_helper

# A rendezvous server for the multi-rank runs; its first line names the port.
"$BUILD/rendezvous/ddprun-rendezvous" --port 0 >"$work/rdzv.out" 2>"$work/rdzv.err" &
pids+=($!)
for _ in $(seq 100); do grep -q 'listening on' "$work/rdzv.out" && break; sleep 0.1; done
endpoint=$(sed -n 's/^ddprun-rendezvous listening on //p' "$work/rdzv.out" | head -1)
[ -n "$endpoint" ] || fail "ddprun-rendezvous did not start: $(cat "$work/rdzv.err")"

# Runs "$@" as ranks 0..n-1 of job $run with ddprun's environment; waits for all.
run_ranks() {
  local n=$1 run=$2; shift 2
  local rank ranks=()
  for rank in $(seq 0 $((n - 1))); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n \
      DDPRUN_STORE_ENDPOINT=$endpoint DDPRUN_STORE_RUN_ID=$run DDPRUN_ROUND=0 \
      DDPRUN_LOCAL_ADDR=127.0.0.1 OMP_NUM_THREADS=1 \
      timeout 300 "$@" >"$work/$run.$rank.out" 2>"$work/$run.$rank.err" &
    ranks+=($!)
  done
  local status=0
  for rank in "${!ranks[@]}"; do
    wait "${ranks[$rank]}" || { status=1; echo "rank $rank of $run failed:"; cat "$work/$run.$rank.err"; }
  done
  return $status
}

compare() {  # compare A.pt B.pt TOLERANCE
  "$PYTHON" - "$@" <<'PY'
import sys, torch
a, b, tol = torch.load(sys.argv[1]), torch.load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys(), (a.keys(), b.keys())
worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
print(f"max parameter difference {worst:.3g} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}

step "1. NCCL, world size 1 on GPU 0"
PG_HELPER_BACKEND=nccl "$helper" || fail "NCCL world size 1"
if [ "$gpus" -ge 2 ]; then
  step "1b. NCCL, $gpus ranks, one per GPU, through the gRPC store"
  PG_HELPER_BACKEND=nccl run_ranks "$gpus" nccl-pg "$helper" || fail "NCCL $gpus ranks"
fi

common=(--data-dir "$DATA" --epochs 100 --max-steps 20 --train-limit 2048
        --test-limit 1000 --seed 3 --lr 0.05 --no-progress)
step "2. DDP equivalence on CUDA"
if [ "$gpus" -ge 2 ]; then
  "$mnist" "${common[@]}" --backend nccl --batch-size 64 --save "$work/one.pt" ||
    fail "one process on CUDA"
  run_ranks 2 nccl-ddp "$mnist" "${common[@]}" --backend nccl --batch-size 32 \
    --bucket-mb 0.05 --save "$work/two.pt" || fail "2 ranks on CUDA"
  compare "$work/one.pt" "$work/two.pt" 1e-5 || fail "2 CUDA ranks differ from one process"
else
  "$mnist" "${common[@]}" --backend nccl --save "$work/cuda.pt" || fail "CUDA run"
  "$mnist" "${common[@]}" --backend gloo --save "$work/cpu.pt" || fail "CPU run"
  compare "$work/cuda.pt" "$work/cpu.pt" 1e-4 || fail "CUDA differs from CPU"
fi

step "3. one full MNIST epoch on $gpus GPU(s)"
if [ "$gpus" -ge 2 ]; then
  run_ranks "$gpus" nccl-epoch "$mnist" --data-dir "$DATA" --epochs 1 --backend nccl \
    --no-progress --save "" --summary-json "$work/epoch.json" || fail "full epoch"
else
  "$mnist" --data-dir "$DATA" --epochs 1 --backend nccl --no-progress --save "" \
    --summary-json "$work/epoch.json" || fail "full epoch"
fi
cat "$work/epoch.json"
"$PYTHON" -c "import json,sys; s=json.load(open('$work/epoch.json')); \
print(f\"{s['samples_per_sec']:.0f} samples/s, test accuracy {100*s['test_accuracy']:.2f}%\"); \
sys.exit(0 if s['test_accuracy'] > 0.85 else 1)" || fail "accuracy after one epoch"
echo "tests/gpu/run.sh: all GPU checks passed"
