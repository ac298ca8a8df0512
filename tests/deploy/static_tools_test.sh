#!/usr/bin/env bash
# The programs built with DDPRUN_STATIC_TOOLS need nothing but the C library:
# ldd lists only glibc's parts, their DT_NEEDED entries are glibc's, the
# newest glibc symbol version they use is at most the build machine's, and
# each runs (--version) with an empty environment.
#   static_tools_test.sh PROGRAM...
set -euo pipefail
(($#)) || { echo "usage: $0 PROGRAM..." >&2; exit 2; }
fail() { echo "FAIL: $*" >&2; exit 1; }
glibc_parts='^(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux-x86-64\.so\.2|/lib64/ld-linux-x86-64\.so\.2)$'
machine_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
for program; do
  [[ -x $program ]] || fail "$program is not an executable"
  name=${program##*/}
  others=$(ldd "$program" | awk '{print $1}' | grep -Ev "$glibc_parts" || true)
  [[ -z $others ]] || fail "$name loads more than the C library: $(echo $others)"
  needed=$(readelf -d "$program" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  bad=$(grep -Ev "$glibc_parts" <<<"$needed" || true)
  [[ -z $bad ]] || fail "$name needs $(echo $bad)"
  newest=$(objdump -T "$program" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
  [[ $(printf '%s\n' "$newest" "$machine_glibc" | sort -V | tail -n 1) == "$machine_glibc" ]] ||
    fail "$name uses GLIBC_$newest, newer than this machine's $machine_glibc"
  version=$(env -i "$program" --version) || fail "$name --version failed in an empty environment"
  echo "$name: $(echo $needed) (glibc >= $newest): $version"
done
