#!/usr/bin/env bash
# Clean-build time of the whole project (configure + build, all targets and
# tests) in a fresh folder.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start=$(date +%s.%N)
cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$dir" >/dev/null
end=$(date +%s.%N)
printf 'clean build: %.1f s on %d cores\n' "$(awk -v a="$start" -v b="$end" 'BEGIN{print b-a}')" "$(nproc)"
