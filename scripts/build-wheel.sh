#!/usr/bin/env bash
# Builds the Python wheel of ddprun: ddprun, ddprun-rendezvous and
# ddprun-relay as the wheel's scripts, so `pip install` puts them on the
# environment's PATH, and the pure-Python package python/ddprun/ beside them.
# The three are one self-contained executable (deploy/wheel: they need only
# glibc; stripped), bin/ddprun, and two scripts that run it under their names
# (deploy/wheel/*.sh): three static copies of gRPC and friends would triple
# the wheel.
#
#   scripts/build-wheel.sh [--no-build] [--out DIR]
#     -> DIR/ddprun-<version>-py3-none-manylinux_<glibc>_x86_64.whl [dist/]
#
# The platform tag is the build machine's glibc (2.36 on Debian 12): the
# programs use no newer glibc symbol, and nothing else from the system.
# Builds the executable (target ddprun-multicall) in $DDPRUN_BUILD_DIR
# [build/] first (configured as scripts/setup.sh does) unless --no-build. No network: the wheel is
# written with Python's zipfile.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${DDPRUN_BUILD_DIR:-$root/build}"
out="$root/dist"
build=1
while (($#)); do
  case $1 in
    --no-build) build=0 ;;
    --out) out=$2; shift ;;
    *) echo "usage: $0 [--no-build] [--out DIR]" >&2; exit 2 ;;
  esac
  shift
done
log() { printf '[wheel] %s\n' "$*" >&2; }

if ((build)); then
  if [[ ! -f $build_dir/build.ninja ]]; then
    cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  cmake --build "$build_dir" --target ddprun-multicall
fi
program=$build_dir/deploy/wheel/ddprun-multicall
[[ -x $program ]] ||
  { log "no $program: configure with -DDDPRUN_STATIC_TOOLS=ON (it needs the static archives) and build it"; exit 1; }
# Only a self-contained program goes into a wheel for any Linux.
bash "$root/tests/deploy/static_tools_test.sh" "$program" >/dev/null ||
  { log "$program is not self-contained"; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
strip --strip-all -o "$stage/ddprun" "$program"
for p in ddprun-rendezvous ddprun-relay; do
  cp "$root/deploy/wheel/$p.sh" "$stage/$p"
done
version=$("$stage/ddprun" --version | awk '{print $2}')
glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
mkdir -p "$out"
python3 - "$root" "$stage" "$out" "$version" "$glibc" <<'PY'
import base64, hashlib, os, sys, zipfile

root, stage, out, version, glibc = sys.argv[1:]
major, minor = glibc.split(".")[:2]
tag = f"py3-none-manylinux_{major}_{minor}_x86_64"
name = f"ddprun-{version}"
wheel = os.path.join(out, f"{name}-{tag}.whl")
info = f"{name}.dist-info"
files = []  # (path in the wheel, bytes, executable)
for program in sorted(os.listdir(stage)):
    with open(os.path.join(stage, program), "rb") as f:
        files.append((f"{name}.data/scripts/{program}", f.read(), True))
package = os.path.join(root, "python")
for folder, _, names in sorted(os.walk(package)):
    for n in sorted(names):
        if n.endswith(".py"):
            path = os.path.join(folder, n)
            with open(path, "rb") as f:
                files.append((os.path.relpath(path, package), f.read(), False))
readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
metadata = f"""Metadata-Version: 2.1
Name: ddprun
Version: {version}
Summary: torchrun for C++ (and Python): a self-contained launcher, rendezvous server and relay
Requires-Python: >=3.8
Description-Content-Type: text/markdown

{readme}"""
files.append((f"{info}/METADATA", metadata.encode(), False))
files.append((f"{info}/WHEEL", f"""Wheel-Version: 1.0
Generator: ddprun scripts/build-wheel.sh
Root-Is-Purelib: false
Tag: {tag}
""".encode(), False))
record = []
for path, data, _ in files:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{path},sha256={digest},{len(data)}")
record.append(f"{info}/RECORD,,")
files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode(), False))
tmp = wheel + ".tmp"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    for path, data, executable in files:
        entry = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
        entry.external_attr = (0o100755 if executable else 0o100644) << 16
        entry.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(entry, data, compresslevel=9)
os.replace(tmp, wheel)
print(wheel)
PY
