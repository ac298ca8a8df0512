#!/usr/bin/python3
"""A network fault: a host cut off from the network.

The rendezvous and two hosts h1, h2 each live in a network namespace of their
own (deploy/local/netns_cluster.sh), wired to one bridge. Both hosts run
ddprun with --nnodes 1:2 and train ddprun-mnist together. Once a checkpoint
of the two-node round exists, h2's cable is pulled: its packets, and the
rendezvous's and h1's packets to it, are dropped without a reset, as when a
switch port dies. Then, each within a bound:

  * h1 (the survivor) learns of the loss at a heartbeat, restarts alone from
    the checkpoint and finishes: exit 0, world size 1 in its last round and
    in the summary, test accuracy >= MIN_ACCURACY; it resumed from exactly
    the newest checkpoint the two-node round wrote (its worker logs each
    one with its round), and every epoch's samples add up to the data set
    (the rest of the cut epoch went to the one rank left, each sample once);
  * h2 (the cut-off agent) stops its workers and exits non-zero, leaving no
    ddprun-mnist process in its namespace.

The namespaces exist only while the test runs: they are removed on every
exit (and ones left by a killed earlier run are removed at the start).
Needs root and iproute2; without them it exits 77 (ctest: skipped), or
fails under CI=true, where nothing may skip.

usage: partition_test.py --ddprun BIN --rendezvous BIN --mnist BIN
                         --cluster deploy/local/netns_cluster.sh --data-dir DIR
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
MIN_ACCURACY = 0.85
# 20000 samples a round of 2 trains through in ~1 s an epoch here: enough
# epochs that the cut reliably lands mid-training, after the first checkpoint.
EPOCHS = 4
TRAIN_SAMPLES = 20000
PREFIX = "ddppart"  # namespaces of this test: ddppart<pid>-{sw,rdzv,h1,h2}

# Bounds, generous for a loaded 2-core machine but finite.
START_BOUND_S = 30  # the rendezvous prints its address
TRAINING_BOUND_S = 120  # both hosts in one round and a checkpoint of it
SURVIVOR_BOUND_S = 150  # after the cut: the survivor's job finishes
# After the cut: the cut-off agent has exited. It notices within
# heartbeat_timeout plus one heartbeat's deadline (5 s), stops its workers
# (3 s grace), tries to re-join for join_timeout + 5 s, then gives up.
CUT_OFF_BOUND_S = 90


def log(msg):
    print(f"[partition_test] {msg}", flush=True)


class Failure(Exception):
    pass


def wait_for(cond, timeout_s, what):
    """Polls `cond` until it is true; raises Failure naming `what` after the bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Failure(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


class Cluster:
    """netns_cluster.sh for one cluster NAME; removed by down()."""

    def __init__(self, script, name):
        self.script = script
        self.name = name

    def run(self, *args, check=True):
        return subprocess.run(["bash", self.script, *args], check=check,
                              capture_output=True, text=True, timeout=60)

    def up(self, hosts):
        self.run("up", self.name, str(hosts))

    def partition(self, node):
        self.run("partition", self.name, node)

    def down(self):
        self.run("down", self.name, check=False)

    def ns(self, node):
        return f"{self.name}-{node}"

    def pids(self, node):
        out = subprocess.run(["ip", "netns", "pids", self.ns(node)],
                             capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def programs(self, node, program):
        """The processes in node's namespace whose executable is `program`."""
        found = []
        for pid in self.pids(node):
            try:
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            except OSError:
                continue
            if exe == program:
                found.append(pid)
        return found

    def spawn(self, node, argv, log_base):
        """Starts argv in node's namespace, in a process group of its own."""
        out = open(log_base + ".out", "w")
        err = open(log_base + ".err", "w")
        return subprocess.Popen(["ip", "netns", "exec", self.ns(node), *argv],
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def remove_stale_clusters(script):
    """Removes this test's clusters whose test process is gone (a killed run)."""
    stale = set()
    for ns in namespaces():
        m = re.match(rf"^({PREFIX}(\d+))-", ns)
        if m and not pid_alive(int(m.group(2))):
            stale.add(m.group(1))
    for name in sorted(stale):
        log(f"removing cluster {name} left by an earlier run")
        Cluster(script, name).down()
        for ns in namespaces():  # e.g. the probe of skip_reason()
            if ns.startswith(name + "-"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def skip_reason():
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no 'ip' (apt-get install iproute2)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True,
                           text=True)
    if added.returncode != 0:
        return f"'ip netns add' fails here: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def kill_group(proc):
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def checkpoint_steps(directory):
    steps = []
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        m = re.match(r"^ckpt-(\d+)\.pt$", name)
        if m:
            steps.append(int(m.group(1)))
    return steps


def rounds(err_text):
    """The agent's 'round R: node rank K of N, ...' lines as (R, N) pairs."""
    return [(int(r), int(n)) for r, n in
            re.findall(r"round (\d+): node rank \d+ of (\d+),", err_text)]


def workers_started(err_text):
    """Whether the agent started its workers after its last round line."""
    last = list(re.finditer(r"round \d+: node rank", err_text))
    return bool(last) and "started 1 workers" in err_text[last[-1].end():]


def checkpoints_saved(err_text, round_number):
    """The steps of the checkpoints the worker of round `round_number` saved."""
    return [int(step) for step in re.findall(
        rf"checkpoint of step (\d+) saved \(epoch \d+, sample \d+\) in round "
        rf"{round_number}\b", err_text)]


def run_test(args, cluster, work, procs):
    cluster.up(2)
    rdzv = cluster.spawn("rdzv", [args.rendezvous, "--host", "10.253.0.1",
                                  "--port", "0", "--insecure"],
                         f"{work}/rendezvous")
    procs.append(rdzv)
    listening = wait_for(
        lambda: re.search(r"^ddprun-rendezvous listening on (\S+)",
                          read(f"{work}/rendezvous.out"), re.M)
        or (rdzv.poll() is not None and "exited"),
        START_BOUND_S, "the rendezvous listens")
    if rdzv.poll() is not None:
        raise Failure("the rendezvous exited: " + read(f"{work}/rendezvous.err"))
    endpoint = listening.group(1)
    log(f"rendezvous at {endpoint}")

    checkpoints = f"{work}/checkpoints"
    summary = f"{work}/summary.json"
    agents = {}
    for rank, node in enumerate(["h1", "h2"]):
        argv = [args.ddprun,
                "--nnodes", "1:2", "--nproc-per-node", "1",
                "--node-rank", str(rank), "--local-addr", f"10.253.0.{11 + rank}",
                "--max-restarts", "3", "--monitor-interval", "0.1",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "part",
                "--rdzv-conf",
                "heartbeat_interval=0.5,heartbeat_timeout=2,last_call_timeout=1,"
                "join_timeout=15",
                args.mnist, "--epochs", str(EPOCHS), "--train-limit", str(TRAIN_SAMPLES),
                "--data-dir", args.data_dir, "--checkpoint-dir", checkpoints,
                "--checkpoint-every", "100", "--summary-json", summary,
                "--save", "", "--no-in-place"]
        agents[node] = cluster.spawn(node, argv, f"{work}/{node}")
        procs.append(agents[node])

    def err(node):
        return read(f"{work}/{node}.err")

    def exited(node):
        code = agents[node].poll()
        if code is not None:
            raise Failure(f"{node}'s agent exited {code} before the cut:\n"
                          + err(node))

    # The cut must hit a two-node round that trains: wait for both agents in
    # the same round of 2, then for a checkpoint written after that.
    def both_in_a_round_of_two():
        exited("h1")
        exited("h2")
        r1, r2 = rounds(err("h1")), rounds(err("h2"))
        return (r1 and r2 and r1[-1] == r2[-1] and r1[-1][1] == 2
                and workers_started(err("h1")) and workers_started(err("h2")))
    wait_for(both_in_a_round_of_two, TRAINING_BOUND_S,
             "h1 and h2 train in one round of 2 nodes")
    before = max(checkpoint_steps(checkpoints), default=-1)
    wait_for(lambda: exited("h1") or exited("h2") or
             max(checkpoint_steps(checkpoints), default=-1) > before,
             TRAINING_BOUND_S, "a checkpoint of the two-node round")
    two_node_round = rounds(err("h1"))[-1][0]
    log(f"round {two_node_round} of 2 nodes checkpointed step "
        f"{max(checkpoint_steps(checkpoints))}; cutting h2 off")

    cluster.partition("h2")
    cut = time.monotonic()

    # The survivor continues alone and finishes.
    try:
        code = agents["h1"].wait(timeout=SURVIVOR_BOUND_S)
    except subprocess.TimeoutExpired:
        raise Failure(f"h1 (survivor) did not finish within {SURVIVOR_BOUND_S} s "
                      f"of the cut:\n{err('h1')}")
    log(f"h1 exited {code} {time.monotonic() - cut:.1f} s after the cut")
    if code != 0:
        raise Failure(f"h1 (survivor) exited {code}:\n{err('h1')}")
    last_round, last_nodes = rounds(err("h1"))[-1]
    if last_round <= two_node_round or last_nodes != 1:
        raise Failure(f"h1's last round is {last_round} of {last_nodes} nodes; "
                      f"want a round after {two_node_round} of 1 node:\n"
                      + err("h1"))
    text = read(summary)
    try:
        figures = json.loads(text)
    except ValueError:
        raise Failure(f"no summary JSON in {summary}: {text!r}")
    log(f"summary: {text.strip()}")
    if figures.get("world_size") != 1:
        raise Failure(f"summary world_size {figures.get('world_size')}, want 1")
    if not figures.get("test_accuracy", 0) >= MIN_ACCURACY:
        raise Failure(f"test accuracy {figures.get('test_accuracy')} < "
                      f"{MIN_ACCURACY}")
    # h1 is rank 0 of the two-node round, the one that saves: the newest
    # checkpoint of that round is the one the restart must resume from (the
    # job started in round 0 or a later one: any earlier round's are older).
    saved = checkpoints_saved(err("h1"), two_node_round)
    if not saved:
        raise Failure(f"no checkpoint logged in round {two_node_round}:\n"
                      + err("h1"))
    if figures.get("resumed_from_step") != max(saved):
        raise Failure(f"resumed_from_step {figures.get('resumed_from_step')}, "
                      f"want {max(saved)}: the newest checkpoint of round "
                      f"{two_node_round} (saved there: {saved})")
    if (figures.get("epoch_size") != TRAIN_SAMPLES or
            figures.get("epoch_samples") != [TRAIN_SAMPLES] * EPOCHS):
        raise Failure(f"sample accounting: epoch_samples "
                      f"{figures.get('epoch_samples')} of epoch_size "
                      f"{figures.get('epoch_size')}; want {EPOCHS} x "
                      f"{TRAIN_SAMPLES} (a sample skipped or seen twice)")
    log(f"resumed from step {max(saved)}, the newest checkpoint of round "
        f"{two_node_round}; every epoch {TRAIN_SAMPLES} samples")

    # The cut-off agent stops its workers and gives up.
    remaining = max(1.0, CUT_OFF_BOUND_S - (time.monotonic() - cut))
    try:
        code = agents["h2"].wait(timeout=remaining)
    except subprocess.TimeoutExpired:
        raise Failure(f"h2 (cut off) still runs {CUT_OFF_BOUND_S} s after the "
                      f"cut; ddprun-mnist there: "
                      f"{cluster.programs('h2', 'ddprun-mnist')}:\n{err('h2')}")
    log(f"h2 exited {code} {time.monotonic() - cut:.1f} s after the cut")
    if code == 0:
        raise Failure(f"h2 (cut off) exited 0:\n{err('h2')}")
    left = cluster.programs("h2", os.path.basename(args.mnist))
    if left:
        raise Failure(f"ddprun-mnist processes left in {cluster.ns('h2')}: {left}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--mnist", required=True)
    parser.add_argument("--cluster", required=True,
                        help="deploy/local/netns_cluster.sh")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--keep", action="store_true",
                        help="keep the logs (always kept on failure)")
    args = parser.parse_args()

    reason = skip_reason()
    if reason:
        if os.environ.get("CI") == "true":
            log(f"FAIL: {reason} (CI=true: a skip is a failure)")
            return 1
        log(f"SKIP: {reason}")
        return SKIP
    remove_stale_clusters(args.cluster)

    cluster = Cluster(args.cluster, f"{PREFIX}{os.getpid()}")
    work = tempfile.mkdtemp(prefix="partition_test.")
    procs = []
    ok = False

    def on_signal(signum, _frame):
        raise Failure(f"stopped by signal {signum}")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    started = time.monotonic()
    try:
        run_test(args, cluster, work, procs)
        ok = True
    except Failure as e:
        log(f"FAIL: {e}")
    finally:
        for proc in procs:
            kill_group(proc)
        cluster.down()
        if any(ns.startswith(cluster.name + "-") for ns in namespaces()):
            log(f"FAIL: namespaces of {cluster.name} remain")
            ok = False
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"logs in {work}")
    log(f"{'PASS' if ok else 'FAIL'} in {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
