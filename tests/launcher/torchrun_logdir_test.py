"""ddprun's --log-dir tree against Debian's torchrun (torch 1.13; 2.6 in
Debian 13) for the same command lines: LOGDIR/<run_id>_<random>/attempt_<n>/<local_rank>/
{stdout.log, stderr.log, error.json}. The trees must hold the same paths
(the random part aside), the same log lines where a worker surely wrote them,
and the failed worker's error.json its @record wrote.

Usage: torchrun_logdir_test.py --ddprun PATH
"""
import argparse
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "log_worker.py")
RUN_ID = "logtree"

# torch 1.13's Std.from_str finds no member for 0 or 3 under Python 3.11
# (Flag iteration skips them) and crashes without --tee: the lines use 1 and
# 2 only.
LINES = [
    # Local rank 1 fails its first attempt: two attempts, one error.json.
    ["--redirects", "1", "--tee", "2", "--max_restarts", "1", "--fail-rank"],
    # Per-rank redirects; tee adds to them (rank 1: both streams).
    ["--redirects", "0:1,1:2", "--tee", "1"],
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(launcher, flags, log_dir):
    fail = "--fail-rank" in flags
    flags = [f for f in flags if f != "--fail-rank"]
    argv = launcher + [
        "--nnodes", "1", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
        "--rdzv_endpoint", "127.0.0.1:%d" % free_port(), "--rdzv_id", RUN_ID,
        "--log_dir", log_dir] + flags + [WORKER] + (["--fail-rank", "1"]
                                                   if fail else [])
    env = {"PATH": "/usr/bin:/bin", "HOME": log_dir, "LANG": "C.UTF-8",
           "PYTHON_EXEC": "/usr/bin/python3"}
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=240, text=True)
    return p.returncode, p.stdout


def tree(log_dir):
    """The run folder's name and {relative path: content or None (folder)}."""
    runs = os.listdir(log_dir)
    if len(runs) != 1 or not re.fullmatch(RUN_ID + r"_[A-Za-z0-9_]+", runs[0]):
        return None, {"<top level>": repr(runs)}
    run_dir = os.path.join(log_dir, runs[0])
    files = {}
    for root, dirs, names in os.walk(run_dir):
        rel = os.path.relpath(root, run_dir)
        for d in dirs:
            files[os.path.normpath(os.path.join(rel, d))] = None
        for n in names:
            with open(os.path.join(root, n)) as f:
                files[os.path.normpath(os.path.join(rel, n))] = f.read()
    return runs[0], files


def compare(flags, t_files, d_files):
    problems = []
    if sorted(t_files) != sorted(d_files):
        problems.append("paths differ:\n  torchrun %s\n  ddprun   %s" %
                        (sorted(t_files), sorted(d_files)))
        return problems
    failing = "--fail-rank" in flags
    for path in sorted(t_files):
        t, d = t_files[path], d_files[path]
        if t is None:
            continue
        # Local rank 0 of a failed attempt may be stopped before it writes.
        sure = not (failing and path.startswith("attempt_0/0/"))
        if path.endswith("stdout.log") and sure and t != d:
            problems.append("%s: torchrun %r, ddprun %r" % (path, t, d))
        elif path.endswith("stderr.log") and sure:
            first = lambda s: s.splitlines()[0] if s else ""
            if first(t) != first(d) or not first(d).startswith("err of"):
                problems.append("%s: torchrun %r, ddprun %r" % (path, t, d))
        elif path.endswith("error.json"):
            msg = lambda s: json.loads(s)["message"]["message"]
            if msg(t) != msg(d) or "fails its first attempt" not in msg(d):
                problems.append("%s: torchrun %r, ddprun %r" % (path, t, d))
    return problems


def check_line(ddprun, flags):
    torchrun = [
        # torchrun itself, made to start on a torch without libuv too.
        "/usr/bin/python3", os.path.join(HERE, "torchrun_baseline.py")]
    with tempfile.TemporaryDirectory() as t, tempfile.TemporaryDirectory() as d:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            t_run = pool.submit(run, torchrun, flags, os.path.join(t, "logs"))
            d_run = pool.submit(run, [ddprun], flags, os.path.join(d, "logs"))
            (t_code, t_out), (d_code, d_out) = t_run.result(), d_run.result()
        if t_code != 0 or d_code != 0:
            return ["exit codes: torchrun %d, ddprun %d\n%s\n%s" %
                    (t_code, d_code, t_out[-2000:], d_out[-2000:])]
        _, t_files = tree(os.path.join(t, "logs"))
        _, d_files = tree(os.path.join(d, "logs"))
        problems = compare(flags, t_files, d_files)
        if not any(p.endswith("error.json") for p in d_files) and \
                "--fail-rank" in flags:
            problems.append("no error.json in %s" % sorted(d_files))
        print("%s: %d paths, %s" % (" ".join(flags), len(d_files),
                                    "same" if not problems else "DIFFERENT"),
              flush=True)
        return problems


def check_bad_log_dir(ddprun):
    """A --log-dir that cannot be made: one line naming the flag, exit 2."""
    p = subprocess.run([ddprun, "--standalone", "--log-dir", "/proc/no/logs",
                        "/bin/true"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60, text=True)
    if p.returncode != 2 or "--log-dir: cannot create '/proc/no/logs'" \
            not in p.stdout:
        return ["a bad --log-dir: exit %d, %r" % (p.returncode, p.stdout)]
    return []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    args = parser.parse_args()
    failures = check_bad_log_dir(args.ddprun)
    for flags in LINES:
        failures += ["%s: %s" % (" ".join(flags), p)
                     for p in check_line(args.ddprun, flags)]
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("OK: %d command lines, the same log tree as torchrun" % len(LINES))


if __name__ == "__main__":
    main()
