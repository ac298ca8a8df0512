#!/usr/bin/env bash
# Checks that every C++ source of the repository (production, tests,
# benchmarks, examples) is what clang-format makes of it with the
# repository's .clang-format:
#   scripts/check-format.sh [CLANG_FORMAT]      (default: clang-format)
# Prints the files that differ and the command that fixes them. The sources
# are formatted with clang-format 14 (Debian 12's); other versions format
# some constructs differently, so tests/static registers this check only
# where clang-format 14 is found.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
clang_format=${1:-clang-format}
command -v "$clang_format" >/dev/null ||
  { echo "[format] FAIL: no $clang_format (apt-get install clang-format)" >&2; exit 1; }
cd "$root"
# Every C++ file outside build folders and data (a clean clone's tree).
mapfile -t files < <(find . \( -path ./build -o -path './build-*' -o -path ./data \
    -o -path ./.git -o -path ./python/build \) -prune -o \
  -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cc.in' -o -name '*.h.in' \) -print |
  sed 's|^\./||' | LC_ALL=C sort)
((${#files[@]})) || { echo "[format] FAIL: found no C++ file under $root" >&2; exit 1; }
differ=()
for f in "${files[@]}"; do
  "$clang_format" --style=file --assume-filename="${f%.in}" <"$f" | cmp -s - "$f" || differ+=("$f")
done
if ((${#differ[@]})); then
  printf '[format] %s\n' "${differ[@]}" >&2
  echo "[format] FAIL: ${#differ[@]} of ${#files[@]} C++ files differ from what $clang_format makes of them; fix: clang-format -i ${differ[*]}" >&2
  exit 1
fi
echo "[format] ${#files[@]} C++ files match $($clang_format --version | grep -o 'version [0-9.]*') with .clang-format"
