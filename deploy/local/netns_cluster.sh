#!/usr/bin/env bash
# A multi-host ddprun cluster on one machine: the rendezvous and N hosts, each
# in its own network namespace, wired to one bridge that lives in a namespace
# of its own. The addresses (10.253.0.0/24) exist only inside the namespaces
# this script creates: the machine's own network namespace gets no address,
# route or interface from it, so no traffic ever leaves the namespaces.
#
#   netns_cluster.sh demo [--hosts N] [--nproc-per-node K] [PROGRAM ARGS...]
#       up, start the rendezvous, run one ddprun per host, wait, down.
#       Default program: ddprun-mnist --epochs 1. Exit status: the first
#       failing agent's, else 0. The rendezvous requires a token: a random
#       one for this demo, in the environment (DDPRUN_TOKEN) of the
#       rendezvous and the agents.
#   netns_cluster.sh up NAME N           create NAME-sw, NAME-rdzv, NAME-h1..hN
#   netns_cluster.sh exec NAME NODE CMD  run CMD in node rdzv or hI
#   netns_cluster.sh partition NAME NODE cut NODE off the bridge
#   netns_cluster.sh heal NAME NODE      plug it back in
#   netns_cluster.sh down NAME           delete every namespace of NAME
#
# Needs root and iproute2. Programs: DDPRUN, DDPRUN_RENDEZVOUS (default: on
# PATH). Addresses: rdzv 10.253.0.1, hI 10.253.0.(10+I).
set -euo pipefail

subnet=10.253.0
rdzv_port=29400
log() { printf '[netns] %s\n' "$*" >&2; }
die() { printf '[netns] error: %s\n' "$*" >&2; exit 1; }

addr_of() {  # NODE
  case $1 in
    rdzv) echo "$subnet.1" ;;
    h[0-9]*) echo "$subnet.$((10 + ${1#h}))" ;;
    *) die "unknown node '$1'; use rdzv or h1, h2, ..." ;;
  esac
}

cmd_up() {  # NAME N
  local name=$1 hosts=$2 node
  [[ $hosts =~ ^[0-9]+$ ]] && ((hosts >= 1 && hosts <= 200)) ||
    die "host count '$hosts' must be 1..200"
  ip netns list | grep -q "^$name-sw\b" && die "cluster $name exists; run: $0 down $name"
  ip netns add "$name-sw"
  ip -n "$name-sw" link add br0 type bridge
  ip -n "$name-sw" link set br0 up
  for node in rdzv $(seq -f 'h%g' 1 "$hosts"); do
    ip netns add "$name-$node"
    # eth0 inside the node, p-NODE on the bridge: names are per namespace.
    ip link add eth0 netns "$name-$node" type veth peer name "p-$node" netns "$name-sw"
    ip -n "$name-sw" link set "p-$node" master br0 up
    ip -n "$name-$node" addr add "$(addr_of "$node")/24" dev eth0
    ip -n "$name-$node" link set eth0 up
    ip -n "$name-$node" link set lo up
  done
  log "cluster $name: rendezvous $(addr_of rdzv), hosts h1..h$hosts ($subnet.11..)"
}

cmd_down() {  # NAME
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^$1-\(sw\|rdzv\|h[0-9]*\)$" || true); do
    # Processes still in a namespace keep it alive: stop them first.
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill $pids 2>/dev/null || true
    ip netns del "$ns"
  done
}

cmd_exec() {  # NAME NODE CMD...
  local name=$1 node=$2
  shift 2
  addr_of "$node" >/dev/null
  exec ip netns exec "$name-$node" "$@"
}

cmd_partition() { ip -n "$1-sw" link set "p-$2" down; }
cmd_heal() { ip -n "$1-sw" link set "p-$2" up; }

demo_pids=()
demo_ok=0
demo_teardown() {  # NAME LOGS
  local pid
  for pid in "${demo_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${demo_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  cmd_down "$1"
  # The hosts' output was printed; keep the logs only when something failed.
  if ((demo_ok)) && [[ -z ${DDPRUN_KEEP_LOGS:-} ]]; then
    rm -rf "$2"
    log "cluster $1 removed"
  else
    log "cluster $1 removed; logs in $2"
  fi
}

cmd_demo() {
  local hosts=2 nproc=1
  while (($#)); do
    case $1 in
      --hosts) hosts=$2; shift 2 ;;
      --nproc-per-node) nproc=$2; shift 2 ;;
      *) break ;;
    esac
  done
  (($#)) || set -- ddprun-mnist --epochs 1
  local ddprun=${DDPRUN:-ddprun} rendezvous=${DDPRUN_RENDEZVOUS:-ddprun-rendezvous}
  local name="ddpl$$" logs
  logs=$(mktemp -d)
  demo_pids=()
  # shellcheck disable=SC2064  # expand now: the values are fixed
  trap "demo_teardown $name $logs" EXIT
  cmd_up "$name" "$hosts"
  DDPRUN_TOKEN=$(head -c 32 /dev/urandom | base64)
  export DDPRUN_TOKEN

  ip netns exec "$name-rdzv" "$rendezvous" --host "$(addr_of rdzv)" --port "$rdzv_port" \
    >"$logs/rendezvous.out" 2>"$logs/rendezvous.err" &
  demo_pids+=($!)
  local _
  for _ in $(seq 300); do
    grep -q '^ddprun-rendezvous listening on ' "$logs/rendezvous.out" && break
    kill -0 "${demo_pids[0]}" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^ddprun-rendezvous listening on ' "$logs/rendezvous.out" ||
    die "the rendezvous did not start: $(cat "$logs/rendezvous.err")"

  local i agents=()
  for i in $(seq 1 "$hosts"); do
    ip netns exec "$name-h$i" "$ddprun" --nnodes "$hosts" --nproc-per-node "$nproc" \
      --rdzv-endpoint "$(addr_of rdzv):$rdzv_port" --rdzv-id "netns-$name" \
      --local-addr "$(addr_of "h$i")" "$@" >"$logs/h$i.out" 2>"$logs/h$i.err" &
    agents+=($!)
    demo_pids+=($!)
  done
  local status=0 rc
  for i in "${!agents[@]}"; do
    rc=0
    wait "${agents[i]}" || rc=$?
    if ((rc != 0)); then
      log "host h$((i + 1)) exited $rc; its stderr:"
      tail -n 20 "$logs/h$((i + 1)).err" >&2
      ((status == 0)) && status=$rc
    fi
  done
  cat "$logs"/h*.out
  ((status == 0)) && demo_ok=1
  return "$status"
}

(($#)) || { sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "network namespaces need root"
command -v ip >/dev/null || die "ip not found; apt-get install iproute2"
command=$1
shift
case $command in
  up) (($# == 2)) || die "usage: $0 up NAME N"; cmd_up "$@" ;;
  down) (($# == 1)) || die "usage: $0 down NAME"; cmd_down "$1" ;;
  exec) (($# >= 3)) || die "usage: $0 exec NAME NODE CMD..."; cmd_exec "$@" ;;
  partition) (($# == 2)) || die "usage: $0 partition NAME NODE"; cmd_partition "$@" ;;
  heal) (($# == 2)) || die "usage: $0 heal NAME NODE"; cmd_heal "$@" ;;
  demo) cmd_demo "$@" ;;
  *) die "unknown command '$command'; see $0 with no arguments" ;;
esac
