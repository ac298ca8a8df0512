#!/usr/bin/env bash
# The .deb on a fresh Debian 12: bootstraps a minimal bookworm into a temp
# directory (debootstrap, from the machine's own Debian mirror), installs the
# launcher and the example (ddprun, ddprun-mnist) there with apt as a user would, and trains MNIST with the
# installed programs inside that root; then installs libddp-dev and builds
# a user's find_package(ddp) project (tests/deploy/consumer) there. Prints the
# package sizes and install times (downloads included). Slow (minutes,
# ~2 GB); not run by ctest.
#   deploy/package/test_deb_fresh.sh BUILD_DIR      (root; needs debootstrap)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir=$(realpath "${1:-$root/build}")
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || fail "debootstrap and chroot need root"
command -v debootstrap >/dev/null || fail "apt-get install debootstrap"
mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
mirror=${mirror:-http://deb.debian.org/debian}

work=$(mktemp -d)
chroot_dir=$work/root
cleanup() {
  umount "$chroot_dir/proc" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

(cd "$build_dir" && cpack -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log" >&2; fail "cpack"; }
deb=$(ls "$work"/debs/ddprun_*.deb)
dev=$(ls "$work"/debs/libddp-dev_*.deb)
mnist=$(ls "$work"/debs/ddprun-mnist_*.deb)

echo "bootstrapping bookworm (minbase) from $mirror ..." >&2
debootstrap --variant=minbase bookworm "$chroot_dir" "$mirror" >"$work/debootstrap.log" 2>&1 ||
  { tail -n 20 "$work/debootstrap.log" >&2; fail "debootstrap"; }
# The host's apt sources (with security updates) replace debootstrap's list.
if cp /etc/apt/sources.list.d/debian.sources "$chroot_dir/etc/apt/sources.list.d/" 2>/dev/null; then
  rm -f "$chroot_dir/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf"
mount -t proc proc "$chroot_dir/proc"
cp "$deb" "$dev" "$mnist" "$chroot_dir/tmp/"
cp -r "$root/tests/deploy/consumer" "$chroot_dir/tmp/consumer"
mkdir -p "$chroot_dir/mnist"
cp "$root"/data/mnist/*-ubyte "$chroot_dir/mnist/"

in_root() { chroot "$chroot_dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
in_root apt-get update -qq >/dev/null
start=$(date +%s.%N)
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  "/tmp/$(basename "$deb")" "/tmp/$(basename "$mnist")" >"$work/apt.log" 2>&1 ||
  { tail -n 30 "$work/apt.log" >&2; fail "apt install on the fresh root"; }
end=$(date +%s.%N)
installed_kb=$(in_root du -sk /usr | cut -f1)

for p in ddprun ddprun-rendezvous ddprun-mnist; do
  in_root "$p" --help >/dev/null 2>&1 || fail "$p --help fails on the fresh root"
done
in_root ddprun --standalone --nproc-per-node 2 ddprun-mnist --epochs 1 \
  --train-limit 4000 --data-dir /mnist --summary-json /tmp/summary.json \
  >"$work/train.log" 2>&1 || { tail -n 20 "$work/train.log" >&2; fail "training on the fresh root"; }
grep -q '"world_size": *2' "$chroot_dir/tmp/summary.json" || fail "no summary from the fresh root"

# The development package: a LibTorch program against the installed libddp.
dev_start=$(date +%s.%N)
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  "/tmp/$(basename "$dev")" build-essential ninja-build >"$work/apt-dev.log" 2>&1 ||
  { tail -n 30 "$work/apt-dev.log" >&2; fail "apt install libddp-dev on the fresh root"; }
dev_end=$(date +%s.%N)
in_root sh -c 'cmake -S /tmp/consumer -B /tmp/consumer-build -G Ninja && cmake --build /tmp/consumer-build' \
  >"$work/consumer.log" 2>&1 ||
  { tail -n 30 "$work/consumer.log" >&2; fail "find_package(ddp) consumer on the fresh root"; }
out=$(in_root env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 \
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 /tmp/consumer-build/consumer)
[[ $out == "consumer rank 1 of 2" ]] || fail "consumer on the fresh root printed: $out"
printf 'PASS: %s (%s KiB) + build tools: apt install %.0f s including downloads; find_package(ddp) consumer built and ran\n' \
  "$(basename "$dev")" "$(du -k "$dev" | cut -f1)" \
  "$(awk -v a="$dev_start" -v b="$dev_end" 'BEGIN{print b - a}')"

printf 'PASS: %s (%s KiB) on a fresh bookworm: apt install %.0f s including downloads; /usr grew to %s MiB; MNIST trained with 2 workers\n' \
  "$(basename "$deb")" "$(du -k "$deb" | cut -f1)" \
  "$(awk -v a="$start" -v b="$end" 'BEGIN{print b - a}')" "$((installed_kb / 1024))"
