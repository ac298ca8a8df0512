#!/usr/bin/env bash
# Checks tests/gpu/make_carry.sh's folder where no GPU is: in a Debian 12
# root that has a compiler, CMake, ninja and Debian's CPU LibTorch but none
# of gRPC, protobuf's headers and compilers, absl, spdlog, CLI11, GoogleTest,
# cpp-httplib, OpenSSL's headers or pkg-config (as the GPU image lacks them),
# tests/gpu/run.sh configures and builds ddprun-mnist, ddprun-rendezvous
# and pg_helper from the carried folder alone (PREPARE_ONLY=1: up to where a
# GPU is needed), and the programs start. The root is cached under
# DDPRUN_CI_CACHE (/var/cache/ddprun-ci) and kept between runs.
#   tests/gpu/test_carry.sh [CARRY]      (root; CARRY: build-gpu-carry)
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
carry=$(realpath "${1:-$src/build-gpu-carry}")
cache=${DDPRUN_CI_CACHE:-/var/cache/ddprun-ci}
r=$cache/bookworm-carry
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
# What the GPU image has that matters here; the rest is the carry's.
packages="build-essential cmake ninja-build libtorch-dev"
removed="libprotobuf-dev protobuf-compiler libssl-dev zlib1g-dev pkgconf pkgconf-bin pkg-config"
stamp="$packages | $removed"
if [[ $(cat "$r/etc/ddprun-carry-root" 2>/dev/null) != "$stamp" ]]; then
  rm -rf --one-file-system "$r"
  echo "making $r (debootstrap bookworm, then $packages)" >&2
  debootstrap --variant=minbase --cache-dir="$cache/debootstrap" bookworm "$r" "$mirror" \
    >"$cache/logs/bookworm-carry.log" 2>&1 || { tail "$cache/logs/bookworm-carry.log"; fail debootstrap; }
  printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
  chmod +x "$r/usr/sbin/policy-rc.d"
  cp /etc/resolv.conf "$r/etc/resolv.conf"
  mount -t proc proc "$r/proc"
  in_root apt-get update -qq
  # shellcheck disable=SC2086
  in_root apt-get install -y -qq --no-install-recommends $packages >>"$cache/logs/bookworm-carry.log" 2>&1 ||
    { tail "$cache/logs/bookworm-carry.log"; fail "apt-get install $packages"; }
  # Headers, compilers and tools the carry brings; libtorch-dev pulls some in.
  # shellcheck disable=SC2086
  in_root dpkg --purge --force-depends $removed >>"$cache/logs/bookworm-carry.log" 2>&1 || true
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
mount --bind "$src" "$r/src"
mount --bind "$carry" "$r/carry"
start=$SECONDS status=0
nice chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
  CARRY_DIR=/carry LIBTORCH_DIR=/usr PREPARE_ONLY=1 BUILD_DIR=/build-gpu \
  JOBS="${JOBS:-2}" TIME_LIMIT=3600 BUILD_LIMIT=3000 \
  bash /src/tests/gpu/run.sh >"$cache/logs/test-carry.log" 2>&1 || status=$?
tail -n 40 "$cache/logs/test-carry.log"
echo "tests/gpu/run.sh PREPARE_ONLY in $r: status $status, $((SECONDS - start)) s"
exit "$status"
