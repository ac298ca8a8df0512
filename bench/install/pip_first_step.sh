#!/usr/bin/env bash
# Times issue 29's pip goal: `pip install` of the wheel file to the first
# training step of a 2-worker Python job, as a new user does it in a Debian 13
# root (Debian 13's python3 and python3-torch 2.6; nothing of this checkout
# but the wheel and the user test is copied in). Each run is CI's wheel stage
# (scripts/test-debian13.sh wheel, tests/deploy/wheel_user_test.sh): a fresh
# venv, pip install of the wheel, then `ddprun --standalone
# --nproc-per-node 2 first_step.py` (env://, DDP over Gloo, one step); the
# clock stops when that job has exited, so the figure bounds the first step
# from above. Prints each run's figures and their medians, and the wheel's
# size.
#
#   bench/install/pip_first_step.sh [RUNS]     (root; default 5 runs)
#
# Where this differs from a user: torch is Debian's, seen through
# --system-site-packages (pip cannot fetch torch here), so its download is
# not counted, and the wheel is a local file.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
runs=${1:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
wheel=$("$root/scripts/build-wheel.sh" --out "$out/dist" 2>/dev/null | tail -n 1)
printf 'wheel: %s, %.1f MB\n' "$(basename "$wheel")" \
  "$(awk -v b="$(stat -c %s "$wheel")" 'BEGIN {print b / 1e6}')"
for i in $(seq "$runs"); do
  "$root/scripts/test-debian13.sh" wheel >"$out/run$i.log" 2>&1 ||
    { cat "$out/run$i.log" >&2; echo "FAIL: run $i" >&2; exit 1; }
  pip=$(sed -n 's/.*venv and pip install: \([0-9.]*\) s/\1/p' "$out/run$i.log")
  first=$(sed -n 's/.*pip install to the first step at world 2: \([0-9.]*\) s/\1/p' "$out/run$i.log")
  echo "run $i: venv + pip install ${pip} s, pip install to the first step ${first} s"
  echo "$pip $first" >>"$out/figures"
done
median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "median of $runs: venv + pip install $(cut -d' ' -f1 "$out/figures" | median) s," \
  "pip install to the first step at world 2 $(cut -d' ' -f2 "$out/figures" | median) s" \
  "(goal <= 30 s); load $(cut -d' ' -f1-3 /proc/loadavg)"
