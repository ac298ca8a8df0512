#!/usr/bin/env python3
"""How soon ddprun notices a hung worker: ddprun-mnist trains under
`ddprun --standalone --nproc-per-node 2 --worker-timeout T`, one worker is
stopped (SIGSTOP: no progress, no exit), and the time from the stop to the
agent's "is hung" line is measured. The goal is T plus at most one monitor
interval (torchrun never notices a hang). Median of several runs.

  bench/launcher/hang_detection.py [--runs 3] [--worker-timeout 2]

Needs a build with ddprun-mnist (DDPRUN_BUILD_DIR, default build/) and the
MNIST files in data/mnist.
"""
import argparse
import os
import signal
import statistics
import subprocess
import tempfile
import time

from proc_util import children, kill_group, log_time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hung_time(log_path):
    # "[2026-12-02 12:00:30.083] [ddprun] [warning] worker rank 1 ... is hung"
    with open(log_path) as f:
        for line in f:
            if "is hung" in line:
                return log_time(line)
    return None


def one_run(build, timeout_s, monitor):
    with tempfile.TemporaryDirectory() as out:
        log_path = os.path.join(out, "agent.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [os.path.join(build, "launcher", "ddprun"), "--standalone",
                 "--nproc-per-node", "2", "--max-restarts", "1",
                 "--monitor-interval", monitor, "--worker-timeout", timeout_s,
                 "--shutdown-grace", "1",
                 os.path.join(build, "mnist", "ddprun-mnist"), "--epochs", "3",
                 "--data-dir", os.path.join(ROOT, "data", "mnist"),
                 "--checkpoint-dir", os.path.join(out, "ckpt"),
                 "--checkpoint-every", "20", "--save", ""],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            deadline = time.time() + 120
            while not os.path.isdir(os.path.join(out, "ckpt")) or \
                    not os.listdir(os.path.join(out, "ckpt")):
                if time.time() > deadline:
                    raise TimeoutError(open(log_path).read())
                time.sleep(0.005)
            victim = children(proc.pid)[-1]
            stopped = time.time()
            os.kill(victim, signal.SIGSTOP)
            while (found := hung_time(log_path)) is None:
                if time.time() > deadline:
                    raise TimeoutError(open(log_path).read())
                time.sleep(0.005)
            proc.wait(timeout=120)
            return found - stopped
        finally:
            kill_group(proc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--worker-timeout", default="2")
    parser.add_argument("--monitor-interval", default="0.1")
    args = parser.parse_args()
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    times = []
    for i in range(args.runs):
        seconds = one_run(build, args.worker_timeout, args.monitor_interval)
        times.append(seconds)
        print(f"run {i + 1}/{args.runs}: hung after {seconds:.3f} s", flush=True)
    print(f"SIGSTOP of a worker -> 'is hung', --worker-timeout "
          f"{args.worker_timeout}, --monitor-interval {args.monitor_interval}: "
          f"median {statistics.median(times):.3f} s (min {min(times):.3f}, "
          f"max {max(times):.3f}); goal <= timeout + one interval")


if __name__ == "__main__":
    main()
