#!/usr/bin/env bash
# Runs ctest in BUILD_DIR with ARGS, then checks that the run hid nothing:
#   scripts/run-ctest.sh BUILD_DIR [CTEST_ARGS...]
# - it ran every test ctest registers for the same ARGS (`ctest -N ARGS`):
#   a filter such as -R or -L narrows both sides alike; zero tests fails;
# - under CI=true no test was skipped: ctest counts a skip ("***Skipped",
#   "***Not Run", a disabled test) as not failed, and CI must have what every
#   test needs.
# It prints "ran N of N registered tests, S skipped" and exits with ctest's
# status, or 1 when a check fails. scripts/test.sh and the Debian 13 stage
# of scripts/test-debian13.sh call it.
set -euo pipefail
build_dir=${1:?usage: run-ctest.sh BUILD_DIR [CTEST_ARGS...]}
shift
log() { printf '[ctest-check] %s\n' "$*" >&2; }
fail() { printf '[ctest-check] FAIL: %s\n' "$*" >&2; exit 1; }

registered=$(ctest --test-dir "$build_dir" -N "$@" | awk '/^Total Tests:/ {print $3}')
[[ $registered =~ ^[0-9]+$ ]] ||
  fail "ctest -N printed no 'Total Tests:' line for $build_dir (is it configured?)"
((registered > 0)) ||
  fail "no test is registered in $build_dir for the arguments '$*': a run of zero tests proves nothing"

junit=$(mktemp "${TMPDIR:-/tmp}/ddprun-ctest.XXXXXX.xml")
trap 'rm -f "$junit"' EXIT
status=0
ctest --test-dir "$build_dir" --no-tests=error --output-junit "$junit" "$@" || status=$?
if [[ ! -s $junit ]]; then
  log "ctest (status $status) wrote no report of its tests to $junit"
  exit $((status ? status : 1))
fi

# One <testcase ... status="run|fail|notrun|disabled"> per test ctest took up.
ran=$(grep -cE '<testcase .*status="(run|fail)"' "$junit" || true)
skipped=$(grep -cE '<testcase .*status="(notrun|disabled)"' "$junit" || true)
log "ran $ran of $registered registered tests, $skipped skipped"
if ((skipped)); then
  grep -E '<testcase .*status="(notrun|disabled)"' "$junit" |
    sed -E 's/.*name="([^"]*)".*status="([^"]*)".*/  \1 (\2)/' >&2
  [[ ${CI:-} != true ]] || fail "$skipped tests did not run (CI=true: a skip is a failure)"
fi
if ((status)); then
  # ctest printed each failure's output as it came, pages above its summary;
  # a reader of the run's last lines (CI's record) sees only the names. So
  # the end of each failed test's output again, last.
  python3 - "$junit" >&2 <<'PY' || log "could not read the failed tests' output from $junit"
import sys
import xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    if case.get("status") != "fail":
        continue
    lines = (case.findtext("system-out") or "").splitlines()
    print("[ctest-check] the last %d lines of %s:" %
          (min(len(lines), 40), case.get("name")))
    for line in lines[-40:]:
        print("  " + line[:300])
PY
fi
((ran + skipped == registered)) ||
  fail "ctest reported $((ran + skipped)) tests, but $registered are registered (a test was lost, or ctest stopped early)"
exit "$status"
