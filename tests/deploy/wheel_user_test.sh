#!/usr/bin/env bash
# A new user's steps with the wheel: a fresh virtual environment of PYTHON
# (one with torch, which pip cannot fetch here: --system-site-packages),
# `pip install` of the wheel file, then an unmodified env:// torch.distributed
# program (wheel/first_step.py) at world 2 under the installed ddprun:
# standalone, two agents on one endpoint, the static form; `ddprun --version`
# and `ddprun status` against the installed ddprun-rendezvous.
# The venv is not activated and PATH's python3 is not the venv's: ddprun must
# still run the venv's Python (the workers report sys.prefix).
#   wheel_user_test.sh WHEEL PYTHON
set -euo pipefail
(($# == 2)) || { echo "usage: $0 WHEEL PYTHON" >&2; exit 2; }
wheel=$(realpath "$1") python=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$work"/*.log; do [[ -f $f ]] && { echo "--- $f"; tail -n 20 "$f"; } >&2; done; exit 1; }
log() { printf '[wheel-user] %s\n' "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}'; }

venv=$work/venv
start=$(now)
"$python" -m venv --system-site-packages "$venv" || fail "python -m venv failed"
"$venv/bin/pip" install --no-index --no-deps --no-cache-dir --disable-pip-version-check -q "$wheel" ||
  fail "pip install $wheel failed"
log "venv and pip install: $(since "$start") s"
[[ $(PATH=$venv/bin:/usr/bin:/bin command -v ddprun) == "$venv/bin/ddprun" ]] ||
  fail "ddprun is not on the environment's PATH"
for p in ddprun-rendezvous ddprun-relay; do
  [[ -x $venv/bin/$p ]] || fail "$p is not in $venv/bin"
  "$venv/bin/$p" --version >/dev/null || fail "$p --version failed"
done
version=$("$venv/bin/ddprun" --version) || fail "ddprun --version failed"
log "$version"
"$venv/bin/python" -c 'import ddprun' || fail "the ddprun Python package is not importable"
# PATH without the venv; no PYTHON_EXEC: the interpreter beside ddprun runs.
export PATH=/usr/local/bin:/usr/bin:/bin
unset PYTHON_EXEC VIRTUAL_ENV
ddprun=$venv/bin/ddprun

# check_job NAME: both ranks stepped, in the venv's Python.
check_job() {
  local out=$work/$1 r
  for r in 0 1; do
    [[ -f $out/rank_$r ]] || fail "$1: rank $r wrote no result"
    read -r world value prefix <"$out/rank_$r"
    [[ $world == 2 && $value == 3.0 ]] || fail "$1: rank $r saw world $world, sum $value"
    [[ $prefix == "$venv" ]] || fail "$1: rank $r ran under $prefix, not the venv $venv"
  done
  log "$1: world 2 stepped under the venv's Python ($(since "$form_start") s)"
}
free_port() { "$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
job=$here/wheel/first_step.py

# Standalone, timed from pip install's start to the first step.
form_start=$(now)
mkdir -p "$work/standalone"
timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$job" "$work/standalone" \
  >"$work/standalone.log" 2>&1 || fail "standalone job failed"
check_job standalone
log "pip install to the first step at world 2: $(since "$start") s"

# Two agents, one endpoint (the first serves the rendezvous in-process).
form_start=$(now)
mkdir -p "$work/endpoint"
port=$(free_port)
for n in 0 1; do
  timeout 120 "$ddprun" --nnodes 2 --nproc-per-node 1 --rdzv-endpoint "127.0.0.1:$port" \
    --rdzv-id wheel "$job" "$work/endpoint" >"$work/endpoint$n.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || fail "an agent of the endpoint job failed"; done
pids=()
check_job endpoint

# The static form: node rank 0 serves at the master address.
form_start=$(now)
mkdir -p "$work/static"
port=$(free_port)
for n in 0 1; do
  timeout 120 "$ddprun" --nnodes 2 --node-rank "$n" --nproc-per-node 1 \
    --master-addr 127.0.0.1 --master-port "$port" "$job" "$work/static" \
    >"$work/static$n.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || fail "an agent of the static job failed"; done
pids=()
check_job static

# ddprun status against the wheel's ddprun-rendezvous, after a job there.
: >"$work/rdzv.out"  # the loop below may read it before the server's shell opens it
"$venv/bin/ddprun-rendezvous" --port 0 >"$work/rdzv.out" 2>"$work/rdzv.log" &
pids+=($!)
endpoint=
for _ in $(seq 100); do
  endpoint=$(sed -n 's/^ddprun-rendezvous listening on //p' "$work/rdzv.out")
  [[ -n $endpoint ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || fail "ddprun-rendezvous exited"
  sleep 0.1
done
[[ -n $endpoint ]] || fail "ddprun-rendezvous did not say where it listens within 10 s"
form_start=$(now)
mkdir -p "$work/server"
timeout 120 "$ddprun" --nnodes 1 --nproc-per-node 2 --rdzv-endpoint "$endpoint" \
  --rdzv-id wheel-status "$job" "$work/server" >"$work/server.log" 2>&1 ||
  fail "the job against ddprun-rendezvous failed"
check_job server
"$ddprun" status --rdzv-endpoint "$endpoint" >"$work/status.out" 2>"$work/status.log" ||
  fail "ddprun status failed"
grep -q wheel-status "$work/status.out" || fail "ddprun status does not list the job: $(cat "$work/status.out")"
log "ddprun status lists the job"
log "passed"
