#!/usr/bin/env bash
# The .deb packages split by what they need, checked without installing
# them (no root): builds them with CPack, then with dpkg-deb -I/-c
#   ddprun        the launcher: ddprun, ddprun-rendezvous, ddprun-relay; no
#                 LibTorch, gRPC, protobuf, Abseil, ... dependency (with
#                 static programs: libc6 alone); no libddp, no headers
#   libddp-dev    libddp, its headers and CMake package; depends on
#                 libtorch-dev
#   ddprun-mnist  the example: depends on ddprun and LibTorch
# and unpacks the launcher's package alone (dpkg-deb -x) into an empty folder,
# where its three programs must start with an empty environment.
#   deploy/package/test_deb_contents.sh BUILD_DIR STATIC(0|1)
set -euo pipefail
build_dir=$(realpath "$1")
static=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
(cd "$build_dir" && cpack -G DEB -B "$out" >"$out/cpack.log" 2>&1) ||
  { cat "$out/cpack.log" >&2; fail "cpack -G DEB in $build_dir"; }
one() {  # one GLOB: the single file matching it
  local files=("$out"/$1)
  [[ ${#files[@]} -eq 1 && -f ${files[0]} ]] ||
    fail "expected one $1 from cpack, found: $(ls "$out")"
  echo "${files[0]}"
}
field() { dpkg-deb -f "$1" "$2"; }
has() {  # has DEB PATH...: each PATH is in DEB
  local deb=$1 contents f
  shift
  contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
  for f in "$@"; do
    grep -qxF "./$f" <<<"$contents" ||
      { echo "$contents" >&2; fail "$f is not in $(basename "$deb")"; }
  done
}
lacks() {  # lacks DEB REGEX: no path in DEB matches REGEX
  local hits
  hits=$(dpkg-deb -c "$1" | awk '{print $6}' | grep -E "$2" || true)
  [[ -z $hits ]] || fail "$(basename "$1") should not hold: $hits"
}

# --- ddprun: the launcher ----------------------------------------------------
launcher=$(one 'ddprun_*.deb')
[[ $(field "$launcher" Package) == ddprun ]] || fail "$launcher is not package ddprun"
dpkg-deb -I "$launcher" >/dev/null || fail "dpkg-deb -I $launcher"
has "$launcher" usr/bin/ddprun usr/bin/ddprun-rendezvous usr/bin/ddprun-relay
lacks "$launcher" '(ddprun-mnist|libddp|/include/|\.so(\.|$)|\.a$|cmake/)'
depends=$(field "$launcher" Depends)
for lib in torch gloo grpc protobuf absl spdlog fmt openblas ssl cares re2; do
  [[ $depends != *"$lib"* ]] || fail "ddprun depends on $lib: '$depends'"
done
if ((static)); then
  [[ $depends =~ ^libc6( \(>= [0-9.]+\))?$ ]] ||
    fail "the self-contained launcher's package should depend on libc6 alone: '$depends'"
fi

# Unpacked alone, with nothing of the build or the machine's libraries in
# the environment, its programs start (static: they need only the C library).
dpkg-deb -x "$launcher" "$out/launcher"
version=$(env -i "$out/launcher/usr/bin/ddprun" --version 2>&1) ||
  fail "ddprun --version from the unpacked ddprun package: $version"
[[ $version == *"$(field "$launcher" Version)"* ]] ||
  fail "ddprun --version printed '$version', the package is $(field "$launcher" Version)"
for p in ddprun-rendezvous ddprun-relay; do
  env -i "$out/launcher/usr/bin/$p" --help >/dev/null 2>&1 ||
    fail "$p --help from the unpacked ddprun package"
done
if ((static)); then
  needed=$(ldd "$out/launcher/usr/bin/ddprun" |
    grep -vE 'linux-vdso|libc\.so|libm\.so|ld-linux|libpthread|libdl|librt' || true)
  [[ -z $needed ]] || fail "the unpacked ddprun needs more than glibc: $needed"
fi

# --- libddp-dev: the library for LibTorch programs ---------------------------
dev=$(one 'libddp-dev_*.deb')
dev_depends=$(field "$dev" Depends)
[[ $dev_depends == *libtorch-dev* ]] || fail "libddp-dev lacks libtorch-dev: '$dev_depends'"
libdir=usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
has "$dev" "$libdir/cmake/ddp/ddpConfig.cmake" "$libdir/cmake/ddp/ddpConfigVersion.cmake" \
  "$libdir/cmake/ddp/ddpTargets.cmake" usr/include/ddp/common/status_macros.h
if [[ -e $build_dir/worker/libddp.a || -e $build_dir/worker/libddp.so ]]; then
  has "$dev" usr/include/ddp/worker/ddp.h usr/include/ddp/worker/process_group.h
  dev_files=$(dpkg-deb -c "$dev" | awk '{print $6}')
  grep -qE "^\./$libdir/libddp\.(a|so)$" <<<"$dev_files" ||
    { echo "$dev_files" >&2; fail "libddp is not in libddp-dev"; }
fi
lacks "$dev" '^\./usr/bin/'

# --- ddprun-mnist: the example -------------------------------------------------
if [[ -x $build_dir/mnist/ddprun-mnist ]]; then
  mnist=$(one 'ddprun-mnist_*.deb')
  mnist_depends=$(field "$mnist" Depends)
  [[ $mnist_depends == *"ddprun (= "* && $mnist_depends == *libtorch* ]] ||
    fail "ddprun-mnist should depend on ddprun and LibTorch: '$mnist_depends'"
  has "$mnist" usr/bin/ddprun-mnist
  lacks "$mnist" '^\./usr/bin/ddprun(-rendezvous|-relay)?$'
fi

for deb in "$out"/*.deb; do
  printf '%s %s KiB, Depends: %s\n' "$(basename "$deb")" "$(du -k "$deb" | cut -f1)" \
    "$(field "$deb" Depends)"
done
echo PASS
