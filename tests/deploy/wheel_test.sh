#!/usr/bin/env bash
# scripts/build-wheel.sh on the programs of BUILD_DIR, the wheel's contents
# and size, then a new user's steps with it (wheel_user_test.sh) under
# PYTHON (one with torch).
#   wheel_test.sh SOURCE BUILD_DIR PYTHON
set -euo pipefail
src=$1 build=$2 python=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
DDPRUN_BUILD_DIR=$build "$src/scripts/build-wheel.sh" --no-build --out "$out" >/dev/null
wheel=$(echo "$out"/ddprun-*-py3-none-manylinux_*_x86_64.whl)
[[ -f $wheel ]] || { echo "FAIL: no wheel in $out: $(ls "$out")" >&2; exit 1; }
size=$(stat -c %s "$wheel")
echo "wheel: ${wheel##*/}, $size bytes"
# At most 15 MB, the goal for a download beside torch.
((size <= 15 * 1000 * 1000)) || { echo "FAIL: the wheel is $size bytes, over 15 MB" >&2; exit 1; }
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
for want in ("ddprun/__init__.py",):
    assert want in names, f"{want} missing from the wheel"
scripts = {n.rsplit("/", 1)[1] for n in names if ".data/scripts/" in n}
assert scripts == {"ddprun", "ddprun-rendezvous", "ddprun-relay"}, scripts
PY
bash "$src/tests/deploy/wheel_user_test.sh" "$wheel" "$python"
