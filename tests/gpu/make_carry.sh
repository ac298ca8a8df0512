#!/usr/bin/env bash
# Makes the folder that tests/gpu/run.sh takes to a GPU machine whose image
# has a CUDA PyTorch, CMake, ninja and a compiler but none of ddprun's other
# build dependencies, and reaches no registry: Debian 12's gRPC, protobuf
# (protoc and the gRPC plugin included), absl, spdlog/fmt, CLI11, GoogleTest,
# cpp-httplib and pkg-config, unpacked from their .debs (apt-get download),
# plus MNIST, gzipped. Everything must fit in the 64 MiB a device call
# carries, with the source tree; this script fails when it does not.
#
#   tests/gpu/make_carry.sh [OUT]        [OUT: build-gpu-carry]
#   then, on the device:  tests/gpu/run.sh   (carry: build-gpu-carry)
#
# The libraries are Debian 12's (glibc 2.36, GCC 12's libstdc++, the C++11
# ABI, as PyTorch >= 2.7 uses): run.sh checks the image's glibc against
# what they need before building.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out=${1:-$root/build-gpu-carry}
limit_mib=${DDPRUN_CARRY_LIMIT_MIB:-60}  # leaves room for the source tree
fail() { echo "tests/gpu/make_carry.sh: FAIL: $*" >&2; exit 1; }

# What the worker, the rendezvous and pg_helper configure and link with, and
# the runtime libraries under them that a Python image may lack. Not glibc,
# libstdc++ or libgcc: those are the image's own.
packages=(
  libgrpc++-dev libgrpc-dev libgrpc++1.51 libgrpc29 protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler
  libabsl-dev libabsl20220623 libre2-dev libre2-9 libc-ares-dev libc-ares2
  libssl-dev libssl3 zlib1g-dev zlib1g libbrotli-dev libbrotli1
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev
  libgtest-dev libgmock-dev libcpp-httplib-dev libcpp-httplib0.11
  pkgconf pkgconf-bin libpkgconf3
)
mnist=$root/data/mnist
[[ -f $mnist/train-images-idx3-ubyte ]] ||
  fail "no MNIST in $mnist: run scripts/setup.sh first"

debs=$(mktemp -d)
chmod 777 "$debs"  # apt-get download fetches as the _apt user
trap 'rm -rf "$debs"' EXIT
for p in "${packages[@]}"; do
  dpkg-query -W "$p" >/dev/null 2>&1 ||
    fail "$p is not installed here (scripts/setup.sh installs ddprun's packages)"
done
(cd "$debs" && apt-get download -q "${packages[@]}" >/dev/null) ||
  fail "apt-get download of ${packages[*]}"

rm -rf "$out"
mkdir -p "$out/root" "$out/mnist"
for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$out/root"; done
# Only what a build and a run use: no documentation, no static libraries
# that have shared ones, no test sources.
rm -rf "$out/root/usr/share/doc" "$out/root/usr/share/man" "$out/root/usr/share/lintian" \
  "$out/root/usr/src" "$out/root/usr/share/bug"
find "$out/root" -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
# pkg-config files name /usr: make them relative to where they lie.
while IFS= read -r pc; do
  rel=$(realpath --relative-to="$(dirname "$pc")" "$out/root/usr")
  sed -i "s|^prefix=/usr\$|prefix=\${pcfiledir}/$rel|; s|=/usr/|=\${pcfiledir}/$rel/|" "$pc"
done < <(find "$out/root" -name '*.pc')
ln -sf pkgconf "$out/root/usr/bin/pkg-config"
# Debian 12 keeps a few libraries in /lib (zlib): merge them into /usr/lib as
# a merged-/usr system does, and point absolute links (libz.so ->
# /lib/.../libz.so.1.2.13) at the carried file, relative to the link: they
# would otherwise name the build machine's files, or none.
if [[ -d $out/root/lib ]]; then
  cp -a "$out/root/lib/." "$out/root/usr/lib/"
  rm -rf "$out/root/lib"
fi
while IFS= read -r link; do
  target=$(readlink "$link")
  [[ $target == /* ]] || continue
  inside=$out/root/usr${target#/usr}
  [[ -e $inside ]] || fail "$link points to $target, which the carry does not hold"
  ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$inside")" "$link"
done < <(find "$out/root" -type l)
for f in "$mnist"/*-ubyte; do gzip -9 -c "$f" >"$out/mnist/$(basename "$f").gz"; done
# The newest glibc symbol version any carried ELF file needs.
find "$out/root" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec \
  objdump -T {} + 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u |
  tail -n 1 | sed 's/GLIBC_//' >"$out/glibc-required"
for deb in "$debs"/*.deb; do
  dpkg-deb -f "$deb" Package Version | sed 's/^[^:]*: //' | paste -sd' '
done >"$out/packages"

mib=$(( $(du -sb "$out" | cut -f1) / 1048576 ))
echo "$out: ${mib} MiB (limit ${limit_mib} MiB), needs glibc >= $(cat "$out/glibc-required")"
((mib <= limit_mib)) || fail "$out is ${mib} MiB, over ${limit_mib} MiB"
