#!/usr/bin/env bash
# Runs the whole test suite: sets up and builds first (idempotent, quick the
# second time), then every ctest test. Extra arguments go to ctest, e.g.
#   scripts/test.sh -L rendezvous      only the rendezvous tests
# Under CI=true (as .ci/run sets it) a skipped test fails the run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# setup.sh builds what a job runs; the tests, the benchmarks and the rest
# are built here (everything, as CI checks that everything builds).
DDPRUN_BUILD_TARGETS=${DDPRUN_BUILD_TARGETS:-all} "$root/scripts/setup.sh"
build_dir="${DDPRUN_BUILD_DIR:-$root/build}"
# Tests start several processes that each want a core; run two at a time.
# run-ctest.sh fails the run when it ran fewer tests than are registered
# for these arguments, and under CI=true when any test skipped.
exec "$root/scripts/run-ctest.sh" "$build_dir" --output-on-failure \
  -j "${DDPRUN_TEST_JOBS:-2}" "$@"
