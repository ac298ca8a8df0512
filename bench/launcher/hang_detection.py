#!/usr/bin/env python3
"""How soon ddprun notices a hung worker, for a libddp program and for a
Python program that reports with ddprun's module.

Each run trains under `ddprun --standalone --nproc-per-node 2` at the
default flags (or the --ddprun-flags given) and hangs worker rank 1 once it
has stepped a while, then measures from the hang to the agent's "is hung"
line. The programs, interleaved run by run:

  mnist    ddprun-mnist (libddp reports each step)
  python   bench/launcher/ddp_progress_train.py: torch DDP with
           `import ddprun.progress` and one progress.step() per step

The hangs:

  freeze   the worker is frozen (a cgroup freezer): alive, not stopped, no
           progress, as a deadlocked program is. Found by the silence past
           its phase's bound (learned from its own steps, with a floor).
  stop     SIGSTOP: found by its state (state T), whatever the program.

  bench/launcher/hang_detection.py [--runs 3] [--hangs freeze,stop]
      [--programs mnist,python] [--ddprun-flags '--worker-timeout 2']

Needs root for freeze (a cgroup of its own), a build with ddprun-mnist
(DDPRUN_BUILD_DIR, default build/), the MNIST files in data/mnist and a
Python with torch (DDPRUN_TEST_PYTHON, default /usr/bin/python3).
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import tempfile
import time

from proc_util import children, kill_group, log_time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


class Freezer:
    """A cgroup freezer holding one process (v1 freezer.state, or v2
    cgroup.freeze), removed on thaw."""

    def __init__(self, pid):
        self.pid = pid
        name = "ddprun-bench-%d-%d" % (os.getpid(), pid)
        v1 = "/sys/fs/cgroup/freezer"
        if os.path.exists(os.path.join(v1, "freezer.state")) or \
                os.path.isdir(v1):
            self.root, self.v2 = v1, False
        else:
            self.root, self.v2 = "/sys/fs/cgroup", True
        self.path = os.path.join(self.root, name)
        os.mkdir(self.path)
        self._write("cgroup.procs", str(pid))
        if self.v2:
            self._write("cgroup.freeze", "1")
        else:
            self._write("freezer.state", "FROZEN")

    def _write(self, name, value, folder=None):
        with open(os.path.join(folder or self.path, name), "w") as f:
            f.write(value)

    def thaw(self):
        try:
            if self.v2:
                self._write("cgroup.freeze", "0")
            else:
                self._write("freezer.state", "THAWED")
            self._write("cgroup.procs", str(self.pid), self.root)
        except OSError:
            pass  # gone: the cgroup empties with it
        deadline = time.time() + 5
        while time.time() < deadline:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)


def hung_time(log_path):
    # "[2026-12-02 12:00:30.083] [ddprun] [warning] worker rank 1 ... is hung"
    with open(log_path) as f:
        for line in f:
            if "is hung" in line:
                return log_time(line), line.strip()
    return None


def rank_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"RANK="):
                    return int(entry[5:])
    except (OSError, ValueError):
        pass
    return -1


def command(build, program, out):
    python = os.environ.get("DDPRUN_TEST_PYTHON", "/usr/bin/python3")
    if program == "mnist":
        return [os.path.join(build, "mnist", "ddprun-mnist"), "--epochs", "20",
                "--data-dir", os.path.join(ROOT, "data", "mnist"),
                "--checkpoint-dir", os.path.join(out, "ckpt"),
                "--checkpoint-every", "1000", "--save", ""], {}
    return [os.path.join(HERE, "ddp_progress_train.py"), "200000"], \
        {"PYTHON_EXEC": python}


def one_run(build, program, hang, flags):
    with tempfile.TemporaryDirectory() as out:
        log_path = os.path.join(out, "agent.log")
        argv, env = command(build, program, out)
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [os.path.join(build, "launcher", "ddprun"), "--standalone",
                 "--nproc-per-node", "2", "--max-restarts", "0",
                 "--shutdown-grace", "1"] + flags + argv,
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
                env=dict(os.environ, **env), cwd=out)
        freezer = None
        try:
            deadline = time.time() + 120
            victim = -1
            while victim < 0:
                if time.time() > deadline or proc.poll() is not None:
                    raise TimeoutError(open(log_path).read())
                victim = next((p for p in children(proc.pid)
                               if rank_of(p) == 1), -1)
                time.sleep(0.05)
            # Let it step a while: the bounds learn from its steps.
            time.sleep(5)
            hung_at = time.time()
            if hang == "freeze":
                freezer = Freezer(victim)
            else:
                os.kill(victim, signal.SIGSTOP)
            while (found := hung_time(log_path)) is None:
                if time.time() > deadline + 60 or proc.poll() is not None:
                    raise TimeoutError(open(log_path).read())
                time.sleep(0.005)
            return found[0] - hung_at, found[1]
        finally:
            if freezer is not None:
                freezer.thaw()
            kill_group(proc)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--programs", default="mnist,python")
    parser.add_argument("--hangs", default="freeze,stop")
    parser.add_argument("--ddprun-flags", default="",
                        help="e.g. '--worker-timeout 2' (default: none)")
    args = parser.parse_args()
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    flags = args.ddprun_flags.split()
    times = {}
    for i in range(args.runs):
        for hang in args.hangs.split(","):
            for program in args.programs.split(","):
                seconds, line = one_run(build, program, hang, flags)
                times.setdefault((hang, program), []).append(seconds)
                bound = re.search(r"is hung.*", line)
                print(f"run {i + 1}/{args.runs} {hang:6} {program:6}: found "
                      f"after {seconds:.3f} s ({bound.group(0) if bound else line})",
                      flush=True)
    print(f"hang -> 'is hung', ddprun flags: {args.ddprun_flags or 'the defaults'}")
    for (hang, program), t in sorted(times.items()):
        print(f"  {hang:6} {program:6}: median {statistics.median(t):.3f} s "
              f"(min {min(t):.3f}, max {max(t):.3f}, {len(t)} runs)")


if __name__ == "__main__":
    main()
