"""What the launcher benchmarks share: a process's children, the time of a
ddprun log line, and stopping a started command's process group."""
import datetime
import os
import signal


def children(pid):
    """Pids of `pid`'s children (every thread's), from /proc."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
        except FileNotFoundError:
            pass
    return out


def log_time(line):
    """Unix time of a ddprun log line: "[2026-12-02 12:00:30.083] [ddprun] ..."."""
    stamp = line[1:24]
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def kill_group(proc):
    """SIGKILLs the process group of a still running Popen and reaps it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
