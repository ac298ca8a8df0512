#!/usr/bin/env bash
# Runs deploy/slurm/ddprun.sbatch for real on a two-node Slurm cluster that
# this test builds on one machine and tears down, also on failure: Debian's
# munged, slurmctld and two slurmd, each slurmd in its own network namespace
# of deploy/local/netns_cluster.sh (node1 = 10.253.0.11, node2 = .12, the
# controller at .1), with its own config, munge key and state in a temp dir;
# nothing of the system's Slurm or munge is used. The job starts the
# rendezvous on node1 and srun's one ddprun per node; the workers of the two
# nodes meet across the bridge. Prints the time from sbatch to completion.
#   slurm_test.sh SOURCE_DIR DDPRUN RENDEZVOUS [MNIST]      (root; 77 = skipped)
# Each worker is a shell script that prints what it was given (token,
# CPUs, node); with MNIST, it then trains it (1 epoch on a slice, Gloo
# across the nodes).
set -euo pipefail
source_dir=$1
ddprun=$2
rendezvous=$3
mnist=${4:-}
netns=$source_dir/deploy/local/netns_cluster.sh
fail() { echo "FAIL: $*" >&2; exit 1; }

if [[ $(id -u) -ne 0 ]] || ! ip netns list >/dev/null 2>&1; then
  # Under CI=true nothing may skip.
  [[ ${CI:-} == true ]] && fail "slurmd and network namespaces need root (CI=true: no skips)"
  echo "SKIP: slurmd and network namespaces need root" >&2
  exit 77
fi
for tool in munged slurmctld slurmd sbatch sinfo scancel nsenter; do
  command -v $tool >/dev/null ||
    fail "$tool not found; apt-get install slurm-wlm munge (scripts/setup.sh does)"
done

work=$(mktemp -d)
chmod 0755 "$work"
name="ddps$$"
pids=()
cleanup() {
  local status=$? pid log
  if ((status != 0)); then
    for log in slurmctld.log slurmd-node1.log slurmd-node2.log munged.log job.out; do
      [[ -f $work/$log ]] && { echo "--- $log" >&2; tail -n 20 "$work/$log" >&2; }
    done
  fi
  [[ -e /run/netns/$name-rdzv ]] &&
    SLURM_CONF=$work/slurm.conf in_ns rdzv scancel --quiet --user root 2>/dev/null || true
  # Stop the daemons this test started, newest first, by their pids.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  "$netns" down "$name" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
# nsenter enters the network namespace only; `ip netns exec` would also
# remount /sys, hiding the cgroup file system slurmd needs.
in_ns() { nsenter --net="/run/netns/$name-$1" "${@:2}"; }

wait_until() {  # SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "$what: not within ${seconds}s"
    sleep 0.1
  done
}

"$netns" up "$name" 2 2>/dev/null

# munge: a fresh key and daemon on a private socket (a file: every namespace
# reaches it).
dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 status=none
chmod 0400 "$work/munge.key"
munged --foreground --force --socket="$work/munge.sock" --key-file="$work/munge.key" \
  --pid-file="$work/munged.pid" --log-file="$work/munged.log" \
  --seed-file="$work/munged.seed" >"$work/munged.out" 2>&1 &
pids+=($!)
wait_until 10 "munged socket" test -S "$work/munge.sock"

cpus=$(nproc)
cat >"$work/slurm.conf" <<CONF
ClusterName=ddprun-test
SlurmctldHost=$(hostname)(10.253.0.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd-%n.log
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
NodeName=node1 NodeHostname=$(hostname) NodeAddr=10.253.0.11 CPUs=$cpus RealMemory=1000 State=UNKNOWN
NodeName=node2 NodeHostname=$(hostname) NodeAddr=10.253.0.12 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
CONF
mkdir -p "$work/state"
export SLURM_CONF=$work/slurm.conf

# nsenter itself, not the in_ns function: $! must be the daemon's own pid
# (nsenter execs it) for the cleanup to stop it.
nsenter --net="/run/netns/$name-rdzv" slurmctld -D -i -f "$SLURM_CONF" \
  >"$work/slurmctld.out" 2>&1 &
pids+=($!)
for node in 1 2; do
  nsenter --net="/run/netns/$name-h$node" slurmd -D -f "$SLURM_CONF" -N "node$node" \
    >"$work/slurmd$node.out" 2>&1 &
  pids+=($!)
done
nodes_idle() {
  [[ $(in_ns rdzv sinfo -h -N -o %T 2>/dev/null | sort -u) == idle ]] &&
    [[ $(in_ns rdzv sinfo -h -N -o %N 2>/dev/null | wc -l) == 2 ]]
}
wait_until 60 "slurm nodes node1 and node2 idle" nodes_idle

# The job: ddprun.sbatch as a user submits it, two nodes, one worker each.
# Each worker first prints what it was given: whether the job's rendezvous
# refuses a caller without the job's token, its CPUs, its node; then, with
# MNIST, trains.
cat >"$work/worker.sh" <<'WORKER'
#!/bin/sh
# Workers get the job's token as a file (DDPRUN_TOKEN_FILE), never the
# variable; it is the job token (this job's Status, not every job's), not
# the server's.
if [ -n "$DDPRUN_TOKEN_FILE" ] && [ -z "$DDPRUN_TOKEN" ] &&
    ! env -u DDPRUN_TOKEN -u DDPRUN_TOKEN_FILE "$DDPRUN" status \
    --rdzv-endpoint "$DDPRUN_STORE_ENDPOINT" --rdzv-id "$TORCHELASTIC_RUN_ID" \
    --timeout 5 >/dev/null 2>&1 &&
    "$DDPRUN" status --token-file "$DDPRUN_TOKEN_FILE" \
    --rdzv-endpoint "$DDPRUN_STORE_ENDPOINT" --rdzv-id "$TORCHELASTIC_RUN_ID" \
    --timeout 5 >/dev/null 2>&1 &&
    ! "$DDPRUN" status --token-file "$DDPRUN_TOKEN_FILE" \
    --rdzv-endpoint "$DDPRUN_STORE_ENDPOINT" --timeout 5 >/dev/null 2>&1; then
  auth=job-token
else
  auth=open
fi
echo "worker rank=$RANK world=$WORLD_SIZE auth=$auth cpus=$SLURM_CPUS_PER_TASK addr=$DDPRUN_LOCAL_ADDR node=$SLURMD_NODENAME"
[ $# -eq 0 ] || exec "$@"
WORKER
chmod +x "$work/worker.sh"
program=("$work/worker.sh")
if [[ -n $mnist ]]; then
  program+=("$mnist" --epochs 1 --data-dir "$source_dir/data/mnist"
            --train-limit 2000 --summary-json "$work/summary.json")
fi
start=$(date +%s.%N)
set +e
DDPRUN=$ddprun DDPRUN_RENDEZVOUS=$rendezvous DDPRUN_NPROC_PER_NODE=1 \
  timeout 300 nsenter --net="/run/netns/$name-rdzv" sbatch --wait --nodes=2 \
  --output="$work/job.out" --chdir="$work" \
  "$source_dir/deploy/slurm/ddprun.sbatch" "${program[@]}" >"$work/sbatch.out" 2>&1
rc=$?
set -e
end=$(date +%s.%N)
((rc == 0)) || { cat "$work/sbatch.out" >&2; fail "sbatch --wait exited $rc"; }
grep -q "^ddprun.sbatch: rendezvous at 10.253.0.11:[0-9]*, 2 node(s) x 1 worker(s), $cpus CPU(s)" \
  "$work/job.out" ||
  fail "the rendezvous was not on node1 (10.253.0.11) for 2 nodes"
if [[ -n $mnist ]]; then
  grep -q '"world_size": *2' "$work/summary.json" ||
    fail "MNIST summary lacks world_size 2: $(cat "$work/summary.json" 2>/dev/null)"
fi
# srun --label: each line starts with the task (node) number; the agent (and
# so its workers) got every CPU of the node (--exclusive, --cpus-per-task),
# not one.
for node in 1 2; do
  grep -q "^$((node - 1)): worker .* cpus=$cpus addr=10.253.0.1$node node=node$node\$" \
    "$work/job.out" ||
    fail "no worker with $cpus CPUs on node$node (10.253.0.1$node), labelled $((node - 1)): \
$(grep 'worker' "$work/job.out")"
done
[[ $(grep -c '^[01]: worker rank=[01] world=2 ' "$work/job.out") == 2 ]] ||
  fail "expected ranks 0 and 1 once each: $(grep 'worker' "$work/job.out")"
[[ $(grep -c ' auth=job-token ' "$work/job.out") == 2 ]] ||
  fail "the job's rendezvous must require a token, and the workers must hold the job token, \
not the server's: $(grep 'worker' "$work/job.out")"
# Nothing of the job may outlive it.
if pgrep -f -- "--rdzv-id slurm-" >/dev/null; then
  fail "processes of the job are still running: $(pgrep -af -- '--rdzv-id slurm-')"
fi
# sbatch --wait polls the controller (up to every 10 s), so its wall time
# overstates the job; the controller's log has submit and completion to the ms.
ms_of() {  # PATTERN -> milliseconds of the day of that slurmctld.log line
  sed -n "s/^\[[0-9-]*T\([0-9:.]*\)\] .*$1.*/\1/p" "$work/slurmctld.log" | head -n 1 |
    awk -F'[:.]' '{print (($1 * 60 + $2) * 60 + $3) * 1000 + $4}'
}
submitted=$(ms_of '_slurm_rpc_submit_batch_job: JobId=')
completed=$(ms_of '_job_complete: JobId=.* done')
printf 'PASS: two Slurm nodes in network namespaces, 1 worker each%s: submit to completion %.2f s in slurmctld; sbatch --wait returned after %.1f s\n' \
  "${mnist:+, MNIST}" "$(awk -v a="$submitted" -v b="$completed" 'BEGIN{print (b - a) / 1000}')" \
  "$(awk -v a="$start" -v b="$end" 'BEGIN{print b - a}')"
