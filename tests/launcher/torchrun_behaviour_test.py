"""One scenario per torchrun behaviour, run under Debian's real torchrun
(torchrun_baseline.py: torch 1.13 here, 2.6 in Debian 13) and under ddprun
with the same command line, comparing what can be seen from outside either
program: exit codes, the files the workers write (behaviour_worker.py: one
per attempt and rank, from signal handlers too), processes left alive, files
the launchers write. What either launcher logs about itself is never the
evidence.

Where the torchrun at hand lacks a 2.x flag, the scenario asserts the 2.x
documented behaviour for ddprun and says so; where ddprun differs on purpose
(docs/TORCHRUN.md, **better** or **refused**), it asserts ddprun's documented
behaviour next to torchrun's.

Each behaviour prints one line: "same: ..." or "DIFFERENT: ..." (or
"ddprun as 2.x documents it: ..." where the torchrun at hand lacks the
flag). The log folder
(--log-dir, --redirects) is compared by launcher_torchrun_logdir_test and
the whole worker environment by launcher_torchrun_env_test.

Usage: torchrun_behaviour_test.py --ddprun PATH
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
from ports import free_port  # noqa: E402
from processes import stop  # noqa: E402
from waits import wait_for  # noqa: E402

WORKER = os.path.join(HERE, "behaviour_worker.py")
sys.path.insert(0, HERE)
from behaviour_worker import MESSAGE  # noqa: E402

TORCHRUN = ["/usr/bin/python3", os.path.join(HERE, "torchrun_baseline.py")]
# torchrun 1.13's monitor looks every 5 s by default: 0.5 keeps the failure
# scenarios short, the same in both.
COMMON = ["--monitor_interval", "0.5"]
# torch 1.13's torchrun crashes without --redirects/--tee here (its tee of a
# missing log file); ddprun takes the same flags.
CONSOLE = ["--redirects", "1", "--tee", "1"]
RUN_TIMEOUT_S = 60


class Run:
    """One launcher's run of a scenario: its exit code, console and the
    worker's out folder."""

    def __init__(self, name, code, output, out_dir):
        self.name, self.code, self.output, self.out_dir = (
            name, code, output, out_dir)

    def files(self, prefix=""):
        return sorted(n for n in os.listdir(self.out_dir)
                      if n.startswith(prefix) and not n.startswith("."))

    def read(self, name):
        with open(os.path.join(self.out_dir, name)) as f:
            return f.read()


class Scenario:
    """Temporary folders for one scenario, both launchers' argv."""

    def __init__(self, ddprun):
        self.ddprun = ddprun
        self.root = tempfile.mkdtemp(prefix="behaviour_")

    def argv(self, launcher, flags, mode, module=False):
        out = os.path.join(self.root, launcher, "out")
        os.makedirs(out, exist_ok=True)
        head = TORCHRUN if launcher == "torchrun" else [self.ddprun]
        program = ["-m", "behaviour_worker"] if module else [WORKER]
        return head + COMMON + flags + program + [out, mode], out

    def env(self, launcher, extra=None):
        home = os.path.join(self.root, launcher)
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
               "PYTHON_EXEC": "/usr/bin/python3",
               "TMPDIR": os.path.join(self.root, launcher)}
        env.update(extra or {})
        return env

    def start(self, launcher, flags, mode, module=False, env=None):
        """The launcher in a process group of its own (torchrun's workers
        are in it too): end_group() ends whatever is left."""
        argv, out = self.argv(launcher, flags, mode, module)
        p = subprocess.Popen(argv, env=self.env(launcher, env),
                             cwd=HERE if module else self.root,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        return p, out

    def run(self, launcher, flags, mode, module=False, env=None):
        p, out = self.start(launcher, flags, mode, module, env)
        try:
            output, _ = p.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            end_group(p)
            output = p.communicate()[0] + "\n(killed: still running after " \
                "%d s)" % RUN_TIMEOUT_S
            return Run(launcher, None, output, out)
        return Run(launcher, p.returncode, output, out)

    def both(self, flags_of, mode, module=False, env_of=None):
        """Both launchers at once; flags_of(launcher) gives each line (a
        port of its own)."""
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            runs = [pool.submit(self.run, name, flags_of(name), mode, module,
                                env_of(name) if env_of else None)
                    for name in ("torchrun", "ddprun")]
            return [r.result() for r in runs]

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)


def c10d(nproc, console=CONSOLE):
    """One node, nproc workers, a c10d rendezvous on a port of its own (no
    fixed 29400 or 29500 shared with other tests)."""
    return lambda _: ["--nnodes", "1", "--nproc_per_node", str(nproc),
                      "--rdzv_backend", "c10d", "--rdzv_endpoint",
                      "127.0.0.1:%d" % free_port(), "--rdzv_id", "behaviour"
                      ] + console


def end_group(p):
    """SIGKILL to the launcher's process group (its workers, if it left
    any), then the launcher itself, reaped."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    stop(p)


def alive(pid):
    """Whether `pid` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def tail(run):
    return "\n--- %s (exit %s) ---\n%s" % (run.name, run.code,
                                          run.output[-3000:])


# Each behaviour returns a list of differences: empty when the same.

def worker_fails(ddprun):
    """A worker exits 3: the launcher exits 1 and stops the other worker
    (SIGTERM, which its handler sees), leaving no worker behind."""
    s = Scenario(ddprun)
    try:
        problems = []
        for r in s.both(c10d(2), "fail"):
            pid = int(r.read("ready_0_0")) if "ready_0_0" in r.files() else 0
            seen = {"exit": r.code, "rank 1 failed": "failed_0_1" in r.files(),
                    "rank 0 got SIGTERM": "term_end_0_0" in r.files(),
                    "rank 0 gone": bool(pid) and not alive(pid)}
            want = {"exit": 1, "rank 1 failed": True,
                    "rank 0 got SIGTERM": True, "rank 0 gone": True}
            if seen != want:
                problems.append("%s: %s, want %s%s" %
                                (r.name, seen, want, tail(r)))
        return problems
    finally:
        s.close()


def max_restarts(ddprun):
    """--max_restarts 2, every worker fails every attempt: three attempts of
    both ranks (TORCHELASTIC_RESTART_COUNT 0, 1, 2), then exit 1."""
    s = Scenario(ddprun)
    try:
        t, d = s.both(lambda n: c10d(2)(n) + ["--max_restarts", "2"],
                      "always")
        want = ["start_%d_%d" % (a, r) for a in range(3) for r in range(2)]
        if t.files("start_") != want or t.code != 1:
            return ["torchrun: %s, exit %s; want %s, exit 1%s" %
                    (t.files("start_"), t.code, want, tail(t))]
        if d.files("start_") != t.files("start_") or d.code != t.code:
            return ["ddprun: %s, exit %s; torchrun %s, exit %s%s" %
                    (d.files("start_"), d.code, t.files("start_"), t.code,
                     tail(d))]
        return []
    finally:
        s.close()


def sigterm_to_launcher(ddprun):
    """SIGTERM to the launcher while its workers run: each worker gets
    SIGTERM and its handler, which takes TERM_S (4 s: more than ddprun's old
    3 s grace), ends before the launcher exits (no SIGKILL: both default to a
    30 s grace, torchrun's `timeout=30` of its close); the launcher exits as
    torchrun does (1: the SignalException out of its @record main, which
    writes it into TORCHELASTIC_ERROR_FILE) and leaves no worker behind."""
    s = Scenario(ddprun)
    procs = []
    try:
        files = {n: os.path.join(s.root, n + "_error.json")
                 for n in ("torchrun", "ddprun")}
        for name in ("torchrun", "ddprun"):
            p, out = s.start(name, c10d(2)(name), "term",
                             env={"TORCHELASTIC_ERROR_FILE": files[name]})
            procs.append((name, out, p))
        problems = []
        ready = ["ready_0_0", "ready_0_1"]
        signalled = []
        for name, out, p in procs:
            if not wait_for(lambda: all(os.path.exists(os.path.join(out, f))
                                        for f in ready) or
                            p.poll() is not None, RUN_TIMEOUT_S) or \
                    p.poll() is not None:
                problems.append("%s: workers never ready (exit %s)" %
                                (name, p.poll()))
                continue
            p.send_signal(signal.SIGTERM)
            signalled.append((name, out, p))
        for name, out, p in signalled:
            try:
                p.wait(timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                end_group(p)
                problems.append("%s: still running %d s after SIGTERM" %
                                (name, RUN_TIMEOUT_S))
                continue
            # What the workers had written when the launcher exited.
            r = Run(name, p.returncode, p.stdout.read(), out)
            pids = [int(r.read(f)) for f in ready if f in r.files()]
            try:
                with open(files[name]) as f:
                    said = json.load(f)["message"]["message"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                said = repr(e)
            seen = {"exit": r.code,
                    "handlers ended": r.files("term_end_"),
                    "workers gone": bool(pids) and not any(map(alive, pids)),
                    "error file": said}
            want = {"exit": 1, "handlers ended": ["term_end_0_0",
                                                  "term_end_0_1"],
                    "workers gone": True,
                    # torchrun's @record of its SignalException.
                    "error file": "SignalException: Process %d got signal: "
                    "15" % p.pid}
            if seen != want:
                problems.append("%s: %s, want %s%s" %
                                (name, seen, want, tail(r)))
        return problems
    finally:
        for _, _, p in procs:
            end_group(p)
            if p.stdout:
                p.stdout.close()
        s.close()


def error_file(ddprun):
    """A worker fails under torch's @record with TORCHELASTIC_ERROR_FILE set
    in the launcher's environment: the launcher copies the root cause (the
    worker's error.json) there, and its failure summary names rank 1 and
    shows the traceback. The worker's stderr goes to its log file
    (--redirects 2), so the traceback on the console is the launcher's."""
    s = Scenario(ddprun)
    try:
        files = {n: os.path.join(s.root, n + "_error.json")
                 for n in ("torchrun", "ddprun")}
        line = c10d(2, ["--redirects", "2", "--tee", "1"])
        runs = s.both(line, "raise",
                      env_of=lambda n: {"TORCHELASTIC_ERROR_FILE": files[n]})
        shapes, problems = {}, []

        def shape(value):
            if isinstance(value, dict):
                return {k: shape(v) for k, v in value.items()}
            return type(value).__name__

        def missing(want, have, at=""):
            """Keys (and types) of `want` that `have` lacks."""
            if not isinstance(want, dict) or not isinstance(have, dict):
                return [] if want == have else ["%s: %s, not %s" %
                                                (at, have, want)]
            return [m for k in want for m in
                    (missing(want[k], have[k], at + "." + k) if k in have
                     else [at + "." + k])]

        for r in runs:
            try:
                with open(files[r.name]) as f:
                    doc = json.load(f)
            except (OSError, ValueError) as e:
                problems.append("%s: no error file (%s)%s" % (r.name, e,
                                                             tail(r)))
                continue
            shapes[r.name] = shape(doc)
            message = doc.get("message") if isinstance(doc, dict) else None
            message = message if isinstance(message, dict) else {}
            extra = message.get("extraInfo")
            extra = extra if isinstance(extra, dict) else {}
            content = {
                "message": MESSAGE in message.get("message", ""),
                "py_callstack": "Traceback (most recent call last)" in
                extra.get("py_callstack", "") and
                MESSAGE in extra.get("py_callstack", ""),
                # torchrun's override: the worker's exit code.
                "errorCode": message.get("errorCode"),
            }
            if content != {"message": True, "py_callstack": True,
                           "errorCode": 1}:
                problems.append("%s: the error file holds %s: %r" %
                                (r.name, content, doc))
            summary = {
                "exit": r.code,
                "names rank 1": bool(re.search(r"rank\s*:?\s*1\b", r.output)),
                "message": MESSAGE in r.output,
                "traceback": "Traceback (most recent call last)" in r.output,
            }
            if summary != {"exit": 1, "names rank 1": True, "message": True,
                           "traceback": True}:
                problems.append("%s's failure summary: %s%s" %
                                (r.name, summary, tail(r)))
        # Every key torchrun writes, with its type; ddprun adds
        # extraInfo.rank and .host (the root cause may be another node's).
        if len(shapes) == 2:
            lacking = missing(shapes["torchrun"], shapes["ddprun"])
            extra = set() if lacking else set(
                shapes["ddprun"]["message"]["extraInfo"]) - set(
                    shapes["torchrun"]["message"]["extraInfo"])
            if lacking or extra - {"rank", "host"}:
                problems.append("error file: ddprun lacks %s, adds %s; "
                                "torchrun %s, ddprun %s" %
                                (lacking, sorted(extra), shapes["torchrun"],
                                 shapes["ddprun"]))
        return problems
    finally:
        s.close()


def master_port_alone(ddprun):
    """--master_port P alone (torchrun's static form, one node): the worker's
    MASTER_PORT is P (the whole environment: launcher_torchrun_env_test)."""
    s = Scenario(ddprun)
    try:
        ports = {n: free_port() for n in ("torchrun", "ddprun")}
        runs = s.both(lambda n: ["--nproc_per_node", "1", "--master_port",
                                 str(ports[n])] + CONSOLE, "ok")
        problems = []
        for r in runs:
            seen = json.loads(r.read("ok_0_0")) if "ok_0_0" in r.files() \
                else {}
            if r.code != 0 or seen.get("MASTER_PORT") != str(ports[r.name]):
                problems.append("%s: exit %s, MASTER_PORT %s, want %d%s" %
                                (r.name, r.code, seen.get("MASTER_PORT"),
                                 ports[r.name], tail(r)))
        return problems
    finally:
        s.close()


def local_ranks_filter(ddprun):
    """--local-ranks-filter 0 (torchrun >= 2.3; 1.13 has no such flag, and
    then ddprun is held to 2.x's documentation: only local rank 0's lines
    reach the console)."""
    s = Scenario(ddprun)
    try:
        help_text = subprocess.run(TORCHRUN + ["--help"],
                                   stdout=subprocess.PIPE, text=True,
                                   env=s.env("torchrun"), timeout=60).stdout
        has_flag = "--local-ranks-filter" in help_text
        names = ("torchrun", "ddprun") if has_flag else ("ddprun",)
        problems = []
        for name in names:
            r = s.run(name, c10d(2)(name) + ["--local-ranks-filter", "0"],
                      "print")
            lines = {rank: ("behaviour line of local rank %d" % rank)
                     in r.output for rank in (0, 1)}
            if r.code != 0 or lines != {0: True, 1: False}:
                problems.append("%s: exit %s, lines on the console %s, want "
                                "rank 0's only%s" % (name, r.code, lines,
                                                     tail(r)))
        if not has_flag:
            problems.append(None)  # compared against 2.x's documentation
        return problems
    finally:
        s.close()


def omp_num_threads(ddprun):
    """--nproc_per_node 2 and no OMP_NUM_THREADS: each worker gets
    OMP_NUM_THREADS=1; with one set, it is left alone."""
    s = Scenario(ddprun)
    try:
        problems = []
        for env, want in ((None, "1"), ({"OMP_NUM_THREADS": "3"}, "3")):
            for r in s.both(c10d(2), "ok", env_of=lambda _: env):
                seen = [json.loads(r.read(f)).get("OMP_NUM_THREADS")
                        for f in r.files("ok_")]
                if r.code != 0 or seen != [want, want]:
                    problems.append("%s with OMP_NUM_THREADS=%s: exit %s, "
                                    "workers saw %s%s" %
                                    (r.name, (env or {}).get(
                                        "OMP_NUM_THREADS"), r.code, seen,
                                     tail(r)))
            for name in ("torchrun", "ddprun"):
                shutil.rmtree(os.path.join(s.root, name, "out"))
        return problems
    finally:
        s.close()


def success_and_module(ddprun):
    """Every rank exits 0: the launcher exits 0; `-m MODULE` runs the module
    (python -m: its __spec__ names it) on every rank."""
    s = Scenario(ddprun)
    try:
        problems = []
        for r in s.both(c10d(2), "ok", module=True):
            seen = [json.loads(r.read(f))["module"] for f in r.files("ok_")]
            if r.code != 0 or seen != ["behaviour_worker"] * 2:
                problems.append("%s: exit %s, modules run %s%s" %
                                (r.name, r.code, seen, tail(r)))
        return problems
    finally:
        s.close()


def rdzv_conf_unknown_key(ddprun):
    """--rdzv_conf with a key no rendezvous knows: torchrun's c10d ignores it
    and runs; ddprun refuses it (docs/TORCHRUN.md: **refused**, a typo such
    as join_timout would silently keep the default), exit 2 before any
    worker starts."""
    s = Scenario(ddprun)
    try:
        t, d = s.both(lambda n: c10d(1)(n) + ["--rdzv_conf", "no_such_key=1"],
                      "ok")
        problems = []
        if t.code != 0 or t.files("ok_") != ["ok_0_0"]:
            problems.append("torchrun: exit %s, %s; want exit 0, ok_0_0%s" %
                            (t.code, t.files(), tail(t)))
        if d.code != 2 or d.files() or "unknown key 'no_such_key'" \
                not in d.output:
            problems.append("ddprun: exit %s, %s; want exit 2, no worker, "
                            "\"unknown key 'no_such_key'\"%s" %
                            (d.code, d.files(), tail(d)))
        return problems
    finally:
        s.close()


def standalone_run_id(ddprun):
    """--standalone with --rdzv_id: torchrun (1.13 and 2.x) replaces the id
    with a random uuid, which the workers see as TORCHELASTIC_RUN_ID; ddprun
    keeps the id it was given (docs/TORCHRUN.md: **better**) and is random
    only without one. torch 1.13's --standalone serves on the fixed port
    29400: a run that meets another's store there is tried once more."""
    s = Scenario(ddprun)
    try:
        problems = []
        for name, want_given in (("torchrun", False), ("ddprun", True)):
            for _ in range(2):
                shutil.rmtree(os.path.join(s.root, name, "out"),
                              ignore_errors=True)
                r = s.run(name, ["--standalone", "--nproc_per_node", "1",
                                 "--rdzv_id", "given-id"] + CONSOLE, "ok")
                if r.code == 0:
                    break
            env = json.loads(r.read("ok_0_0")) if "ok_0_0" in r.files() \
                else {}
            run_id = env.get("TORCHELASTIC_RUN_ID")
            if r.code != 0 or not run_id or \
                    (run_id == "given-id") != want_given:
                problems.append("%s: exit %s, TORCHELASTIC_RUN_ID %r, want "
                                "%s%s" % (name, r.code, run_id,
                                          "given-id" if want_given else
                                          "another (random)", tail(r)))
        return problems
    finally:
        s.close()


BEHAVIOURS = [
    ("a failing worker: exit 1, the other worker stopped", worker_fails),
    ("--max_restarts 2: three attempts of every rank", max_restarts),
    ("SIGTERM to the launcher: forwarded, handlers end, exit 1",
     sigterm_to_launcher),
    ("TORCHELASTIC_ERROR_FILE gets the root cause; the summary names the "
     "rank and shows the traceback", error_file),
    ("--master_port alone: the workers' MASTER_PORT", master_port_alone),
    ("--local-ranks-filter 0: local rank 0's lines only", local_ranks_filter),
    ("OMP_NUM_THREADS=1 by default with 2 workers, kept when set",
     omp_num_threads),
    ("all ranks exit 0: exit 0; -m runs the module", success_and_module),
    ("--rdzv_conf unknown key: torchrun ignores it, ddprun refuses it "
     "(documented)", rdzv_conf_unknown_key),
    ("--standalone --rdzv_id: torchrun drops the id, ddprun keeps it "
     "(documented)", standalone_run_id),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("-k", help="only behaviours whose function name "
                        "contains this")
    args = parser.parse_args()
    ddprun = os.path.abspath(args.ddprun)
    failures = 0
    for title, check in BEHAVIOURS:
        if args.k and args.k not in check.__name__:
            continue
        start = time.monotonic()
        problems = check(ddprun)
        took = time.monotonic() - start
        if None in problems:
            problems.remove(None)
            verdict = "ddprun as 2.x documents it" if not problems else None
        else:
            verdict = "same" if not problems else None
        if verdict:
            print("%s: %s (%.1f s)" % (verdict, title, took), flush=True)
        else:
            failures += 1
            print("DIFFERENT: %s (%.1f s)\n  %s" %
                  (title, took, "\n  ".join(problems)), flush=True)
    if failures:
        print("FAIL: %d behaviours differ" % failures)
        sys.exit(1)
    print("OK: every behaviour as torchrun's")


if __name__ == "__main__":
    main()
