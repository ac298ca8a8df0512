#!/usr/bin/env bash
# Installs the build tree into a temporary prefix with `cmake --install`, then
# builds and runs a user's project that finds it with find_package(ddp).
#   install_consumer_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build_dir=$1
source_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install into $prefix"; }

config=$(find "$prefix" -name ddpConfig.cmake -print -quit)
[[ -n $config ]] || fail "no ddpConfig.cmake under $prefix"
# An installed package must not point back into this checkout.
if grep -rl -e "$source_dir" -e "$build_dir" "$(dirname "$config")"; then
  fail "the installed CMake package names the source or build tree (above)"
fi
for unit in ddprun-rendezvous.service ddprun-agent@.service; do
  [[ -f $prefix/lib/systemd/system/$unit ]] || fail "unit $unit not installed"
done
[[ -f $prefix/share/doc/ddprun/README.md ]] || fail "docs not installed"
# libddp's headers are its API: ddprun-mnist's parts (mnist/) are a program
# that links libddp, not part of it.
include_root=$(find "$prefix" -type d -path '*/include/ddp' -print -quit)
[[ -n $include_root ]] || fail "no include/ddp under $prefix"
if find "$include_root" -name '*mnist*' -o -name 'train_summary.h' | grep .; then
  fail "ddprun-mnist's headers are installed as libddp's API (above)"
fi

# libddp installs its API and nothing else: exactly these headers (the
# list is deploy/cmake/install_library.cmake's), each of which compiles
# alone against the install (below, with the consumer).
public_headers="abortable.h atomic_file.h checkpoint.h collectives.h ddp.h distributed_sampler.h
gradient_path.h phase.h process_group.h progress.h recovery.h standby.h worker_env.h"
if [[ -d $include_root/worker ]]; then
  installed=$(cd "$include_root/worker" && ls | sort | tr '\n' ' ')
  expected=$(echo $public_headers | tr ' ' '\n' | sort | tr '\n' ' ')
  [[ $installed == "$expected" ]] ||
    fail "installed worker headers: $installed; libddp's API is: $expected"
fi

# The consumer compiles under this build's compiler launcher (ccache in CI),
# with every path under $work taken relative to it: a second run compiles
# the same files against the same installed headers and takes the object
# from the cache (ccache hashes every header's content); the link and the
# run are real each time.
cp -r "$source_dir/tests/deploy/consumer" "$work/src"
if [[ -d $include_root/worker ]]; then
  # One translation unit per public header, that header alone: a header
  # that needs one libddp does not install fails to compile here.
  for header in $public_headers; do
    echo "#include \"worker/$header\"" >"$work/src/header_${header%.h}.cc"
  done
fi
launcher=$(sed -n 's/^CMAKE_CXX_COMPILER_LAUNCHER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
launcher=${launcher:-${CMAKE_CXX_COMPILER_LAUNCHER:-}}
export CCACHE_BASEDIR=$work
cmake -S "$work/src" -B "$work/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" \
  >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring the consumer"; }
cmake --build "$work/consumer" -j 2 >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "building the consumer"; }

if grep -q 'add_library(ddp::ddp ' "$(dirname "$config")"/ddpTargets.cmake; then
  out=$(RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 \
        MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 "$work/consumer/consumer")
  [[ $out == "consumer rank 1 of 2" ]] || fail "consumer printed: $out"
  # The programs come with the library.
  for program in ddprun ddprun-rendezvous ddprun-relay ddprun-mnist; do
    [[ -x $prefix/bin/$program ]] || fail "$program not installed"
  done
  "$prefix/bin/ddprun-mnist" --help >/dev/null ||
    fail "installed ddprun-mnist does not start (libddp not found?)"
else
  out=$("$work/consumer/consumer" "[::1]:29400")
  [[ $out == "consumer endpoint [::1]:29400 "* ]] || fail "consumer printed: $out"
fi
echo "PASS: installed to $prefix, consumer built and ran: $out"
