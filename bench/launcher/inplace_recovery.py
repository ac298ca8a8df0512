#!/usr/bin/env python3
"""What one kill -9 of a worker costs ddprun-mnist (issue 13): in-place
recovery (the default: survivors keep running, only the lost rank is
replaced) against restart-all (`ddprun-mnist --no-in-place`: every worker
restarts from the newest checkpoint, as under torchrun), each beside a
fault-free run of the same command. All three modes run interleaved, a
seeded kill time and victim per run; medians.

Figures per mode:
  lost s/fault   (wall of the run with the fault - wall of the fault-free
                 run next to it) / faults
  kill->step s   kill -9 -> the next completed training step: in place,
                 the summary's resumed_step_unix_seconds; restart-all, the
                 new round's first_step_unix_seconds
  steps lost     in place: a survivor's last completed step - the step
                 training resumed at (their log lines), the worst run;
                 restart-all goes back to its newest checkpoint (every 20
                 steps here), not shown

  bench/launcher/inplace_recovery.py [--runs 5] [--nproc 2] [--prewarm]
      [--epochs 4] [--train-limit 12000] [--seed 1]

Needs a build with ddprun-mnist (DDPRUN_BUILD_DIR, default build/) and the
MNIST files in data/mnist.
"""
import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import tempfile
import time

from proc_util import children, kill_group

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"RANK="):
                    return int(entry[5:])
    except (FileNotFoundError, ValueError):
        pass
    return None


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError(what)


def one_run(args, build, mode, rng_seed):
    """Returns (wall seconds, kill->step seconds or None, steps lost or None)."""
    rng = random.Random(rng_seed)
    with tempfile.TemporaryDirectory() as out:
        command = [os.path.join(build, "launcher", "ddprun"), "--standalone",
                   "--nproc-per-node", str(args.nproc), "--max-restarts", "3",
                   "--monitor-interval", "0.05"]
        if args.prewarm:
            command.append("--prewarm")
        command += [os.path.join(build, "mnist", "ddprun-mnist"),
                    "--epochs", str(args.epochs), "--data-dir",
                    os.path.join(ROOT, "data", "mnist"), "--train-limit",
                    str(args.train_limit), "--seed", "7", "--summary-json",
                    os.path.join(out, "summary.json"), "--save", "",
                    "--checkpoint-dir", os.path.join(out, "ckpt"),
                    "--checkpoint-every", "20", "--no-progress"]
        if mode == "restart-all":
            command.append("--no-in-place")
        err_path = os.path.join(out, "err")
        err = open(err_path, "w")
        start = time.time()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)
        kill_time = None
        try:
            if mode != "fault-free":
                wait_for(lambda: "epoch 1/" in read(err_path), 300,
                         f"{mode}: no first epoch")
                # With --prewarm, restart-all needs its standbys up.
                time.sleep(rng.uniform(0.05, 0.4))
                workers = [p for p in children(proc.pid)
                           if rank_of(p) is not None]
                victim = rng.choice(sorted(workers))
                kill_time = time.time()
                os.kill(victim, signal.SIGKILL)
            proc.wait(timeout=600)
        finally:
            kill_group(proc)
        wall = time.time() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{mode}: exit {proc.returncode}\n{read(err_path)}")
        summary = json.loads(read(os.path.join(out, "summary.json")))
        if kill_time is None:
            return wall, None, None
        if mode == "in-place":
            resumed = summary["resumed_step_unix_seconds"]
            # Steps a survivor had completed but training did not keep.
            behind = [int(a) - int(b) for a, b in re.findall(
                r"stopped at step (\d+), resuming at step (\d+)",
                read(err_path))]
            lost = max(0, max(behind)) if behind else None
            return wall, (resumed[0] - kill_time if resumed else None), lost
        return wall, summary["first_step_unix_seconds"] - kill_time, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--prewarm", action="store_true")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-limit", type=int, default=12000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    modes = ["fault-free", "in-place", "restart-all"]
    results = {m: [] for m in modes}
    for run in range(args.runs):
        for mode in modes:
            results[mode].append(one_run(args, build, mode,
                                         args.seed * 1000 + run))
            wall, step, lost = results[mode][-1]
            print(f"run {run} {mode:12s} wall {wall:6.2f} s"
                  + (f" kill->step {step:.3f} s" if step is not None else "")
                  + (f" steps lost {lost}" if lost is not None else ""),
                  flush=True)
    print(f"\nmedians over {args.runs} runs, --nproc-per-node {args.nproc}"
          f"{' --prewarm' if args.prewarm else ''}, one kill -9 per run:")
    free = [r[0] for r in results["fault-free"]]
    for mode in ("in-place", "restart-all"):
        lost_time = [w - f for (w, _, _), f in zip(results[mode], free)]
        steps = [s for _, s, _ in results[mode] if s is not None]
        lost = [x for _, _, x in results[mode] if x is not None]
        print(f"  {mode:12s} lost s/fault {statistics.median(lost_time):6.2f}"
              f"  kill->step s {statistics.median(steps):6.3f}"
              + (f"  steps lost {max(lost)} (max)" if lost else ""))
    print(f"  fault-free wall {statistics.median(free):.2f} s")


if __name__ == "__main__":
    main()
