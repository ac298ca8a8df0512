#!/usr/bin/env bash
# Builds the Debian packages with CPack and installs them with apt, as a user
# would on a Debian 12 machine: first the launcher alone,
#   apt install ./ddprun_*.deb
# which must not depend on LibTorch (with static programs: on libc6 alone),
# then the worker library with its headers, and the example,
#   apt install ./libddp-dev_*.deb ./ddprun-mnist_*.deb
# and checks that the programs run from /usr/bin and that the units and the
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
  fail "a ddprun package is installed already; remove it first (apt remove ddprun libddp-dev ddprun-mnist)"
fi

out=$(mktemp -d)
removed=0
cleanup() {
  if ((!removed)) && [[ -z ${DDPRUN_KEEP_INSTALLED:-} ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq ddprun-mnist libddp-dev \
      ddprun >/dev/null 2>&1 || true
  fi
  rm -rf "$out"
}
trap cleanup EXIT

(cd "$build_dir" && cpack -G DEB -B "$out" >"$out/cpack.log" 2>&1) ||
  { cat "$out/cpack.log" >&2; fail "cpack -G DEB in $build_dir"; }
runtime=$(ls "$out"/ddprun_*.deb)
dev=$(ls "$out"/libddp-dev_*.deb)
# The example exists where LibTorch was found.
mnist=$(ls "$out"/ddprun-mnist_*.deb 2>/dev/null || true)
if [[ -x $build_dir/mnist/ddprun-mnist ]]; then
  [[ -n $mnist ]] || fail "no ddprun-mnist package: $(ls "$out")"
fi

depends=$(dpkg-deb -f "$runtime" Depends)
contents=$(dpkg-deb -c "$runtime")
for f in ./usr/lib/systemd/system/ddprun-rendezvous.service \
         ./usr/lib/systemd/system/ddprun-agent@.service \
         ./usr/share/doc/ddprun/README.md; do
  grep -qF " $f" <<<"$contents" ||
    { echo "$contents" >&2; fail "$f is not in $runtime"; }
done
programs=(ddprun ddprun-rendezvous ddprun-relay)
for built in launcher/ddprun rendezvous/ddprun-rendezvous relay/ddprun-relay; do
  [[ -x $build_dir/$built ]] || fail "$build_dir/$built was not built"
done
for p in "${programs[@]}"; do
  grep -qF " ./usr/bin/$p" <<<"$contents" || fail "/usr/bin/$p is not in $runtime"
done
# The launcher never needs LibTorch; linked statically, nothing but libc6.
[[ $depends != *torch* && $depends != *gloo* ]] ||
  fail "$runtime depends on LibTorch: '$depends'"
if ldd "$build_dir/launcher/ddprun" | grep -q libgrpc; then
  [[ $depends == *libgrpc++* && $depends == *libprotobuf* ]] ||
    fail "Depends of $runtime lacks gRPC/protobuf: '$depends'"
else
  [[ $depends =~ ^libc6( \(>= [0-9.]+\))?$ ]] ||
    fail "the static launcher's $runtime should depend on libc6 alone: '$depends'"
fi
if [[ -n $mnist ]]; then
  mnist_depends=$(dpkg-deb -f "$mnist" Depends)
  [[ $mnist_depends == *libtorch* && $mnist_depends == *"ddprun (= "* ]] ||
    fail "Depends of $mnist lacks LibTorch or ddprun: '$mnist_depends'"
  grep -qF " ./usr/bin/ddprun-mnist" <<<"$(dpkg-deb -c "$mnist")" ||
    fail "/usr/bin/ddprun-mnist is not in $mnist"
fi
dev_contents=$(dpkg-deb -c "$dev")
grep -qF './usr/lib/x86_64-linux-gnu/cmake/ddp/ddpConfig.cmake' <<<"$dev_contents" ||
  fail "ddpConfig.cmake is not in $dev"

start=$(date +%s.%N)
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$runtime" \
  >"$out/apt.log" 2>&1 || { cat "$out/apt.log" >&2; fail "apt install $runtime"; }
end=$(date +%s.%N)
for p in "${programs[@]}"; do
  "/usr/bin/$p" --help >/dev/null 2>&1 || fail "/usr/bin/$p --help failed after install"
done
[[ -f /lib/systemd/system/ddprun-rendezvous.service ]] || fail "unit not installed"

DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$dev" $mnist \
  >"$out/apt-dev.log" 2>&1 || { cat "$out/apt-dev.log" >&2; fail "apt install $dev $mnist"; }
[[ -f /usr/lib/x86_64-linux-gnu/cmake/ddp/ddpConfig.cmake ]] || fail "ddpConfig.cmake not installed"
if [[ -n $mnist ]]; then
  /usr/bin/ddprun-mnist --help >/dev/null 2>&1 || fail "/usr/bin/ddprun-mnist --help failed after install"
fi

DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq ddprun-mnist libddp-dev ddprun >/dev/null
removed=1
[[ ! -e /lib/systemd/system/ddprun-rendezvous.service ]] || fail "apt remove left the unit behind"

for deb in "$runtime" "$dev" $mnist; do
  printf '%s %s KiB, Depends: %s\n' "$(basename "$deb")" "$(du -k "$deb" | cut -f1)" \
    "$(dpkg-deb -f "$deb" Depends)"
done
printf 'PASS; install time of the launcher (apt install ddprun): %.1f s\n' \
  "$(awk -v a="$start" -v b="$end" 'BEGIN{print b - a}')"
