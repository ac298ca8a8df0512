#!/usr/bin/env python3
"""Time from kill -9 of a worker to the first training step of the next
round: ddprun (plain and --prewarm) beside torchrun, the same Python DDP
script (ddp_train.py), --nproc-per-node 2 --max-restarts 1, runs
interleaved, medians.

  bench/launcher/restart_latency.py [--runs 5] [--monitor-interval 0.1]

Needs /usr/bin/python3 with torch (Debian's python3-torch) and a built
ddprun (DDPRUN_BUILD_DIR, default build/). torchrun runs with
`--redirects 1 --tee 1`: Debian's torchrun 1.13 crashes under Python 3.11
with its default output settings (an upstream bug).
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from proc_util import kill_group

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "launcher", "ddp_train.py")


def read_steps(path):
    try:
        with open(path) as f:
            return [(int(a), float(b)) for a, b in
                    (line.split() for line in f if line.count(" ") == 1)]
    except FileNotFoundError:
        return []


def wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.002)
    raise TimeoutError(what)


def one_run(name, command, env, timeout, train_seconds):
    with tempfile.TemporaryDirectory() as out:
        log = open(os.path.join(out, "launcher.log"), "w")
        proc = subprocess.Popen(command + [SCRIPT, out], env=env, stdout=log,
                                stderr=subprocess.STDOUT,
                                start_new_session=True)
        steps = os.path.join(out, "steps")
        try:
            wait_for(lambda: len(read_steps(steps)) >= 5, timeout,
                     f"{name}: no training steps")
            # A job trains a while before something fails; ddprun's prewarmed
            # workers start during that time.
            time.sleep(train_seconds)
            pid_file = os.path.join(out, "pid_0_1")
            victim = int(wait_for(lambda: os.path.exists(pid_file) and
                                  open(pid_file).read(), timeout,
                                  f"{name}: no pid of rank 1"))
            killed = time.time()
            os.kill(victim, signal.SIGKILL)
            first = wait_for(
                lambda: next((t for r, t in read_steps(steps) if r >= 1), None),
                timeout, f"{name}: no step after the restart")
            proc.wait(timeout=timeout)
            return first - killed
        except Exception:
            log.flush()
            sys.stderr.write(open(os.path.join(out, "launcher.log")).read())
            raise
        finally:
            kill_group(proc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--monitor-interval", default="0.1")
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--train-seconds", type=float, default=5,
                        help="training time before the kill")
    args = parser.parse_args()
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    ddprun = os.path.join(build, "launcher", "ddprun")
    env = dict(os.environ, PYTHON_EXEC=args.python)
    env.pop("OMP_NUM_THREADS", None)
    ddprun_flags = [ddprun, "--standalone", "--nproc-per-node", "2",
                    "--max-restarts", "1", "--monitor-interval",
                    args.monitor_interval]
    launchers = {
        "ddprun": ddprun_flags,
        "ddprun --prewarm": ddprun_flags + ["--prewarm"],
        "torchrun": [args.python, "-m", "torch.distributed.run",
                     "--standalone", "--nproc_per_node", "2",
                     "--max_restarts", "1", "--monitor_interval",
                     args.monitor_interval, "--redirects", "1", "--tee", "1"],
    }
    times = {name: [] for name in launchers}
    failed = {name: 0 for name in launchers}
    for i in range(args.runs):
        for name, command in launchers.items():  # interleaved
            try:
                seconds = one_run(name, command, env, args.timeout,
                                  args.train_seconds)
            except TimeoutError as e:
                # Counted and reported, not hidden: a launcher that does not
                # recover within the timeout failed this run.
                failed[name] += 1
                print(f"run {i + 1}/{args.runs} {name:16s} FAILED: {e}",
                      flush=True)
                continue
            times[name].append(seconds)
            print(f"run {i + 1}/{args.runs} {name:16s} {seconds:.3f} s",
                  flush=True)
    print(f"\nkill -9 of a worker -> first step of the next round, "
          f"--monitor-interval {args.monitor_interval}, median of {args.runs}:")
    for name, values in times.items():
        if not values:
            print(f"  {name:16s} no successful run ({failed[name]} failed)")
            continue
        print(f"  {name:16s} {statistics.median(values):.3f} s  "
              f"(min {min(values):.3f}, max {max(values):.3f}"
              f"{f', {failed[name]} runs failed' if failed[name] else ''})")
    if times["torchrun"]:
        torchrun = statistics.median(times["torchrun"])
        for name in launchers:
            if name != "torchrun" and times[name]:
                ratio = torchrun / statistics.median(times[name])
                print(f"  {name} is {ratio:.1f}x faster than torchrun")
    print(f"  load average during the runs: {os.getloadavg()}")


if __name__ == "__main__":
    main()
