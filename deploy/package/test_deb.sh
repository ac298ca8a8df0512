#!/usr/bin/env bash
# Builds the Debian packages with CPack and installs them with apt, as a user
# would on a Debian 12 machine:
#   apt install ./ddprun_*.deb ./ddprun-dev_*.deb
# then checks that the programs run from /usr/bin and that the units and the
# CMake package are in place, and removes the packages again (unless
# DDPRUN_KEEP_INSTALLED=1). Prints the package sizes and the install time.
#   deploy/package/test_deb.sh [BUILD_DIR]     (root; exit 77 = skipped, under
#                                               CI=true a failure)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir=$(realpath "${1:-$root/build}")
fail() { echo "FAIL: $*" >&2; exit 1; }

if [[ $(id -u) -ne 0 ]]; then
  # Under CI=true nothing may skip.
  [[ ${CI:-} == true ]] && fail "apt install needs root (CI=true: no skips)"
  echo "SKIP: apt install needs root" >&2
  exit 77
fi
if dpkg-query -W -f='${Status}' ddprun 2>/dev/null | grep -q 'ok installed'; then
  fail "a ddprun package is installed already; remove it first (apt remove ddprun ddprun-dev)"
fi

out=$(mktemp -d)
removed=0
cleanup() {
  if ((!removed)) && [[ -z ${DDPRUN_KEEP_INSTALLED:-} ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq ddprun-dev ddprun \
      >/dev/null 2>&1 || true
  fi
  rm -rf "$out"
}
trap cleanup EXIT

(cd "$build_dir" && cpack -G DEB -B "$out" >"$out/cpack.log" 2>&1) ||
  { cat "$out/cpack.log" >&2; fail "cpack -G DEB in $build_dir"; }
runtime=$(ls "$out"/ddprun_*.deb)
dev=$(ls "$out"/ddprun-dev_*.deb)

depends=$(dpkg-deb -f "$runtime" Depends)
contents=$(dpkg-deb -c "$runtime")
for f in ./usr/lib/systemd/system/ddprun-rendezvous.service \
         ./usr/lib/systemd/system/ddprun-agent@.service \
         ./usr/share/doc/ddprun/README.md; do
  grep -qF " $f" <<<"$contents" ||
    { echo "$contents" >&2; fail "$f is not in $runtime"; }
done
# Every program the build made must be in the package (ddprun-mnist only
# where LibTorch was found; the others always).
programs=()
for built in launcher/ddprun rendezvous/ddprun-rendezvous relay/ddprun-relay mnist/ddprun-mnist; do
  if [[ -x $build_dir/$built ]]; then
    programs+=("$(basename "$built")")
  elif [[ $built != mnist/* ]]; then
    fail "$build_dir/$built was not built"
  fi
done
for p in "${programs[@]}"; do
  grep -qF " ./usr/bin/$p" <<<"$contents" || fail "/usr/bin/$p is not in $runtime"
done
if ((${#programs[@]})); then
  # dpkg-shlibdeps must have found the shared libraries the programs need.
  [[ $depends == *libgrpc++* && $depends == *libprotobuf* ]] ||
    fail "Depends of $runtime lacks gRPC/protobuf: '$depends'"
fi
dev_contents=$(dpkg-deb -c "$dev")
grep -qF './usr/lib/x86_64-linux-gnu/cmake/ddp/ddpConfig.cmake' <<<"$dev_contents" ||
  fail "ddpConfig.cmake is not in $dev"

start=$(date +%s.%N)
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$runtime" "$dev" \
  >"$out/apt.log" 2>&1 || { cat "$out/apt.log" >&2; fail "apt install $runtime $dev"; }
end=$(date +%s.%N)

for p in "${programs[@]}"; do
  "/usr/bin/$p" --help >/dev/null 2>&1 || fail "/usr/bin/$p --help failed after install"
done
[[ -f /usr/lib/x86_64-linux-gnu/cmake/ddp/ddpConfig.cmake ]] || fail "ddpConfig.cmake not installed"
[[ -f /lib/systemd/system/ddprun-rendezvous.service ]] || fail "unit not installed"

DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq ddprun-dev ddprun >/dev/null
removed=1
[[ ! -e /lib/systemd/system/ddprun-rendezvous.service ]] || fail "apt remove left the unit behind"

printf 'PASS: %s %s KiB, %s %s KiB, Depends: %s\n' \
  "$(basename "$runtime")" "$(du -k "$runtime" | cut -f1)" \
  "$(basename "$dev")" "$(du -k "$dev" | cut -f1)" "$depends"
printf 'install time (apt install, deps already present): %.1f s\n' \
  "$(awk -v a="$start" -v b="$end" 'BEGIN{print b - a}')"
