#!/usr/bin/env bash
# Scrapes the real rendezvous' /metrics while a two-agent job runs through it.
# Contract checked:
#   ddprun-rendezvous --port 0 --metrics-port 0 prints, after its first line
#   "ddprun-rendezvous listening on HOST:PORT", the line
#   "ddprun-rendezvous metrics on http://HOST:PORT/metrics"; a scrape there
#   is Prometheus text with every RPC by method and code (heartbeats, store
#   operations), their latency, and the jobs' rounds and nodes.
#   rendezvous_metrics_test.sh DDPRUN RENDEZVOUS
set -euo pipefail
ddprun=$1
rendezvous=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

: >"$work/out"  # the loop below may read it before the server's shell opens it
"$rendezvous" --port 0 --metrics-port 0 >"$work/out" 2>"$work/err" &
pids+=($!)
url=
for _ in $(seq 300); do
  url=$(sed -n 's/^ddprun-rendezvous metrics on //p' "$work/out")
  [[ -n $url ]] && break
  sleep 0.1
done
[[ -n $url ]] || fail "no 'metrics on URL' line: $(cat "$work/out" "$work/err")"
endpoint=$(sed -n 's/^ddprun-rendezvous listening on //p' "$work/out")
[[ $(head -n 1 "$work/out") == "ddprun-rendezvous listening on "* ]] ||
  fail "the listening line must stay the first stdout line"

scrape() {  # prints the body; fails on a non-200 or a wrong content type
  /usr/bin/python3 - "$url" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
    assert r.status == 200, r.status
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers["Content-Type"]
    sys.stdout.write(r.read().decode())
PY
}
heartbeats() {  # BODY -> heartbeats answered OK: unary calls + streamed beats
  awk '/^ddprun_grpc_server_handled_total\{service="ddprun.v1.Rendezvous",method="Heartbeat",code="OK"\}/ ||
       /^ddprun_rendezvous_streamed_heartbeats_total/ {n += $2} END {print n + 0}' <<<"$1"
}

body=$(scrape) || fail "scrape of $url failed"
for family in 'ddprun_grpc_server_handled_total counter' \
              'ddprun_grpc_server_handling_seconds histogram' \
              'ddprun_rendezvous_round gauge' \
              'ddprun_rendezvous_nodes gauge' \
              'ddprun_rendezvous_streamed_heartbeats_total counter'; do
  grep -q "^# TYPE $family\$" <<<"$body" || fail "no '# TYPE $family' in: $body"
done

# Two agents whose workers use the store, and hold the job open for a while.
printf '#!/bin/sh\nsleep 2\n' >"$work/worker.sh"
chmod +x "$work/worker.sh"
for node in 0 1; do
  "$ddprun" --nnodes 2 --nproc-per-node 1 --rdzv-endpoint "$endpoint" \
    --rdzv-id metrics-job "$work/worker.sh" >"$work/agent$node.out" 2>&1 &
  pids+=($!)
done
jobs_seen=
for _ in $(seq 100); do
  body=$(scrape)
  if grep -q 'run_id="metrics-job"' <<<"$body"; then jobs_seen=1; break; fi
  sleep 0.1
done
[[ -n $jobs_seen ]] || fail "the running job never showed in /metrics: $body"
for node in 0 1; do
  wait "${pids[$((node + 1))]}" || fail "agent $node failed: $(cat "$work/agent$node.out")"
done
body=$(scrape)
beats=$(heartbeats "$body")
[[ -n $beats && $beats -gt 0 ]] || fail "no Heartbeat calls counted after a job: $body"
echo "PASS: /metrics of the real rendezvous during a job; $beats heartbeats counted"
