#!/usr/bin/env python3
"""Restart latency of the C++ trainer: ddprun-mnist under
`ddprun --standalone --nproc-per-node 2 --max-restarts 1`, kill -9 of a
worker after the first checkpoint; the time to the next round's first
training step is the agent's "started" line of the new round minus the kill,
plus the new rank 0's own time from process start to its first step (its
--summary-json). Median of several runs.

  bench/launcher/mnist_restart.py [--runs 3]

Needs a build with ddprun-mnist (DDPRUN_BUILD_DIR, default build/) and the
MNIST files in data/mnist.
"""
import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def log_time(line):
    stamp = line[1:24]
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def one_run(build):
    with tempfile.TemporaryDirectory() as out:
        log_path = os.path.join(out, "agent.log")
        ckpt = os.path.join(out, "ckpt")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [os.path.join(build, "launcher", "ddprun"), "--standalone",
                 "--nproc-per-node", "2", "--max-restarts", "1",
                 os.path.join(build, "worker", "ddprun-mnist"), "--epochs", "2",
                 "--data-dir", os.path.join(ROOT, "data", "mnist"),
                 "--checkpoint-dir", ckpt, "--checkpoint-every", "20",
                 "--summary-json", os.path.join(out, "summary.json"),
                 "--save", ""],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            deadline = time.time() + 120
            while not os.path.isdir(ckpt) or not os.listdir(ckpt):
                if time.time() > deadline:
                    raise TimeoutError(open(log_path).read())
                time.sleep(0.005)
            killed = time.time()
            os.kill(children(proc.pid)[-1], signal.SIGKILL)
            proc.wait(timeout=300)
            started = [log_time(l) for l in open(log_path)
                       if "started 2 workers" in l][-1]
            summary = json.load(open(os.path.join(out, "summary.json")))
            return started - killed, summary["time_to_first_step_seconds"]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    totals, agents = [], []
    for i in range(args.runs):
        agent, first_step = one_run(build)
        totals.append(agent + first_step)
        agents.append(agent)
        print(f"run {i + 1}/{args.runs}: agent {agent:.3f} s + worker start "
              f"to first step {first_step:.3f} s = {agent + first_step:.3f} s",
              flush=True)
    print(f"kill -9 of a ddprun-mnist worker -> first step of the next round: "
          f"median {statistics.median(totals):.3f} s (of which the agent's "
          f"detect/report/stop/re-join/spawn {statistics.median(agents):.3f} s)")


if __name__ == "__main__":
    main()
