#!/usr/bin/env bash
# Checks the systemd units with `systemd-analyze verify`: the unit files as
# installed (with the TLS drop-in, and the agent template as an instance),
# their ExecStart programs resolved to this build's binaries. Any warning
# (unknown key, bad value, missing program) fails the test. When the
# programs are given, every --flag an ExecStart line passes must appear in
# the program's --help.
#   systemd_verify_test.sh SOURCE_DIR [DDPRUN RENDEZVOUS]
set -euo pipefail
source_dir=$1
ddprun=${2:-}
rendezvous=${3:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v systemd-analyze >/dev/null ||
  fail "systemd-analyze not found; apt-get install systemd"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/units/ddprun-rendezvous.service.d"
link_or_stub() {  # NAME [REAL_PATH]
  if [[ -n ${2:-} ]]; then
    [[ -x $2 ]] || fail "$2 is not an executable"
    ln -s "$2" "$work/bin/$1"
  else
    # Not built here: the units are still checked, against a placeholder.
    printf '#!/bin/sh\nexit 0\n' >"$work/bin/$1"
    chmod +x "$work/bin/$1"
  fi
}
link_or_stub ddprun "$ddprun"
link_or_stub ddprun-rendezvous "$rendezvous"

for unit in ddprun-rendezvous.service ddprun-agent@.service; do
  sed -e "s|@DDPRUN_BINDIR@|$work/bin|g" -e "s|@DDPRUN_DOCDIR@|$work/doc|g" \
    "$source_dir/deploy/systemd/$unit.in" >"$work/units/$unit"
  grep -q '@[A-Z_]*@' "$work/units/$unit" && fail "$unit has an unreplaced @VAR@"
done
cp "$source_dir/deploy/systemd/tls.conf" "$work/units/ddprun-rendezvous.service.d/"
cp "$work/units/ddprun-agent@.service" "$work/units/ddprun-agent@job1.service"

cd "$work/units"
for unit in ddprun-rendezvous.service ddprun-agent@job1.service; do
  if ! systemd-analyze verify "$unit" >"$work/verify.out" 2>&1; then
    cat "$work/verify.out" >&2
    fail "systemd-analyze verify $unit"
  fi
  # verify exits 0 on unknown keys and bad values; it only prints them.
  if [[ -s $work/verify.out ]]; then
    cat "$work/verify.out" >&2
    fail "systemd-analyze verify $unit printed warnings"
  fi
done

# The contract the units promise in their comments.
r=ddprun-rendezvous.service
grep -qx 'DynamicUser=yes' $r || fail "$r must run unprivileged (DynamicUser=yes)"
grep -qx 'Restart=on-failure' $r || fail "$r must restart on failure"
grep -q '^LoadCredential=token:' $r || fail "$r must load the token as a credential"
grep -q -- '--token-file ${CREDENTIALS_DIRECTORY}/token' $r ||
  fail "$r must read the token from \$CREDENTIALS_DIRECTORY"
a=ddprun-agent@job1.service
# One worker killed by the kernel's OOM killer is ddprun's to handle.
grep -qx 'OOMPolicy=continue' $a || fail "$a must keep running after an OOM kill"
# An agent that found no rendezvous (exit 75) is started again.
grep -qx 'RestartForceExitStatus=75' $a ||
  fail "$a must restart an agent that exited 75 (rendezvous unreachable)"
grep -q '^LoadCredential=tls-cert:' ddprun-rendezvous.service.d/tls.conf ||
  fail "tls.conf must load the certificate as a credential"

# Every flag the units pass exists in the real programs.
check_flags() {  # PROGRAM FILE...
  local help flag
  help=$("$work/bin/$1" --help 2>&1) || fail "$1 --help failed: $help"
  # Comment lines hold shell examples (systemctl --now), not the program's flags.
  for flag in $(grep -hv '^#' "${@:2}" | grep -o -- "--[a-z][a-z-]*" | sort -u); do
    grep -q -- "$flag" <<<"$help" || fail "$1 has no flag $flag (used in ${*:2})"
  done
}
if [[ -n $rendezvous ]]; then
  check_flags ddprun-rendezvous ddprun-rendezvous.service ddprun-rendezvous.service.d/tls.conf
fi
if [[ -n $ddprun ]]; then
  grep '^ExecStart=' ddprun-agent@job1.service >"$work/agent-exec"
  check_flags ddprun "$work/agent-exec"
fi
echo "PASS: systemd-analyze verify clean for $r (with tls.conf) and ddprun-agent@job1.service"
