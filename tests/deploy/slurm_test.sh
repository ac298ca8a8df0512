#!/usr/bin/env bash
# Runs deploy/slurm/ddprun.sbatch for real on a one-node Slurm cluster that
# this test starts from Debian's munged, slurmctld and slurmd (own config,
# socket, ports and state in a temp dir; nothing of the system's is used) and
# tears down, also on failure. Prints the time from sbatch to completion.
#   slurm_test.sh SOURCE_DIR DDPRUN RENDEZVOUS [MNIST]      (root; 77 = skipped)
# With MNIST, the job trains it (2 workers, 1 epoch on a slice); without, the
# workers are a shell script that prints the environment ddprun gave it.
set -euo pipefail
source_dir=$1
ddprun=$2
rendezvous=$3
mnist=${4:-}
fail() { echo "FAIL: $*" >&2; exit 1; }

if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: slurmd must run as root" >&2
  exit 77
fi
for tool in munged slurmctld slurmd sbatch sinfo scontrol scancel; do
  command -v $tool >/dev/null ||
    fail "$tool not found; apt-get install slurm-wlm munge (scripts/setup.sh does)"
done

work=$(mktemp -d)
chmod 0755 "$work"
pids=()
cleanup() {
  local status=$?
  if ((status != 0)); then
    for log in slurmctld.log slurmd.log munged.log job.out; do
      [[ -f $work/$log ]] && { echo "--- $log" >&2; tail -n 30 "$work/$log" >&2; }
    done
  fi
  [[ -f $work/slurm.conf ]] && SLURM_CONF=$work/slurm.conf scancel --quiet --user root 2>/dev/null || true
  # Stop the daemons this test started, newest first, by their pids.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

wait_until() {  # SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "$what: not within ${seconds}s"
    sleep 0.1
  done
}

# Ports the kernel hands out now; Slurm cannot bind port 0 itself.
read -r ctld_port slurmd_port < <(/usr/bin/python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')

# munge: a fresh key and daemon on a private socket.
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 status=none
chmod 0400 "$work/munge.key"
munged --foreground --force --socket="$work/munge.sock" --key-file="$work/munge.key" \
  --pid-file="$work/munged.pid" --log-file="$work/munged.log" \
  --seed-file="$work/munged.seed" >"$work/munged.out" 2>&1 &
pids+=($!)
wait_until 10 "munged socket" test -S "$work/munge.sock"

node=ddprun-test-node
cpus=$(nproc)
cat >"$work/slurm.conf" <<CONF
ClusterName=ddprun-test
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SchedulerType=sched/builtin
NodeName=$node NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
mkdir -p "$work/state" "$work/spool"
export SLURM_CONF=$work/slurm.conf

slurmctld -D -i -f "$SLURM_CONF" >"$work/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$node" >"$work/slurmd.out" 2>&1 &
pids+=($!)
node_idle() { [[ $(sinfo -h -n "$node" -o %T 2>/dev/null) == idle ]]; }
wait_until 60 "slurm node $node idle" node_idle

# The job: ddprun.sbatch as a user submits it.
if [[ -n $mnist ]]; then
  program=("$mnist" --epochs 1 --data-dir "$source_dir/data/mnist"
           --train-limit 2000 --summary-json "$work/summary.json")
else
  cat >"$work/worker.sh" <<'WORKER'
#!/bin/sh
echo "worker rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK"
WORKER
  chmod +x "$work/worker.sh"
  program=("$work/worker.sh")
fi
start=$(date +%s.%N)
set +e
DDPRUN=$ddprun DDPRUN_RENDEZVOUS=$rendezvous DDPRUN_NPROC_PER_NODE=2 \
  timeout 300 sbatch --wait --nodes=1 --output="$work/job.out" \
  --chdir="$work" "$source_dir/deploy/slurm/ddprun.sbatch" "${program[@]}" \
  >"$work/sbatch.out" 2>&1
rc=$?
set -e
end=$(date +%s.%N)
((rc == 0)) || { cat "$work/sbatch.out" >&2; fail "sbatch --wait exited $rc"; }
grep -q '^ddprun.sbatch: rendezvous at ' "$work/job.out" ||
  fail "the job did not report its rendezvous"
if [[ -n $mnist ]]; then
  grep -q '"world_size": *2' "$work/summary.json" ||
    fail "MNIST summary lacks world_size 2: $(cat "$work/summary.json" 2>/dev/null)"
else
  for rank in 0 1; do
    grep -q "worker rank=$rank world=2" "$work/job.out" ||
      fail "no worker rank $rank of 2 in the job output"
  done
fi
# Nothing of the job may outlive it.
if pgrep -f -- "--rdzv-id slurm-" >/dev/null; then
  fail "processes of the job are still running: $(pgrep -af -- '--rdzv-id slurm-')"
fi
printf 'PASS: sbatch to completion %.1f s (one node, 2 workers%s)\n' \
  "$(awk -v a="$start" -v b="$end" 'BEGIN{print b - a}')" "${mnist:+, MNIST}"
