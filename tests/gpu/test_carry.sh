#!/usr/bin/env bash
# Checks tests/gpu/run.sh and tests/gpu/make_carry.sh's folder where no GPU
# is, in a Debian 13 root made like the GPU image: a compiler, CMake, ninja
# and a Python whose torch package holds LibTorch (Debian's python3-torch
# 2.6, its CMake config reached through torch.utils.cmake_prefix_path as in
# PyTorch's wheels, with the headers a wheel ships, Gloo's included), but
# none of gRPC, protobuf's headers and compilers, absl, spdlog, CLI11,
# GoogleTest, cpp-httplib, OpenSSL's or zlib's headers or pkg-config.
# tests/gpu/run.sh then builds ddprun-mnist, ddprun-rendezvous and pg_helper
# from the carried folder alone and runs every step that needs no CUDA
# (CPU_ONLY=1: the store path forced in a world of one, on Gloo; one MNIST
# epoch). The root is cached under DDPRUN_CI_CACHE (/var/cache/ddprun-ci).
#   tests/gpu/test_carry.sh [CARRY]      (root; CARRY: build-gpu-carry)
# Env: PREPARE_ONLY=1 stops after the build; JOBS: ninja's parallelism [2].
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
carry=$(realpath "${1:-$src/build-gpu-carry}")
cache=${DDPRUN_CI_CACHE:-/var/cache/ddprun-ci}
r=$cache/trixie-carry
fail() { echo "tests/gpu/test_carry.sh: FAIL: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "debootstrap and chroot need root"
[[ -f $carry/packages ]] || fail "no carried folder in $carry: run tests/gpu/make_carry.sh"
if [[ -z ${DDPRUN_CI_IN_NAMESPACE:-} ]]; then
  exec unshare --mount --propagation private \
    env DDPRUN_CI_IN_NAMESPACE=1 bash "${BASH_SOURCE[0]}" "$carry"
fi
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)\/*$/\1/p' \
  /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
mirror=${mirror:-http://deb.debian.org/debian}
in_root() {
  chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    DEBIAN_FRONTEND=noninteractive "$@"
}
mkdir -p "$cache/logs" "$cache/debootstrap"
log=$cache/logs/trixie-carry.log
# What the GPU image has that matters here; the rest is the carry's.
# libtorch-dev and libgloo-dev: the headers and CMake config a wheel ships.
packages="build-essential cmake ninja-build python3-torch libtorch-dev libgloo-dev"
removed="libprotobuf-dev protobuf-compiler libssl-dev zlib1g-dev pkgconf pkgconf-bin pkg-config"
stamp="trixie | $packages | $removed"
if [[ $(cat "$r/etc/ddprun-carry-root" 2>/dev/null) != "$stamp" ]]; then
  rm -rf --one-file-system "$r"
  echo "making $r (debootstrap trixie, then $packages)" >&2
  debootstrap --variant=minbase --cache-dir="$cache/debootstrap" trixie "$r" "$mirror" \
    >"$log" 2>&1 || { tail "$log"; fail debootstrap; }
  printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
  chmod +x "$r/usr/sbin/policy-rc.d"
  cp /etc/resolv.conf "$r/etc/resolv.conf"
  mount -t proc proc "$r/proc"
  in_root apt-get update -qq
  # shellcheck disable=SC2086
  in_root apt-get install -y -qq --no-install-recommends $packages >>"$log" 2>&1 ||
    { tail "$log"; fail "apt-get install $packages"; }
  # Headers, compilers and tools the carry brings; libtorch-dev pulls some in.
  # Some of them may not be installed at all (dpkg then says so and fails);
  # what counts is that none is left.
  # shellcheck disable=SC2086
  in_root dpkg --purge --force-depends $removed >>"$log" 2>&1 || true
  for pkg in $removed; do
    if in_root dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
      fail "$pkg is still installed in $r after dpkg --purge (see $log)"
    fi
  done
  in_root apt-get clean
  umount "$r/proc"
  echo "$stamp" >"$r/etc/ddprun-carry-root"
fi
for pkg in libgrpc++-dev libabsl-dev libspdlog-dev libcli11-dev libgtest-dev \
           libprotobuf-dev protobuf-compiler libcpp-httplib-dev pkgconf; do
  ! in_root dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok' ||
    fail "$pkg is installed in $r: the check would not test the carry"
done
mkdir -p "$r/proc" "$r/src" "$r/carry"
mount -t proc proc "$r/proc"
# A wheel keeps LibTorch's CMake config under the package, where
# torch.utils.cmake_prefix_path points: a config there that includes
# Debian's (which finds its files relative to where it lies).
prefix=$(in_root python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null |
  tail -n 1)
[[ $prefix == /* ]] || fail "python3 -c 'import torch' in $r: no cmake_prefix_path"
rm -rf "$r$prefix/Torch"
mkdir -p "$r$prefix/Torch"
echo 'include("/usr/lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake")' \
  >"$r$prefix/Torch/TorchConfig.cmake"
mount --bind "$src" "$r/src"
mount --bind "$carry" "$r/carry"
mode=CPU_ONLY=1
[[ -z ${PREPARE_ONLY:-} ]] || mode=PREPARE_ONLY=1
# No DATA_DIR and no data/mnist in the root's view of the source when it is
# a link outside it: MNIST then comes from the carry, as on the device.
start=$SECONDS status=0
nice chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  CARRY_DIR=/carry "$mode" BUILD_DIR=/build-gpu \
  JOBS="${JOBS:-2}" TIME_LIMIT=3600 BUILD_LIMIT=3000 EPOCH_LIMIT=900 \
  bash /src/tests/gpu/run.sh >"$cache/logs/test-carry.log" 2>&1 || status=$?
tail -n 40 "$cache/logs/test-carry.log"
echo "tests/gpu/run.sh $mode in $r: status $status, $((SECONDS - start)) s"
exit "$status"
