#!/usr/bin/env python3
"""ddprun's randomized fault harness: a seeded run of real faults against a
real job, and the invariants every run must keep.

The job: ddprun-rendezvous on a kernel-chosen port, two ddprun agents (two
nodes of this host, --nnodes 2: a fixed world of 4) with two ddprun-mnist
workers each (--nproc-per-node), real MNIST, checkpoints on, default hang bounds. First a
fault-free run of the same command (the reference), then the faulted run(s):
a seeded plan of faults, each of a worker, an agent or the server:

  worker-kill      kill -9
  worker-hang      SIGSTOP for good
  worker-block     blocked for good after its step, or at the end of the
                   checkpoint write or evaluation it is in, asleep without
                   using CPU (a deadlock: SIGUSR2 to ddprun-mnist, which then
                   runs with --test-block-on-sigusr2); only when --kinds
                   names it, so that the default kinds keep CI's seeded plans
  worker-spin      spinning for good after its step, running on one core,
                   or at the end of the checkpoint write or evaluation it
                   is in when it went through one before (a loop that
                   never ends: as worker-block, with --test-spin-on-sigusr2);
                   only when --kinds names it, and not in one run with
                   worker-block (one signal for both)
  worker-pause     SIGSTOP, then SIGCONT 1-3 s later
  worker-throttle  a straggler: 20 % of one core for 3-6 s (a CPU cgroup
                   quota; where no cgroup can be made, stopped 40 ms of
                   every 100 ms instead, which the agent may take for a hang)
  agent-kill       kill -9, the agent started again 2 s later
  agent-pause      SIGSTOP, SIGCONT 2 s later
  server-kill      kill -9, started again on its port
  server-pause     SIGSTOP, SIGCONT 2 s later
  node-partition   a node's cable pulled for 1-4 s, then plugged back in:
                   its packets, and those to it, are dropped without a
                   reset (the agent and its workers go on running)

With node-partition among the kinds, every run of the job (the reference
too) runs in network namespaces (deploy/local/netns_cluster.sh: the server
and each node in its own, wired to one bridge; the cluster is removed on
every exit): that needs root and iproute2.

Each lands at a seeded moment: at a random step, or deliberately inside a
round change (the moment a new round is announced: round formation and the
state sync), inside the first step of a replacement (the moment it is
started), or at a checkpoint step (checkpoints every 20 steps). A fault
waits until the job has recovered from the one before (a step completed
after it ended).

Invariants, checked from what the processes leave, not from what they say:
  - the job finishes: every agent exits 0;
  - no gap between consecutive completed steps (from the step times every
    rank appends: --step-times) is longer than the fault's own length (a
    pause, an agent's restart delay) plus --recovery-bound;
  - the final model is bit-identical to the reference run's (the saved
    files' bytes);
  - the restart count the agents were told equals the faults that needed a
    new round (a worker killed, hung or paused past the stopped bound), less
    at most one for each fault that landed inside another's recovery (both
    are then recovered by one round);
  - nothing is left: no process of the run (agents, workers, their orphan
    guards, the server), no shared-memory folder the job used.

It prints one line per fault with the time lost to it (from the last step
completed before it, or before the kill that opened its round change, to
three steps past the first step completed after it ended, less as many
median steps), a summary per kind, and one closing line for ctest:
"N passed, M failed". Exit 0 when every invariant held.

  fault_harness.py --build BUILD --data-dir DIR [--seed S] [--faults N]
      [--kinds k1,k2,...] [--soak-seconds T] [--json FILE]

--soak-seconds runs faulted runs with successive seeds until that much time
has passed (bench/fault/soak.sh: 30 minutes, hundreds of faults).
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

KINDS = ("worker-kill", "worker-hang", "worker-pause", "worker-throttle",
         "agent-kill", "agent-pause", "server-kill", "server-pause",
         "node-partition")
# Kinds that run only when --kinds names them.
EXTRA_KINDS = ("worker-block", "worker-spin")
MOMENTS = ("step", "round-change", "first-step", "checkpoint")
# Faults after which the job needs a new round (and a restart): the worker
# is gone, or stopped past the agent's stopped bound (0.1 s) and killed, or
# blocked past the blocked bound (or spinning past the spin bound) and
# killed.
NEEDS_ROUND = ("worker-kill", "worker-hang", "worker-pause", "worker-block",
               "worker-spin")
# Faults that may or may not need a new round: a partition is ridden out
# when it is shorter than the peers' bounds, else recovered by one.
MAY_NEED_ROUND = ("node-partition",)
PARTITION_SECONDS = (1.0, 4.0)
AGENT_RESTART_DELAY = 2.0
PAUSE_SECONDS = 2.0
CHECKPOINT_EVERY = 20
NODES = 2


def log(message):
    print("[fault %s] %s" % (time.strftime("%H:%M:%S"), message), flush=True)


def wait_for(predicate, timeout, interval=0.02):
    """Polls `predicate` until it returns a true value or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def state(pid):
    """The process state letter of /proc/PID/stat ("" when gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return False


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def comm(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return ""


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


class CpuThrottle:
    """A CPU quota on one process, as a throttled container or a noisy
    neighbour makes it: its threads stay runnable (state R), unlike a
    SIGSTOP duty cycle, which the agent would rightly see as stopped. A
    cgroup of its own (v2 cpu.max, or v1 cpu.cfs_quota_us), removed after."""

    def __init__(self, pid, share):
        self.pid = pid
        self.path = None
        self.home = None
        for root, v2 in (("/sys/fs/cgroup", True), ("/sys/fs/cgroup/cpu", False)):
            if v2 and not os.path.exists(os.path.join(root, "cgroup.controllers")):
                continue
            if not v2 and not os.path.exists(os.path.join(root, "cpu.cfs_quota_us")):
                continue
            home = self._cgroup_of(pid, v2)
            if home is None:
                continue
            path = os.path.join(root, "ddprun-fault-%d-%d" % (os.getpid(), pid))
            try:
                os.mkdir(path)
                if v2:
                    self._write(path, "cpu.max", "%d 100000" % int(share * 100000))
                else:
                    self._write(path, "cpu.cfs_period_us", "100000")
                    self._write(path, "cpu.cfs_quota_us", str(int(share * 100000)))
                self._write(path, "cgroup.procs", str(pid))
            except OSError:
                try:
                    os.rmdir(path)
                except OSError:
                    pass
                continue
            self.path = path
            self.home = os.path.join(root, home.lstrip("/"))
            return

    @staticmethod
    def _cgroup_of(pid, v2):
        try:
            with open("/proc/%d/cgroup" % pid) as f:
                for line in f:
                    _, controllers, path = line.rstrip("\n").split(":", 2)
                    if (v2 and controllers == "") or \
                            (not v2 and "cpu" in controllers.split(",")):
                        return path
        except OSError:
            pass
        return None

    @staticmethod
    def _write(folder, name, value):
        with open(os.path.join(folder, name), "w") as f:
            f.write(value)

    def release(self):
        if self.path is None:
            return
        try:
            self._write(self.home, "cgroup.procs", str(self.pid))
        except OSError:
            pass  # gone: the cgroup empties with it
        wait_for(lambda: self._removed(), 5, 0.05)

    def _removed(self):
        try:
            os.rmdir(self.path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False


def signal_pid(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class Cluster:
    """The job's hosts as network namespaces (deploy/local/netns_cluster.sh):
    the server in NAME-rdzv, node i in NAME-h<i+1>, one bridge between them.
    Addresses: the server 10.253.0.1, node i 10.253.0.(11+i)."""

    def __init__(self, script):
        self.script = script
        self.name = "ddpf%d" % os.getpid()

    def _run(self, *words):
        subprocess.run(["bash", self.script] + list(words), check=True,
                       stdout=subprocess.DEVNULL)

    def up(self):
        self.down()  # one left by a killed run of the same pid
        self._run("up", self.name, str(NODES))

    def down(self):
        subprocess.run(["bash", self.script, "down", self.name],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @staticmethod
    def host(node):
        return "rdzv" if node is None else "h%d" % (node + 1)

    @staticmethod
    def address(node):
        return "10.253.0.1" if node is None else "10.253.0.%d" % (11 + node)

    def prefix(self, node):
        """Runs a command in `node`'s namespace (None: the server's)."""
        return ["ip", "netns", "exec", "%s-%s" % (self.name, self.host(node))]

    def partition(self, node):
        self._run("partition", self.name, self.host(node))

    def heal(self, node):
        self._run("heal", self.name, self.host(node))


class Job:
    """One run of the job: the server, the agents, their logs and files."""

    def __init__(self, args, folder, run_id):
        self.args = args
        self.folder = folder
        self.run_id = run_id
        os.makedirs(folder, exist_ok=True)
        self.steps_path = os.path.join(folder, "steps.txt")
        self.model_path = os.path.join(folder, "final.pt")
        self.server = None
        self.server_port = 0
        self.server_starts = 0
        self.agents = [None] * NODES
        self.agent_starts = [0] * NODES
        self.agent_logs = []
        self.seen_pids = set()
        self.guard_sessions = set()
        self.cluster = args.cluster
        self.env = dict(os.environ)
        if self.cluster:
            # Beyond loopback the server wants a token; any will do here.
            self.env["DDPRUN_TOKEN"] = "fault-harness-%d-%s" % (
                os.getpid(), run_id)

    # --- processes ---------------------------------------------------------
    def start_server(self):
        self.server_starts += 1
        out = os.path.join(self.folder, "server%d.log" % self.server_starts)
        for _ in range(100):  # the old port may take a moment to free
            argv = [os.path.join(self.args.build, "rendezvous/ddprun-rendezvous"),
                    "--port", str(self.server_port)]
            if self.cluster:
                argv = self.cluster.prefix(None) + argv + [
                    "--host", Cluster.address(None)]
            with open(out, "w") as f:
                self.server = subprocess.Popen(
                    argv, stdout=f, stderr=subprocess.STDOUT,
                    start_new_session=True, env=self.env)
            port = wait_for(lambda: self._announced_port(out), 10)
            if port:
                self.server_port = port
                self.seen_pids.add(self.server.pid)
                return
            self.server.kill()
            self.server.wait()
            time.sleep(0.1)
        raise RuntimeError("ddprun-rendezvous did not start; see %s" % out)

    def _announced_port(self, out):
        if self.server.poll() is not None:
            return -1
        with open(out) as f:
            m = re.search(r"ddprun-rendezvous listening on [^ ]+:(\d+)\n", f.read())
        return int(m.group(1)) if m else None

    def start_agent(self, node):
        self.agent_starts[node] += 1
        path = os.path.join(self.folder, "agent%d.%d.log" %
                            (node, self.agent_starts[node]))
        self.agent_logs.append(path)
        host = Cluster.address(None) if self.cluster else "127.0.0.1"
        argv = [os.path.join(self.args.build, "launcher/ddprun"),
                "--nnodes", str(NODES),
                "--nproc-per-node", str(self.args.nproc_per_node),
                "--rdzv-endpoint", "%s:%d" % (host, self.server_port),
                "--rdzv-id", self.run_id, "--max-restarts", "1000",
                "--log-dir", os.path.join(self.folder, "logs"),
                "--no-python"] + self.args.agent_flags.split() + [
                os.path.join(self.args.build, "mnist/ddprun-mnist"),
                "--data-dir", self.args.data_dir,
                "--train-limit", str(self.args.train_limit),
                "--test-limit", "1000",
                "--epochs", str(self.args.epochs),
                "--checkpoint-dir", os.path.join(self.folder, "checkpoints"),
                "--checkpoint-every", str(CHECKPOINT_EVERY),
                "--step-times", self.steps_path,
                "--save", self.model_path] + self.args.mnist_flags.split()
        if "worker-block" in self.args.kinds.split(","):
            argv.append("--test-block-on-sigusr2")
        if "worker-spin" in self.args.kinds.split(","):
            argv.append("--test-spin-on-sigusr2")
        if self.cluster:
            argv = self.cluster.prefix(node) + argv
        with open(path, "w") as f:
            self.agents[node] = subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=self.folder, env=self.env)
        self.seen_pids.add(self.agents[node].pid)
        self.guard_sessions.add(self.agents[node].pid)

    def start(self):
        self.start_server()
        for node in range(NODES):
            self.start_agent(node)

    def workers(self):
        """The training workers: the processes that completed a step in the
        last two seconds of steps (every rank appends its pid to the step
        times), still running (not killed, nor stopped by an earlier
        fault). /proc alone cannot tell a --prewarm standby from a worker."""
        recent = {}
        try:
            with open(self.steps_path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 3:
                        recent[int(parts[2])] = int(parts[1]) / 1e6
        except OSError:
            return []
        if not recent:
            return []
        newest = max(recent.values())
        pids = [p for p, t in recent.items()
                if t >= newest - 2.0 and state(p) not in "ZTt"]
        self.seen_pids.update(pids)
        return pids

    def describe_children(self):
        """The agents' children, for a log line: pid, name, state, wchan."""
        out = []
        for agent in self.agents:
            if agent is None or agent.poll() is not None:
                continue
            for c in children(agent.pid):
                try:
                    with open("/proc/%d/wchan" % c) as f:
                        wchan = f.read()
                except OSError:
                    wchan = "?"
                out.append("%d %s %s %s" % (c, comm(c), state(c), wchan))
        return "; ".join(out) or "none"

    def finished(self):
        return all(a is not None and a.poll() is not None for a in self.agents)

    def stop_everything(self):
        for p in self.agents + [self.server]:
            if p is not None and p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()

    # --- what the run left ---------------------------------------------------
    def step_times(self):
        """{step: earliest completion time (s)} from every rank's lines."""
        times = {}
        try:
            with open(self.steps_path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) != 3:
                        continue
                    step, micros = int(parts[0]), int(parts[1])
                    t = micros / 1e6
                    if step not in times or t < times[step]:
                        times[step] = t
        except OSError:
            pass
        return times

    def last_step(self):
        times = self.step_times()
        return max(times) if times else 0

    def log_text(self):
        text = ""
        for path in self.agent_logs:
            with open(path, errors="replace") as f:
                text += f.read()
        return text

    def rounds_announced(self):
        return len(re.findall(r"\] round \d+: node rank", self.log_text()))

    def started_anew(self):
        return [int(p) for p in re.findall(
            r"(?:started anew|replaced by a prewarmed worker) as pid (\d+)",
            self.log_text())]

    def restart_count(self):
        counts = [int(c) for c in re.findall(r"restart (\d+)/\d+", self.log_text())]
        return max(counts) if counts else 0

    def shm_dirs(self):
        return set(re.findall(r"through (/dev/shm/ddprun-[A-Za-z0-9]+)/",
                              self.log_text()))

    def every_pid(self):
        """Every process the run is known to have had: the server's and
        agents', each worker's (from the step times), and each the agents
        named (replacements, the --prewarm zygote and standbys)."""
        pids = set(self.seen_pids)
        try:
            with open(self.steps_path) as f:
                pids.update(int(line.split()[2]) for line in f
                            if len(line.split()) == 3)
        except OSError:
            pass
        pids.update(int(p) for p in re.findall(
            r"(?:as pid|zygote \(pid|prewarmed process) (\d+)", self.log_text()))
        return pids

    def leftovers(self):
        left = ["pid %d (%s)" % (p, comm(p)) for p in sorted(self.every_pid())
                if alive(p)]
        for pid_text in os.listdir("/proc"):
            if not pid_text.isdigit():
                continue
            argv = cmdline(int(pid_text))
            if (len(argv) > 3 and argv[1] == b"--orphan-guard" and
                    argv[3].isdigit() and int(argv[3]) in self.guard_sessions):
                left.append("orphan guard pid %s" % pid_text)
        left += ["folder %s" % d for d in sorted(self.shm_dirs())
                 if os.path.exists(d)]
        return left


def run_reference(args, work):
    job = Job(args, os.path.join(work, "reference"), "reference-%d" % os.getpid())
    log("reference run (no faults)")
    start = time.monotonic()
    try:
        job.start()
        ok = wait_for(job.finished, args.job_bound, 0.1)
    finally:
        job.stop_everything()
    if not ok or any(a.returncode != 0 for a in job.agents):
        raise RuntimeError("the reference run failed; see %s" % job.folder)
    times = job.step_times()
    steps = sorted(times)
    intervals = [times[b] - times[a] for a, b in zip(steps, steps[1:])]
    log("reference: %d steps in %.1f s, median step %.1f ms" %
        (len(steps), time.monotonic() - start,
         1000 * statistics.median(intervals)))
    return job


class Fault:
    def __init__(self, kind, moment):
        self.kind = kind
        self.moment = moment
        self.start = 0.0  # wall time it landed
        self.end = 0.0    # wall time its own length ended (CONT, restart)
        self.target = ""
        self.trigger = 0.0  # wall time of the kill that opened its moment
        self.lost = None  # seconds lost to it (set afterwards)
        # A throttle made of stops (no cgroup): may be taken for a hang.
        self.stopping = False
        # A worker left hung (stopped, deadlocked, spinning) until its agent
        # kills it: its pid, and when it was first seen gone.
        self.held_pid = None
        self.gone = 0.0


def plan_faults(rng, count, kinds, moments=MOMENTS):
    faults = []
    for i in range(count):
        # Every kind and moment early, then at random.
        kind = kinds[i] if i < len(kinds) else rng.choice(kinds)
        moment = rng.choice(moments) if i >= len(kinds) else moments[i % len(moments)]
        if not kind.startswith("worker"):
            moment = "step" if moment in ("first-step",) else moment
        faults.append(Fault(kind, moment))
    return faults


def kill_a_worker(job, fault, rng, what):
    """Kills one training worker to open the fault's moment (its trigger)."""
    workers = job.workers()
    if not workers:
        return
    victim = rng.choice(workers)
    fault.trigger = time.time()
    signal_pid(victim, signal.SIGKILL)
    log("kill -9 of worker pid %d %s" % (victim, what))


def wait_for_moment(job, fault, rng, total_steps):
    """Waits for the fault's moment; returns a worker pid to hit (or None)."""
    if fault.moment == "round-change":
        rounds = job.rounds_announced()
        # Kill a worker to start a round change, and land this fault inside.
        kill_a_worker(job, fault, rng, "opens a round change")
        if not wait_for(lambda: job.rounds_announced() > rounds, 30, 0.002):
            log("no new round came: %s" % job.describe_children())
        return None
    if fault.moment == "first-step":
        before = set(job.started_anew())
        kill_a_worker(job, fault, rng, "starts a replacement")
        new = wait_for(lambda: set(job.started_anew()) - before, 30, 0.002)
        return sorted(new)[0] if new else None
    if fault.moment == "checkpoint":
        now = job.last_step()
        target = (now // CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY
        wait_for(lambda: job.last_step() >= target or job.finished(), 60, 0.002)
        return None
    target = job.last_step() + rng.randint(5, max(6, total_steps // 40))
    wait_for(lambda: job.last_step() >= target or job.finished(), 60)
    return None


def inject(job, fault, rng, pid):
    kind = fault.kind
    if kind.startswith("worker"):
        pids = job.workers()
        if pid is None or not alive(pid):
            if not pids:
                log("no worker to hit: %s" % job.describe_children())
                return False
            pid = rng.choice(pids)
        fault.target = "worker pid %d" % pid
    fault.start = time.time()
    fault.end = fault.start
    if kind.startswith("worker"):
        if kind == "worker-kill":
            signal_pid(pid, signal.SIGKILL)
        elif kind == "worker-hang":
            signal_pid(pid, signal.SIGSTOP)
            fault.held_pid = pid
        elif kind in ("worker-block", "worker-spin"):
            signal_pid(pid, signal.SIGUSR2)
            fault.held_pid = pid
        elif kind == "worker-pause":
            signal_pid(pid, signal.SIGSTOP)
            time.sleep(rng.uniform(1, 3))
            signal_pid(pid, signal.SIGCONT)
            fault.end = time.time()
        elif kind == "worker-throttle":
            until = time.monotonic() + rng.uniform(3, 6)
            throttle = CpuThrottle(pid, 0.2)
            try:
                if throttle.path is None:
                    fault.stopping = True
                    while time.monotonic() < until and alive(pid):
                        signal_pid(pid, signal.SIGSTOP)
                        time.sleep(0.04)
                        signal_pid(pid, signal.SIGCONT)
                        time.sleep(0.06)
                else:
                    time.sleep(max(0.0, until - time.monotonic()))
            finally:
                throttle.release()
            fault.end = time.time()
        return True
    if kind == "node-partition":
        node = rng.randrange(NODES)
        fault.target = "node %d (%s)" % (node, Cluster.host(node))
        job.cluster.partition(node)
        try:
            time.sleep(rng.uniform(*PARTITION_SECONDS))
        finally:
            job.cluster.heal(node)
        fault.end = time.time()
        return True
    if kind.startswith("agent"):
        node = rng.randrange(NODES)
        agent = job.agents[node]
        if agent is None or agent.poll() is not None:
            fault.start = 0.0  # not injected
            return False
        fault.target = "agent %d pid %d" % (node, agent.pid)
        if kind == "agent-kill":
            agent.kill()
            agent.wait()
            time.sleep(AGENT_RESTART_DELAY)
            job.start_agent(node)
        else:
            agent.send_signal(signal.SIGSTOP)
            time.sleep(PAUSE_SECONDS)
            agent.send_signal(signal.SIGCONT)
        fault.end = time.time()
        return True
    fault.target = "server pid %d" % job.server.pid
    if kind == "server-kill":
        job.server.kill()
        job.server.wait()
        job.start_server()
    else:
        job.server.send_signal(signal.SIGSTOP)
        time.sleep(PAUSE_SECONDS)
        job.server.send_signal(signal.SIGCONT)
    fault.end = time.time()
    return True


def recovered(job, fault):
    """A step completed after the fault ended.

    A hung worker's fault ends when its agent has killed it: the steps its
    peers complete before that (the one in flight) are no recovery, and the
    next fault must not land while this one is still being found (a
    first-step or round-change moment kills a worker at once).
    """
    if job.finished():
        return True
    end = fault.end
    if fault.held_pid is not None:
        if alive(fault.held_pid):
            return False
        if not fault.gone:
            fault.gone = time.time()
        end = fault.gone
    times = job.step_times()
    return bool(times) and max(times.values()) > end


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_faulted(args, work, seed, reference, median_step):
    rng = random.Random(seed)
    kinds = [k for k in args.kinds.split(",") if k]
    moments = tuple(m for m in args.moments.split(",") if m)
    faults = plan_faults(rng, args.faults, kinds, moments)
    job = Job(args, os.path.join(work, "seed-%d" % seed), "faults-%d" % seed)
    total_steps = reference.last_step()
    log("seed %d: %d faults: %s" % (seed, len(faults),
                                   ", ".join("%s@%s" % (f.kind, f.moment)
                                             for f in faults)))
    checks = []  # (name, ok, detail)
    try:
        job.start()
        wait_for(lambda: job.last_step() > 0 or job.finished(), args.job_bound)
        for fault in faults:
            if job.finished():
                log("the job finished before every fault landed")
                break
            pid = wait_for_moment(job, fault, rng, total_steps)
            if job.finished() or not inject(job, fault, rng, pid):
                continue
            log("%s at %s: %s" % (fault.kind, fault.moment, fault.target))
            wait_for(lambda: recovered(job, fault), args.recovery_bound + 30)
            # Its lost time is counted to three steps past its recovery
            # (below): the next fault lands after them, not in its count.
            settled = job.last_step() + 3
            wait_for(lambda: job.last_step() >= settled or job.finished(), 60)
        finished = wait_for(job.finished, args.job_bound, 0.1)
    finally:
        job.stop_everything()
    injected = [f for f in faults if f.start > 0]
    codes = [a.returncode for a in job.agents]
    checks.append(("the job finishes", bool(finished) and codes == [0] * NODES,
                   "agents exited %s" % codes))

    # Each fault owns the steps from the last one completed before it (or
    # before the kill that opened its round change) to three past the
    # first one completed after it ended: what they took past as many
    # median steps is the time lost to it. (The first completion after a
    # kill can be a rank finishing the step it was in; the stall shows in
    # the steps after.)
    times = job.step_times()
    steps = sorted(times)
    gaps = [(times[a], times[b]) for a, b in zip(steps, steps[1:])]
    complete = steps == list(range(1, len(steps) + 1)) and \
        len(steps) == reference.last_step()
    checks.append(("no lost step", complete,
                   "%d steps (reference %d)" % (len(steps), reference.last_step())))
    worst = 0.0
    for fault in injected:
        if not steps:
            break
        own = fault.end - fault.start
        begin = fault.trigger or fault.start
        before = max((k for k in steps if times[k] <= begin), default=steps[0])
        # A hung worker's fault lasts until its agent killed it (recovered).
        after = min((k for k in steps if times[k] > max(fault.end, fault.gone)),
                    default=steps[-1])
        last = min(after + 3, steps[-1])
        fault.lost = max(0.0, times[last] - times[before] -
                         (last - before) * median_step)
        gap = max((times[b] - times[a] for a, b in zip(
            range(before, last), range(before + 1, last + 1))
            if a in times and b in times), default=0.0)
        worst = max(worst, gap - own)
        log("  %-15s %-12s lost %.3f s (longest gap %.3f s, its own length "
            "%.3f s)" % (fault.kind, fault.moment, fault.lost, gap, own))
    longest = max((b - a for a, b in gaps), default=0.0)
    checks.append(("no stall", worst <= args.recovery_bound,
                   "longest gap past a fault's own length %.2f s (bound %.1f s); "
                   "longest gap %.2f s" % (worst, args.recovery_bound, longest)))

    same = os.path.exists(job.model_path) and \
        sha256(job.model_path) == sha256(reference.model_path)
    checks.append(("bit-identical final model", same,
                   "%s vs the reference" % job.model_path))

    needed = sum(1 for f in injected if f.kind in NEEDS_ROUND)
    maybe = sum(1 for f in injected
                if f.kind in MAY_NEED_ROUND or f.stopping)
    # The round-change and first-step moments kill one worker to open the
    # moment (also when the fault itself then did not land); a fault landed
    # inside that recovery may share its round.
    triggers = sum(1 for f in faults if f.trigger > 0)
    shared = sum(1 for f in injected
                 if f.trigger > 0 and f.kind in NEEDS_ROUND)
    expected_max = needed + triggers + maybe
    expected_min = needed - shared
    restarts = job.restart_count()
    checks.append(("restart count", expected_min <= restarts <= expected_max,
                   "%d restarts for %d faults needing a round (+%d to open "
                   "round changes; %d..%d allowed)" %
                   (restarts, needed, triggers, expected_min, expected_max)))

    left = wait_for(lambda: not job.leftovers(), 10, 0.1)
    checks.append(("nothing left behind", left is not None or not job.leftovers(),
                   ", ".join(job.leftovers()) or "nothing"))
    for name, ok, detail in checks:
        log("%s %s: %s" % ("PASS" if ok else "FAIL", name, detail))
    return checks, injected


def main():
    # SIGTERM (a timeout, a soak cut short) unwinds like Ctrl-C: the
    # finally blocks stop every process of the run and remove its files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument("--faults", type=int, default=8)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--moments", default=",".join(MOMENTS),
                        help="when faults land: " + ", ".join(MOMENTS))
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--train-limit", type=int, default=12032)
    parser.add_argument("--recovery-bound", type=float, default=10.0,
                        help="seconds a fault may cost past its own length")
    parser.add_argument("--job-bound", type=float, default=240.0)
    parser.add_argument("--soak-seconds", type=float, default=0)
    parser.add_argument("--agent-flags", default="",
                        help="more ddprun flags, e.g. --agent-flags=--prewarm")
    parser.add_argument("--mnist-flags", default="",
                        help="more ddprun-mnist flags, e.g. "
                        "--mnist-flags='--log-level debug'")
    parser.add_argument("--nproc-per-node", type=int, default=2,
                        help="workers per node; 1: each node's only rank "
                        "hangs with no local peer to wait for it")
    parser.add_argument("--work-dir")
    parser.add_argument("--json", help="write the per-fault figures here")
    args = parser.parse_args()
    args.build = os.path.abspath(args.build)
    args.data_dir = os.path.abspath(args.data_dir)
    for kind in args.kinds.split(","):
        if kind and kind not in KINDS + EXTRA_KINDS:
            sys.exit("--kinds: unknown kind %r; the kinds are %s" %
                     (kind, ", ".join(KINDS + EXTRA_KINDS)))
    if {"worker-block", "worker-spin"} <= set(args.kinds.split(",")):
        sys.exit("--kinds: worker-block and worker-spin cannot be in one run "
                 "(ddprun-mnist hangs one way on SIGUSR2); run them one at a "
                 "time")
    for moment in args.moments.split(","):
        if moment and moment not in MOMENTS:
            sys.exit("--moments: unknown moment %r; the moments are %s" %
                     (moment, ", ".join(MOMENTS)))
    args.cluster = None
    if "node-partition" in args.kinds.split(","):
        if os.geteuid() != 0 or not shutil.which("ip"):
            sys.exit("node-partition runs the job in network namespaces, "
                     "which needs root and iproute2 (ip); run as root, or "
                     "leave node-partition out of --kinds")
        args.cluster = Cluster(os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
            "local", "netns_cluster.sh"))
    work = args.work_dir or tempfile.mkdtemp(prefix="ddprun-fault-")
    os.makedirs(work, exist_ok=True)
    passed = failed = 0
    all_faults = []
    try:
        if args.cluster:
            args.cluster.up()
        reference = run_reference(args, work)
        times = reference.step_times()
        steps = sorted(times)
        median_step = statistics.median(
            [times[b] - times[a] for a, b in zip(steps, steps[1:])])
        start = time.monotonic()
        seed = args.seed
        while True:
            checks, faults = run_faulted(args, work, seed, reference, median_step)
            all_faults += faults
            passed += sum(1 for c in checks if c[1])
            failed += sum(1 for c in checks if not c[1])
            seed += 1
            if time.monotonic() - start >= args.soak_seconds:
                break
    finally:
        if args.cluster:
            args.cluster.down()
        if failed == 0 and not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
        elif failed:
            log("files kept in %s" % work)
    # The lost time includes the fault's own length where the job cannot
    # step without the faulted part (an agent down, a node cut off, a
    # paused server at a round change); "past its own length" leaves it out.
    by_kind = {}
    for f in all_faults:
        if f.lost is not None:
            by_kind.setdefault(f.kind, []).append(f)
    for kind in sorted(by_kind):
        lost = [f.lost for f in by_kind[kind]]
        past = [max(0.0, f.lost - (f.end - f.start)) for f in by_kind[kind]]
        log("%-15s %3d faults, lost per fault: median %.3f s, max %.3f s; "
            "past its own length: median %.3f s, max %.3f s" %
            (kind, len(lost), statistics.median(lost), max(lost),
             statistics.median(past), max(past)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"kind": x.kind, "moment": x.moment, "lost_s": x.lost,
                        "own_s": x.end - x.start}
                       for x in all_faults], f, indent=1)
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
