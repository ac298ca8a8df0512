"""kill -9 of a ddprun agent leaves nothing behind (launcher/posix/orphan_guard.h).

A Python worker starts a child of its own (same process group) and writes
that child's pid and the node's shared-memory folder (DDPRUN_SHM_DIR) to a
file; the test then kills the agent with SIGKILL, and waits (bounded) until
the worker, its child, the shared-memory folder and the agent's temporary
log folder (torchelastic_*, under a TMPDIR of the test's own) are gone, and
the guard process has exited.

Usage: orphan_guard_test.py --ddprun PATH
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

WORKER = r'''
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "600"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("%d %d %s\n" % (os.getpid(), child.pid, os.environ.get("DDPRUN_SHM_DIR", "")))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
'''


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def guards_of(session):
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % name, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 3 and argv[1] == b"--orphan-guard" and argv[3] == str(session).encode():
            found.append(int(name))
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        program = os.path.join(work, "worker.py")
        with open(program, "w") as f:
            f.write(WORKER)
        report = os.path.join(work, "report")
        tmp = os.path.join(work, "tmp")
        os.makedirs(tmp)
        env = dict(os.environ, TMPDIR=tmp)
        agent = subprocess.Popen(
            [args.ddprun, "--standalone", "--nproc-per-node", "1", program, report],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        failures = []
        try:
            if not wait_for(lambda: os.path.exists(report), 60):
                sys.exit("FAIL: the worker did not start")
            worker, child, shm = open(report).read().split()
            worker, child = int(worker), int(child)
            logs = [os.path.join(tmp, d) for d in os.listdir(tmp)
                    if d.startswith("torchelastic_")]
            if not shm or not os.path.isdir(shm):
                failures.append("the worker had no shared-memory folder: %r" % shm)
            if len(logs) != 1:
                failures.append("expected one torchelastic_* folder, found %s" % logs)
            if not guards_of(agent.pid):
                failures.append("no orphan guard runs for the agent")
            agent.send_signal(signal.SIGKILL)
            agent.wait()
            for what, gone in (
                    ("the worker", lambda: not alive(worker)),
                    ("the worker's child", lambda: not alive(child)),
                    ("the shared-memory folder", lambda: not os.path.exists(shm)),
                    ("the temporary log folder",
                     lambda: not any(os.path.exists(p) for p in logs)),
                    ("the guard", lambda: not guards_of(agent.pid))):
                if not wait_for(gone, 10):
                    failures.append("%s is still there 10 s after kill -9 of the agent" % what)
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
            if os.path.exists(report):
                for pid in open(report).read().split()[:2]:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
    if failures:
        sys.exit("FAIL: " + "; ".join(failures))
    print("OK: kill -9 of the agent left no process and no folder behind")


if __name__ == "__main__":
    main()
