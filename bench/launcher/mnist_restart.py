#!/usr/bin/env python3
"""Restart latency of the C++ trainer, ddprun against ddprun --prewarm:
ddprun-mnist under `ddprun --standalone --nproc-per-node 2 --max-restarts 1
[--prewarm]`, kill -9 of a worker once a checkpoint exists (and, with
--prewarm, once the next round's standbys wait for it); the figure is the
new round's rank 0's first training step (`first_step_unix_seconds` of its
--summary-json) minus the kill. The agent's part (kill -> its "started" or
"activated prewarmed" line of the new round) is shown beside it. The modes
run interleaved; medians.

  bench/launcher/mnist_restart.py [--runs 5] [--modes plain,prewarm]

Needs a build with ddprun-mnist (DDPRUN_BUILD_DIR, default build/) and the
MNIST files in data/mnist.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

from proc_util import children, kill_group, log_time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def is_zygote(pid):
    """The standbys' zygote (it forks them; it names itself so)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "ddprun-zygote"
    except OSError:
        return False


def is_standby(pid):
    """A prewarmed process: started with DDPRUN_STANDBY_FD, or forked by the
    zygote, started with DDPRUN_ZYGOTE_FD (the original environment block,
    which /proc keeps after activation too). The zygote counts too: it is
    no worker."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return False
    return b"DDPRUN_STANDBY_FD=" in env or b"DDPRUN_ZYGOTE_FD=" in env


def waits_on_pipe(pid):
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read().strip().endswith("pipe_read")
    except OSError:
        return False


def wait_until(cond, what, log_path, timeout=120):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise TimeoutError(f"{what}:\n" + open(log_path).read())
        time.sleep(0.005)


def one_run(build, prewarm):
    with tempfile.TemporaryDirectory() as out:
        log_path = os.path.join(out, "agent.log")
        ckpt = os.path.join(out, "ckpt")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [os.path.join(build, "launcher", "ddprun"), "--standalone",
                 "--nproc-per-node", "2", "--max-restarts", "1"]
                + (["--prewarm"] if prewarm else []) +
                [os.path.join(build, "mnist", "ddprun-mnist"), "--epochs", "3",
                 "--data-dir", os.path.join(ROOT, "data", "mnist"),
                 "--checkpoint-dir", ckpt, "--checkpoint-every", "20",
                 "--summary-json", os.path.join(out, "summary.json"),
                 "--save", "", "--no-in-place"],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            wait_until(lambda: os.path.isdir(ckpt) and os.listdir(ckpt),
                       "no checkpoint", log_path)
            if prewarm:
                wait_until(lambda: sum(waits_on_pipe(p) for p in children(proc.pid)
                                       if is_standby(p) and not is_zygote(p))
                           >= 2,
                           "no standbys waiting", log_path)
            workers = [p for p in children(proc.pid) if not is_standby(p)]
            killed = time.time()
            os.kill(workers[-1], signal.SIGKILL)
            proc.wait(timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(open(log_path).read())
            lines = open(log_path).read().splitlines()
            started = [log_time(l) for l in lines
                       if "started 2 workers" in l or
                       "activated prewarmed 2 workers" in l][-1]
            if prewarm and not any("activated prewarmed 2 workers" in l
                                   for l in lines):
                raise RuntimeError("the restart did not use the standbys:\n" +
                                   "\n".join(lines))
            summary = json.load(open(os.path.join(out, "summary.json")))
            return started - killed, summary["first_step_unix_seconds"] - killed
        finally:
            kill_group(proc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default="plain,prewarm")
    args = parser.parse_args()
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    modes = args.modes.split(",")
    results = {m: ([], []) for m in modes}
    for i in range(args.runs):
        for mode in modes:  # interleaved: both see the same load
            agent, total = one_run(build, prewarm=(mode == "prewarm"))
            results[mode][0].append(agent)
            results[mode][1].append(total)
            print(f"run {i + 1}/{args.runs} {mode:8s}: kill -9 -> agent's "
                  f"new round {agent:.3f} s, -> first step {total:.3f} s",
                  flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    for mode in modes:
        agents, totals = results[mode]
        print(f"{'ddprun --prewarm' if mode == 'prewarm' else 'ddprun':17s} "
              f"kill -9 of a ddprun-mnist worker -> next round's first step: "
              f"median {statistics.median(totals):.3f} s (min "
              f"{min(totals):.3f}, max {max(totals):.3f}; agent's part "
              f"{statistics.median(agents):.3f} s), {len(totals)} runs, "
              f"load {load}")


if __name__ == "__main__":
    main()
