#!/usr/bin/env bash
# ddprun against LibTorch 2.6, in Debian 13 (trixie) roots made with
# debootstrap and cached on this machine:
#   cpu   the README's test command (scripts/test.sh: setup.sh, the build,
#         every ctest test) with Debian 13's libtorch-dev 2.6 and
#         python3-torch 2.6;
#   cuda  the CUDA build compiled and linked, warnings as errors: libddp with
#         the NCCL seam (worker/nccl_group.cc), ddprun-mnist and what
#         tests/gpu/run.sh runs, against libtorch-cuda-dev 2.6 and NCCL. No GPU
#         here: nothing of it runs, and cuDNN (not in Debian) is a placeholder
#         package, its symbols left undefined (-Wl,--allow-shlib-undefined).
#
#   wheel the wheel built here (scripts/build-wheel.sh, from this checkout's
#         build/) tried as a new user would in the cpu root: Debian 13's
#         python3 and python3-torch 2.6, a fresh venv, pip install of the
#         wheel file, an unmodified env:// program at world 2 in torchrun's
#         launch forms, ddprun --version and status
#         (tests/deploy/wheel_user_test.sh). Nothing of this checkout is
#         mounted there: only the wheel and that test are copied in. Needs
#         the cpu root (run after the cpu stage).
#
#   scripts/test-debian13.sh [cpu] [cuda] [wheel]   (default: all; needs root)
#
# Each root is rebuilt only when its package list changes (the list's hash is
# kept in the root); the build folders and a ccache live in the cache too, so
# a warm run only rebuilds what changed. Settings (environment):
#   DDPRUN_CI_CACHE   the cache folder [/var/cache/ddprun-ci]
#   DDPRUN_CI_MIRROR  the Debian mirror [the machine's apt source]
#   DDPRUN_CI_CCACHE  the ccache of the builds [$DDPRUN_CI_CACHE/ccache]; an
#                     empty folder times a build with a cold cache
#   DDPRUN_TEST_JOBS  ctest's parallelism in the cpu root [2]
#   DDPRUN_BUILD_JOBS ninja's parallelism in the cpu root [3]
#   DDPRUN_CPU_BUILD_LIMIT, DDPRUN_CPU_TEST_LIMIT  the cpu stage's bounds on
#                     its build and its ctest, in seconds [3600, 2400]
#   DDPRUN_CI_CTEST_ARGS  more arguments for the cpu stage's ctest, e.g.
#                     "-R Gradient" to rerun some tests (CI sets none)
#   DDPRUN_CI_ROOTS_ONLY=1  make or update the roots, build and test nothing
#                     (how the README's cold figures time the roots alone)
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache=${DDPRUN_CI_CACHE:-/var/cache/ddprun-ci}
# Bump when the way a root is made changes (not its package list).
recipe=1

log() { printf '[debian13 %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
fail() { printf '[debian13] FAIL: %s\n' "$*" >&2; exit 1; }
# Runs "$@" under a time limit (seconds), showing the tail of its log on
# failure: a stage that hangs fails CI with a message instead of eating it.
bounded() {
  local limit=$1 what=$2 logfile=$3; shift 3
  local start=$SECONDS status=0
  $nice timeout --kill-after=30 "$limit" "$@" >"$logfile" 2>&1 || status=$?
  if ((status)); then
    tail -n 60 "$logfile" >&2
    ((status == 124 || status == 137)) &&
      fail "$what took longer than ${limit}s (log: $logfile)"
    fail "$what failed with status $status (log: $logfile)"
  fi
  log "$what: $((SECONDS - start)) s"
}

stages=("$@")
((${#stages[@]})) || stages=(cpu cuda wheel)
for s in "${stages[@]}"; do
  [[ $s == cpu || $s == cuda || $s == wheel ]] ||
    fail "unknown stage '$s': the stages are cpu, cuda and wheel"
done
[[ $(id -u) -eq 0 ]] || fail "debootstrap, chroot and mounts need root; run it as root"

# Mounts made below vanish with this process: they live in a private mount
# namespace, so an interrupted run leaves nothing mounted in the cache.
if [[ -z ${DDPRUN_CI_IN_NAMESPACE:-} ]]; then
  exec unshare --mount --propagation private \
    env DDPRUN_CI_IN_NAMESPACE=1 bash "${BASH_SOURCE[0]}" "${stages[@]}"
fi

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends debootstrap >/dev/null ||
    fail "could not install debootstrap (apt-get install debootstrap)"
fi
mirror=${DDPRUN_CI_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/*$/\1/p' \
  /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}

mkdir -p "$cache"/{logs,ccache,debs,debootstrap,builds}
ccache_dir=${DDPRUN_CI_CCACHE:-$cache/ccache}
mkdir -p "$ccache_dir"
# Every stage runs at niceness 10 (once: a caller that already runs us under
# nice is not lowered further, below other builds on the machine).
nice=""
(($(nice) >= 10)) || nice="nice -n $((10 - $(nice)))"

# MNIST: the tests read <source>/data/mnist (scripts/setup.sh on the host
# fetched and verified it). A link to a folder outside the source is mounted
# at the same path in the root.
data=$src/data/mnist
need_mnist() {  # the cpu and cuda stages; the wheel stage trains nothing of ours
  [[ -f $data/train-images-idx3-ubyte ]] ||
    fail "no MNIST in $data: run scripts/setup.sh (DDPRUN_SKIP_BUILD=1) first"
}
data_real=$(realpath -m "$data")

# --- the roots -----------------------------------------------------------------
# The packages of the cpu root: scripts/setup.sh's own list (it installs them
# in the root itself), and ccache.
cpu_packages() { "$src/scripts/setup.sh" --print-packages; echo ccache; }
# The CUDA LibTorch with NCCL, nvcc (LibTorch's CMake config requires it),
# the Gloo headers built for it, and the build dependencies of the worker
# and the rendezvous (what tests/gpu/run.sh builds).
cuda_packages() {
  printf '%s\n' build-essential cmake ninja-build pkg-config ccache \
    libtorch-cuda-dev libnccl-dev nvidia-cuda-dev nvidia-cuda-toolkit \
    libgloo-cuda-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev \
    protobuf-compiler libabsl-dev libspdlog-dev libgtest-dev libgmock-dev \
    libcli11-dev libcpp-httplib-dev zlib1g-dev
}

mounted=()
mount_in() {  # mount_in ROOT TARGET MOUNT-ARGS...
  local target=$1$2; shift 2
  mkdir -p "$target"
  mount "$@" "$target"
  mounted+=("$target")
}
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -l "${mounted[$i]}" 2>/dev/null || true
  done
  mounted=()
}
trap unmount_all EXIT

# The kernel's file systems, the source, MNIST, ccache and apt's download
# cache (kept across rebuilds of a root).
enter() {  # enter ROOT
  local r=$1
  # The root a mount point of its own: `ip netns exec` (the network-namespace
  # tests) remounts / and fails with EINVAL in a plain directory.
  mount_in "$r" "" --bind "$r"
  mount_in "$r" /proc -t proc proc
  mount_in "$r" /sys --rbind /sys
  mount_in "$r" /dev --rbind /dev
  mount_in "$r" /run -t tmpfs tmpfs
  mount_in "$r" /src --bind "$src"
  if [[ $data_real != "$data" ]]; then
    mount_in "$r" "$data_real" --bind "$data_real"
  fi
  mount_in "$r" /ccache --bind "$ccache_dir"
  mount_in "$r" /var/cache/apt/archives --bind "$cache/debs"
  mkdir -p "$cache/debs/partial"
  cp /etc/resolv.conf "$r/etc/resolv.conf"
  # The machine's host names too (a chroot shares its network and host
  # name): torchrun 2.x serves its store at this host's name.
  cp /etc/hosts "$r/etc/hosts"
  find "$r/tmp" -mindepth 1 -delete 2>/dev/null || true
}
# build_dir ROOT STAGE DIR: mounts this checkout's own build folder for
# STAGE at DIR in ROOT. Every checkout (keyed by its path) has its own folder
# under $cache/builds: ninja trusts modification times, and a folder shared
# by checkouts would take an older tree's sources for up to date against
# outputs made from a newer one (stale objects, generated proto headers, in
# the link). Inside the root the path is always DIR, so the compile commands
# are the same for every checkout and a new one hits the shared ccache.
# Folders of checkouts that are gone, and all but the $keep_builds last used
# per stage, are removed.
keep_builds=${DDPRUN_CI_KEEP_BUILDS:-3}
build_dir() {
  local r=$1 stage=$2 dir=$3 key folder f n=0
  key=$(printf '%s' "$src" | sha256sum | cut -c1-12)
  folder=$cache/builds/$stage-$key
  mkdir -p "$folder"
  printf '%s\n' "$src" >"$folder/.ddprun-source"  # also its last use (mtime)
  # A root made before build folders moved out keeps one inside: drop it
  # (otherwise DIR is the empty mount point).
  if ! mountpoint -q "$r$dir"; then rm -rf --one-file-system "${r:?}$dir"; fi
  while IFS= read -r f; do
    f=${f%/.ddprun-source}
    [[ $f == "$folder" ]] && continue
    if [[ ! -d $(cat "$f/.ddprun-source") ]] || ((++n >= keep_builds)); then
      log "$stage: removing the build folder of $(cat "$f/.ddprun-source") ($f)"
      rm -rf --one-file-system "$f"
    fi
  done < <(ls -1t "$cache/builds/$stage"-*/.ddprun-source 2>/dev/null)
  mount_in "$r" "$dir" --bind "$folder"
  log "$stage: build folder $folder (for $src) at $dir"
}

# no_warnings STAGE LOG: the build printed no compiler warning.
no_warnings() {
  if grep -q 'warning:' "$2"; then
    grep -m 5 'warning:' "$2" >&2
    fail "$1: the build printed warnings (log: $2)"
  fi
}

# in_root ROOT COMMAND...: COMMAND in ROOT with a clean environment. As an
# array too (root_cmd ROOT sets it), for commands run under `bounded`.
root_cmd() {
  cmd=(chroot "$1" /usr/bin/env -i
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    HOME=/root LANG=C.UTF-8 CI="${CI:-}" DEBIAN_FRONTEND=noninteractive
    CCACHE_DIR=/ccache CCACHE_MAXSIZE=10G
    CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
    CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache)
}
in_root() { local cmd; root_cmd "$1"; shift; "${cmd[@]}" "$@"; }

# ensure_root NAME LIST-FUNCTION INSTALL-FUNCTION: $cache/NAME is a root
# whose package list hashes as the list does now. A list that only grew is
# installed into the cached root (INSTALL-FUNCTION is idempotent: it installs
# what is missing); one that lost packages, a new recipe or no root at all
# makes the root again from debootstrap.
ensure_root() {
  local name=$1 list_fn=$2 install_fn=$3
  local r=$cache/$name
  local list want
  list=$("$list_fn" | LC_ALL=C sort -u) || fail "could not list the packages of $name"
  want=$(printf 'recipe %s\n%s\n' "$recipe" "$list" | sha256sum | cut -d' ' -f1)
  if [[ -f $r/etc/ddprun-ci/packages.sha256 &&
        $(cat "$r/etc/ddprun-ci/packages.sha256") == "$want" ]]; then
    log "$name: root up to date ($r)"
    return
  fi
  # Roots made before the recipe was recorded were made by recipe 1.
  local had_recipe added removed
  had_recipe=$(cat "$r/etc/ddprun-ci/recipe" 2>/dev/null || echo 1)
  if [[ -f $r/etc/ddprun-ci/packages && $had_recipe == "$recipe" ]]; then
    added=$(LC_ALL=C comm -13 <(LC_ALL=C sort -u "$r/etc/ddprun-ci/packages") <(printf '%s\n' "$list"))
    removed=$(LC_ALL=C comm -23 <(LC_ALL=C sort -u "$r/etc/ddprun-ci/packages") <(printf '%s\n' "$list"))
    if [[ -z $removed ]]; then
      if [[ -n $added ]]; then
        log "$name: installing the packages added to its list: $(echo $added)"
        enter "$r"
        local cmd; root_cmd "$r"
        bounded 1200 "$name: apt-get update" "$cache/logs/$name-update.log" \
          "${cmd[@]}" apt-get update
        "$install_fn" "$r"
        in_root "$r" apt-get clean
        unmount_all
      fi
      record_root "$r" "$list" "$want"
      log "$name: root up to date ($r)"
      return
    fi
  fi
  log "$name: making the root (it is new, or its recipe changed, or packages left its list)"
  local new=$r.new
  rm -rf --one-file-system "$new"
  bounded 1200 "$name: debootstrap trixie from $mirror" "$cache/logs/$name-debootstrap.log" \
    debootstrap --variant=minbase --components=main,contrib,non-free \
      --cache-dir="$cache/debootstrap" trixie "$new" "$mirror"
  # No daemon starts in the root while packages install.
  printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"
  chmod +x "$new/usr/sbin/policy-rc.d"
  echo "deb $mirror trixie main contrib non-free" >"$new/etc/apt/sources.list"
  enter "$new"
  local cmd; root_cmd "$new"
  bounded 1200 "$name: apt-get update" "$cache/logs/$name-update.log" \
    "${cmd[@]}" apt-get update
  "$install_fn" "$new"
  in_root "$new" apt-get clean
  unmount_all
  record_root "$new" "$list" "$want"
  rm -rf --one-file-system "$r"
  mv "$new" "$r"
}
record_root() {  # record_root ROOT LIST HASH
  mkdir -p "$1/etc/ddprun-ci"
  printf '%s\n' "$2" >"$1/etc/ddprun-ci/packages"
  echo "$recipe" >"$1/etc/ddprun-ci/recipe"
  echo "$3" >"$1/etc/ddprun-ci/packages.sha256"
}

install_cpu() {  # scripts/setup.sh installs its own list, OpenBLAS switched in
  local cmd; root_cmd "$1"
  bounded 1800 "cpu: scripts/setup.sh (packages)" "$cache/logs/cpu-setup.log" \
    "${cmd[@]}" DDPRUN_SKIP_BUILD=1 /src/scripts/setup.sh
  bounded 600 "cpu: ccache" "$cache/logs/cpu-ccache.log" \
    "${cmd[@]}" apt-get install -y --no-install-recommends ccache
}

install_cuda() {
  local r=$1
  # libtorch-cuda-2.6 depends on nvidia-cudnn, an installer that downloads
  # cuDNN from NVIDIA at install time; a placeholder of that name stands in.
  local pkg=$r/tmp/nvidia-cudnn
  mkdir -p "$pkg/DEBIAN"
  cat >"$pkg/DEBIAN/control" <<'EOF'
Package: nvidia-cudnn
Version: 99:0+ddprun.placeholder
Architecture: all
Maintainer: ddprun CI <ci@ddprun.invalid>
Description: placeholder for ddprun's compile-and-link check (no cuDNN)
EOF
  dpkg-deb --root-owner-group --build "$pkg" "$r/tmp/nvidia-cudnn.deb" >/dev/null
  in_root "$r" dpkg -i /tmp/nvidia-cudnn.deb >/dev/null
  local packages cmd
  root_cmd "$r"
  mapfile -t packages < <(cuda_packages)
  bounded 2400 "cuda: apt-get install (${#packages[@]} packages, ~2.6 GB)" \
    "$cache/logs/cuda-install.log" \
    "${cmd[@]}" apt-get install -y --no-install-recommends "${packages[@]}"
}

# --- one Gloo per process ---------------------------------------------------------
# check_one_gloo ROOT STAGE BINARY...: each program holds exactly one Gloo,
# LibTorch's: it defines no Gloo code of its own (header inlines aside) and
# the libgloo* libraries it loads all come from one Debian package (libgloo0
# beside the CPU LibTorch, libgloo-cuda-0 beside the CUDA one).
check_one_gloo() {
  local r=$1 stage=$2 bin own libs lib owners; shift 2
  local seen=()
  for bin; do
    own=$(in_root "$r" nm -C --defined-only "$bin" | grep -c ' [TDBR] gloo::' || true)
    ((own == 0)) || fail "$stage: $bin defines $own Gloo symbols of its own beside LibTorch's Gloo"
    libs=$(in_root "$r" ldd "$bin" | awk '/libgloo/ {print $3}')
    [[ -n $libs ]] || fail "$stage: $bin loads no libgloo, yet Debian's LibTorch links it"
    owners=$(for lib in $libs; do
      in_root "$r" dpkg -S "$(in_root "$r" realpath "$lib")" | cut -d: -f1
    done | sort -u)
    [[ $(wc -l <<<"$owners") -eq 1 ]] ||
      fail "$stage: $bin loads Gloo from several packages: $(echo $owners)"
    seen+=("$owners")
  done
  log "$stage: one Gloo per process ($(printf '%s\n' "${seen[@]}" | sort -u | paste -sd' ' -)) in $(printf '%s ' "${@##*/}")"
}

# --- cpu: the whole suite against LibTorch 2.6 ----------------------------------
# The README's test command, in stages with a bound each: setup.sh (finds
# every package installed and MNIST verified), configure, build what ctest
# runs, ctest. The build folder (/build) stays in the root and the compiler
# runs under ccache with its cache in $cache/ccache: the source is always at
# /src and the build at /build, so a fresh clone's build hits the cache.
run_cpu() {
  need_mnist
  ensure_root trixie-cpu cpu_packages install_cpu
  [[ -z ${DDPRUN_CI_ROOTS_ONLY:-} ]] || return 0
  local r=$cache/trixie-cpu b=/build
  enter "$r"
  log "cpu: $(in_root "$r" dpkg-query -W -f='libtorch-dev ${Version}, ' libtorch-dev)$(in_root "$r" dpkg-query -W -f='python3-torch ${Version}' python3-torch)"
  local cmd
  root_cmd "$r"
  bounded 600 "cpu: scripts/setup.sh (packages, MNIST)" "$cache/logs/cpu-setup-check.log" \
    "${cmd[@]}" DDPRUN_SKIP_BUILD=1 /src/scripts/setup.sh
  # Optimised (-O1, asserts kept) without debug information: the build is most of a
  # cold run's time, and the C++ the tests exercise is the same. Warnings
  # are errors, as in the cuda stage.
  build_dir "$r" cpu "$b"
  bounded 600 "cpu: configure" "$cache/logs/cpu-configure.log" \
    "${cmd[@]}" cmake -S /src -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DCMAKE_C_FLAGS_RELEASE=-O1 \
      -DCMAKE_CXX_FLAGS=-Werror -DCMAKE_C_FLAGS=-Werror
  # Everything `all` builds except the benchmarks, which no test runs: the
  # folders' `all` targets expanded, bench/ left out.
  local targets=() queue=(all) t
  while ((${#queue[@]})); do
    t=${queue[0]}; queue=("${queue[@]:1}")
    case $t in
      bench/*) ;;
      all | */all)
        mapfile -t -O "${#queue[@]}" queue < <(in_root "$r" ninja -C "$b" -t query "$t" |
          awk '/^  input:/ {on = 1; next} /^  [a-z]/ {on = 0} on {print $NF}') ;;
      *) targets+=("$t") ;;
    esac
  done
  ((${#targets[@]})) || fail "cpu: ninja listed nothing under the target all"
  in_root "$r" ccache -z >/dev/null
  # -Werror stays out of ccache's hash (objects cached by a build without it
  # serve), so an object replayed from the cache fails by its warnings,
  # which ccache prints again, in the log.
  bounded "${DDPRUN_CPU_BUILD_LIMIT:-3600}" "cpu: build (${#targets[@]} targets, benchmarks left out, -Werror)" "$cache/logs/cpu-build.log" \
    "${cmd[@]}" CCACHE_IGNOREOPTIONS=-Werror \
    ninja -C "$b" -j "${DDPRUN_BUILD_JOBS:-3}" "${targets[@]}"
  no_warnings cpu "$cache/logs/cpu-build.log"
  check_one_gloo "$r" cpu "$b/mnist/ddprun-mnist" "$b/tests/worker/pg_helper" \
    "$b/tests/worker/worker_store_test"
  log "cpu: ccache: $(in_root "$r" ccache -s | grep -E '^ *(Hits|Misses):' | tr -s ' ' | paste -sd, -)"
  # ctest's own output goes to the console (and the log): which tests ran,
  # passed and failed is CI's record. scripts/run-ctest.sh (as
  # scripts/test.sh runs it) fails when fewer tests ran than are registered
  # and, CI=true being passed into the root, when any test skipped.
  local status=0
  $nice timeout --kill-after=60 "${DDPRUN_CPU_TEST_LIMIT:-2400}" "${cmd[@]}" \
    /src/scripts/run-ctest.sh "$b" --output-on-failure -j "${DDPRUN_TEST_JOBS:-2}" \
    ${DDPRUN_CI_CTEST_ARGS:-} 2>&1 | tee "$cache/logs/cpu-ctest.log" || status=${PIPESTATUS[0]}
  unmount_all
  ((status != 124 && status != 137)) || fail "cpu: ctest took over ${DDPRUN_CPU_TEST_LIMIT:-2400} s"
  ((status == 0)) || fail "cpu: ctest in the Debian 13 root failed (status $status; see above)"
  # Belt and braces: ctest marks a skipped test "***Skipped" and one it
  # could not run "***Not Run"; neither may happen in CI.
  ! grep -qE '\*\*\*(Skipped|Not Run)' "$cache/logs/cpu-ctest.log" ||
    fail "cpu: ctest skipped tests (see $cache/logs/cpu-ctest.log)"
  log "cpu: $(grep -m1 'tests passed' "$cache/logs/cpu-ctest.log");" \
    "$(grep -m1 -o 'ran [0-9]* of [0-9]* registered tests, [0-9]* skipped' "$cache/logs/cpu-ctest.log")"
}

# --- cuda: compile and link against the CUDA LibTorch 2.6 and NCCL -------------
run_cuda() {
  need_mnist
  ensure_root trixie-cuda cuda_packages install_cuda
  [[ -z ${DDPRUN_CI_ROOTS_ONLY:-} ]] || return 0
  local r=$cache/trixie-cuda
  enter "$r"
  log "cuda: $(in_root "$r" dpkg-query -W -f='libtorch-cuda-dev ${Version}, ' libtorch-cuda-dev)$(in_root "$r" dpkg-query -W -f='libnccl-dev ${Version}' libnccl-dev)"
  local b=/build-cuda cmd
  root_cmd "$r"
  build_dir "$r" cuda "$b"
  # The programs' static link is the cpu stage's to check (this root has no
  # libzstd.a, which Debian 13's libcrypto.a needs); here they link shared.
  bounded 1200 "cuda: configure" "$cache/logs/cuda-configure.log" \
    "${cmd[@]}" cmake -S /src -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS=-Werror -DDDPRUN_STATIC_TOOLS=OFF \
      "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined" \
      "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--allow-shlib-undefined"
  grep -q 'nccl_group\.cc\.o' "$r$b/build.ninja" ||
    fail "cuda: configured without worker/nccl_group.cc (no torch_cuda target?); see $cache/logs/cuda-configure.log"
  bounded 2400 "cuda: build (-Werror)" "$cache/logs/cuda-build.log" \
    "${cmd[@]}" cmake --build "$b" -j 2 --target libddp ddprun-mnist ddprun-rendezvous pg_helper
  no_warnings cuda "$cache/logs/cuda-build.log"
  local needed
  needed=$(in_root "$r" readelf -d "$b/mnist/ddprun-mnist")
  grep -q 'libtorch_cuda\.so' <<<"$needed" ||
    fail "cuda: ddprun-mnist does not link libtorch_cuda.so"
  check_one_gloo "$r" cuda "$b/mnist/ddprun-mnist" "$b/tests/worker/pg_helper"
  unmount_all
  log "cuda: libddp (nccl_group.cc), ddprun-mnist, ddprun-rendezvous and pg_helper compiled and linked"
}

# --- wheel: the Debian 12 wheel, pip-installed in Debian 13 --------------------
run_wheel() {
  local r=$cache/trixie-cpu
  [[ -f $r/etc/ddprun-ci/packages ]] ||
    fail "wheel: no cpu root in $r; run the cpu stage first (or DDPRUN_CI_ROOTS_ONLY=1 ... cpu)"
  [[ -z ${DDPRUN_CI_ROOTS_ONLY:-} ]] || return 0
  local out=$cache/wheel-$$
  rm -rf "$out"
  bounded 1200 "wheel: scripts/build-wheel.sh (here, Debian 12)" "$cache/logs/wheel-build.log" \
    env DDPRUN_BUILD_DIR="${DDPRUN_BUILD_DIR:-$src/build}" "$src/scripts/build-wheel.sh" --out "$out"
  # The root as a new user's machine: the kernel's file systems, the wheel
  # and its test; no source, build folder or ccache of ours.
  mount_in "$r" "" --bind "$r"
  mount_in "$r" /proc -t proc proc
  mount_in "$r" /sys --rbind /sys
  mount_in "$r" /dev --rbind /dev
  mount_in "$r" /run -t tmpfs tmpfs
  mount_in "$r" /user -t tmpfs tmpfs
  cp /etc/resolv.conf /etc/hosts "$r/etc/"
  find "$r/tmp" -mindepth 1 -delete 2>/dev/null || true
  mkdir -p "$r/user/wheel"
  cp "$out"/ddprun-*.whl "$src/tests/deploy/wheel_user_test.sh" "$r/user/"
  cp "$src/tests/deploy/wheel/first_step.py" "$r/user/wheel/"
  rm -rf "$out"
  ! mountpoint -q "$r/src" || fail "wheel: the source is mounted in the root"
  local cmd
  root_cmd "$r"
  # python3-venv joined scripts/setup.sh's list with this stage; a root
  # recorded before that lacks it.
  if ! in_root "$r" dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q 'ok installed'; then
    bounded 600 "wheel: apt-get install python3-venv" "$cache/logs/wheel-venv.log" \
      "${cmd[@]}" sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv && apt-get clean'
  fi
  log "wheel: $(in_root "$r" python3 --version), $(in_root "$r" dpkg-query -W -f='python3-torch ${Version}' python3-torch), $(in_root "$r" ldd --version | head -n 1)"
  bounded 600 "wheel: pip install and world-2 jobs in Debian 13" "$cache/logs/wheel-user.log" \
    "${cmd[@]}" sh -c 'bash /user/wheel_user_test.sh /user/ddprun-*.whl /usr/bin/python3'
  grep '^\[wheel-user\]' "$cache/logs/wheel-user.log" | sed 's/^/  /' >&2
  unmount_all
}

# The stages, in a function read whole before it runs: editing this file
# while a run is under way does not change what that run does.
main() {
  local start=$SECONDS s t lock
  for s in "${stages[@]}"; do
    t=$SECONDS
    # One run of a stage at a time on this machine (they share its root).
    # (wheel uses the cpu root.)
    exec {lock}>"$cache/lock.${s/wheel/cpu}"
    flock -w 3600 "$lock" || fail "$s: another run holds $cache/lock.$s for over an hour"
    "run_$s"
    exec {lock}>&-
    log "$s: done in $((SECONDS - t)) s"
  done
  log "all stages passed in $((SECONDS - start)) s"
}
main; exit
