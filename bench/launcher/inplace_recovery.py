#!/usr/bin/env python3
"""What a kill -9 of one worker costs: ddprun-mnist recovering
in place (the default: survivors keep running, only the lost rank is
replaced) and restarting everything (`ddprun-mnist --no-in-place`, every
worker restarts from the newest checkpoint), and torchrun (Debian's 1.13)
on the same job in Python DDP (bench/launcher/mnist_ddp_ckpt.py: same
model, data, seed, batch, world and checkpoints; --torchrun-epochs, fewer
by default, since its steps are slower here: the figures are per fault). Each launcher's runs with
faults sit beside a fault-free run of the same command; every mode runs
once per round, rounds interleaved, and the figures are medians over the
rounds. Each run with faults takes --faults kills -9 of a random worker,
each once training has passed the previous one (its checkpoint files are
the step counter) and, with --prewarm, the standbys wait again (faults
rarer than a standby's start), plus a seeded 0.05-0.4 s.

Figures per mode:
  lost s/fault   (wall of the run with faults - wall of the same launcher's
                 fault-free run of that round) / faults
  kill->step s   kill -9 -> the next completed training step. In place:
                 every fault (the summary's resumed_step_unix_seconds);
                 restart-all and torchrun: the last fault (the final
                 round's first_step_unix_seconds)
  steps lost     per fault. In place: a survivor's last completed step -
                 the step training resumed at (their log lines), the worst;
                 torchrun: rank 0's step at the kill - the newest checkpoint
                 then, the mean; restart-all: not measured (ddprun-mnist
                 reports no step outside its checkpoints)

--normal-standby adds the in-place and fault-free runs again with ddprun
started without CAP_SYS_NICE (setpriv --bounding-set -sys_nice): it then
cannot move a standby back off SCHED_IDLE, so its standbys start at the
training's priority, as before idle standbys; the two pairs interleave in
one command. Each lost s/fault comes with its spread over the rounds, and
the scheduling policy the standbys waited under (asserting which ran).

--baseline-build DIR adds the in-place and fault-free runs again with the
ddprun and ddprun-mnist of another build (e.g. main's), interleaved with
this build's: the comparison is in one command. Each run prints the CPU-s
one refill of the standby pool cost: a standby started by exec counts its
whole start-up; one forked by the zygote counts its own CPU since the fork
plus the zygote's CPU per fork (with the fork's intermediate process).

--breakdown also times the parts of each in-place recovery from the
processes' own log lines (ms clocks; ddprun-mnist at --log-level debug):
kill -> the agent sees the exit -> failure reported -> the next round
assigned -> the replacement activated (the survivors are told first) -> a
survivor has the round's environment -> its new process group is formed ->
the state is synced -> the first step completes. Medians over every fault.

  python3 bench/launcher/inplace_recovery.py [--runs 3] [--faults 3]
      [--nproc 2] [--prewarm] [--epochs 12] [--torchrun-epochs 4]
      [--train-limit 12000] [--seed 1]
      [--modes in-place,restart-all,torchrun] [--breakdown]
      [--normal-standby] [--baseline-build DIR]

Needs a build with ddprun-mnist (DDPRUN_BUILD_DIR, default build/), the
MNIST files in data/mnist and, for the torchrun mode, /usr/bin/python3 with
torch (python3-torch).
"""
import argparse
import glob
import json
import os
import random
import re
import signal
import statistics
import subprocess
import tempfile
import time

from proc_util import children, kill_group, log_time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


# How often the bench looks at the job between faults. Each look reads
# /proc for every thread and child of ddprun (~0.5 ms of CPU): at 5 ms this
# process took 3.2 CPU-s of the 2 cores the job trains on in a run with 3
# faults (0.1 in the fault-free run, which it only waits for), counted as
# time lost to the faults; at 50 ms 0.5 CPU-s. A fault's own timing does
# not depend on it (the kill's time is taken when it is sent). Each run
# line shows the bench's own CPU-s.
POLL_S = 0.1


def wait_for(cond, timeout, what, log_path=None, proc=None):
    """`cond`'s first true value; an error after `timeout`, or when `proc`
    (the job) ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the job ended first (make it longer)"
                               + ("\n" + read(log_path) if log_path else ""))
        time.sleep(POLL_S)
    raise TimeoutError(what + ("\n" + read(log_path) if log_path else ""))


def newest_checkpoint(folder):
    steps = [int(m.group(1)) for m in
             (re.search(r"ckpt-(\d+)\.pt$", p)
              for p in glob.glob(os.path.join(folder, "ckpt-*.pt"))) if m]
    return max(steps) if steps else 0


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(e.split(b"=", 1) for e in f.read().split(b"\0")
                        if b"=" in e)
    except OSError:
        return {}


def first_line(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def is_zygote(pid):
    """The standbys' zygote (ddprun --prewarm of a libddp program): it names
    itself so."""
    return first_line(f"/proc/{pid}/comm") == "ddprun-zygote"


def waits_on_pipe(pid):
    return first_line(f"/proc/{pid}/wchan").endswith("pipe_read")


def is_ddprun_worker(pid):
    """A ddprun worker: started with its RANK, or a prewarmed standby
    (DDPRUN_STANDBY_FD; /proc keeps the original environment) that was
    activated, which closed the pipe it waited on; or a standby forked by the
    zygote (DDPRUN_ZYGOTE_FD, the zygote's environment in /proc) that no
    longer waits on its pipe."""
    env = environ(pid)
    if b"DDPRUN_ZYGOTE_FD" in env:
        return not is_zygote(pid) and not waits_on_pipe(pid)
    fd = env.get(b"DDPRUN_STANDBY_FD")
    if fd is None:
        return b"RANK" in env
    try:
        return not os.readlink(f"/proc/{pid}/fd/{int(fd)}").startswith("pipe:")
    except (OSError, ValueError):
        return True


def cpu_seconds(pid, children=False):
    """utime + stime of `pid` (with its reaped children's: cutime, cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        if children:
            ticks += int(fields[13]) + int(fields[14])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def waiting_standby_cpu(pid):
    """CPU seconds a prewarmed standby spent getting ready, once it waits
    for its round (None while it is not waiting). A forked standby's count
    from its fork."""
    env = environ(pid)
    if b"DDPRUN_STANDBY_FD" not in env and b"DDPRUN_ZYGOTE_FD" not in env:
        return None
    if is_zygote(pid) or not waits_on_pipe(pid):
        return None
    return cpu_seconds(pid)


def zygote_cpu(pids):
    """The zygote's CPU seconds, its reaped children's (the intermediate
    process of each fork) included; None when there is none."""
    for pid in pids:
        if is_zygote(pid):
            return cpu_seconds(pid, children=True)
    return None


# Modes whose ddprun runs without CAP_SYS_NICE: it cannot move a standby
# back off SCHED_IDLE, so its standbys start at the training's priority (the
# behaviour before idle standbys), beside the same job with idle ones.
NORMAL_STANDBY = ("fault-free normal-standby", "in-place normal-standby")


def ddprun_command(args, build, out, mode):
    if mode.endswith(" base"):
        build = args.baseline_build
    command = []
    if mode in NORMAL_STANDBY:
        command = ["setpriv", "--bounding-set", "-sys_nice"]
    command += [os.path.join(build, "launcher", "ddprun"), "--standalone",
               "--nproc-per-node", str(args.nproc), "--max-restarts",
               str(args.faults + 2), "--monitor-interval", "0.05"]
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
    if args.breakdown and mode.startswith("in-place"):
        command += ["--log-level", "debug"]
    return command


def torchrun_command(args, out):
    return [args.python, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(args.nproc), "--max_restarts",
            str(args.faults + 2), "--monitor_interval", "0.05",
            # Debian's torchrun 1.13 crashes under Python 3.11 without them.
            "--redirects", "1", "--tee", "1",
            os.path.join(HERE, "mnist_ddp_ckpt.py"), "--epochs",
            str(args.torchrun_epochs), "--data-dir", os.path.join(ROOT, "data", "mnist"),
            "--train-limit", str(args.train_limit), "--seed", "7",
            "--summary-json", os.path.join(out, "summary.json"),
            "--checkpoint-dir", os.path.join(out, "ckpt"),
            "--checkpoint-every", "20", "--out", out]


def torchrun_workers(out, attempt):
    pids = []
    for path in glob.glob(os.path.join(out, f"pid_{attempt}_*")):
        text = read(path).strip()
        if text:
            pids.append(int(text))
    return pids


def one_run(args, build, mode, rng_seed):
    """One run of `mode`: a dict of wall, kills [(time, newest checkpoint,
    rank 0's step or None)], the summary, the log path's text."""
    rng = random.Random(rng_seed)
    torchrun = mode.startswith("torchrun")
    faulty = mode in ("in-place", "restart-all", "torchrun",
                      "in-place normal-standby", "in-place base")
    with tempfile.TemporaryDirectory() as out:
        ckpt = os.path.join(out, "ckpt")
        command = (torchrun_command(args, out) if torchrun
                   else ddprun_command(args, build, out, mode))
        err_path = os.path.join(out, "err")
        kills = []
        standby_cpu = []
        zygote = []  # the zygote's CPU-s at each fault after the first
        standby_policies = set()  # scheduling policies of waiting standbys
        own_cpu = sum(os.times()[:2])  # this process's, beside the job
        with open(err_path, "w") as err:
            start = time.time()
            proc = subprocess.Popen(command, stdout=err, stderr=err,
                                    start_new_session=True)
        try:
            passed = 0  # training must pass this checkpoint step first
            for fault in range(args.faults if faulty else 0):
                wait_for(lambda: newest_checkpoint(ckpt) > passed, 600,
                         f"{mode}: no checkpoint past step {passed}", err_path,
                         proc)
                if args.prewarm and not torchrun:
                    # Faults rarer than a standby's start: the standbys that
                    # replace the next victim wait (otherwise it would be
                    # replaced by a cold start).
                    wait_for(lambda: sum(waiting_standby_cpu(p) is not None
                                         for p in children(proc.pid))
                             >= args.nproc, 600,
                             f"{mode}: no standbys waiting", err_path, proc)
                time.sleep(rng.uniform(0.05, 0.4))
                if torchrun:
                    # Attempt `fault` (one restart per fault): its ranks.
                    workers = wait_for(
                        lambda: (len(torchrun_workers(out, fault)) == args.nproc
                                 and torchrun_workers(out, fault)),
                        600, f"{mode}: no workers of attempt {fault}", err_path,
                        proc)
                else:
                    workers = [p for p in children(proc.pid)
                               if is_ddprun_worker(p)]
                    if fault > 0 and args.prewarm:
                        # The standby that replaced the last victim's has
                        # been started again: what its start cost.
                        waiting = [p for p in children(proc.pid)
                                   if waiting_standby_cpu(p) is not None]
                        standby_cpu += [c for c in map(waiting_standby_cpu,
                                                       waiting)
                                        if c is not None]
                        z = zygote_cpu(children(proc.pid))
                        if z is not None:
                            zygote.append(z)
                        for p in waiting:
                            try:
                                standby_policies.add(os.sched_getscheduler(p))
                            except OSError:
                                pass
                victim = rng.choice(sorted(workers))
                newest = newest_checkpoint(ckpt)
                step = None
                if torchrun:
                    text = read(os.path.join(out, "step")).strip()
                    step = int(text) if text else None
                kill_time = time.time()
                os.kill(victim, signal.SIGKILL)
                kills.append((kill_time, newest, step))
                passed = max(newest, step or 0)
            proc.wait(timeout=1200)
        finally:
            kill_group(proc)
        wall = time.time() - start
        own_cpu = sum(os.times()[:2]) - own_cpu
        log = read(err_path)
        if proc.returncode != 0:
            raise RuntimeError(f"{mode}: exit {proc.returncode}\n{log}")
        summary = json.loads(read(os.path.join(out, "summary.json")))
        forked = len(re.findall(r"forked by the zygote", log))
        return {"wall": wall, "kills": kills, "summary": summary, "log": log,
                "standby_cpu": standby_cpu, "own_cpu": own_cpu,
                "standby_policies": standby_policies, "zygote_cpu": zygote,
                "forked_activations": forked}


def steps_lost(mode, run):
    if mode.startswith("in-place"):
        behind = [int(a) - int(b) for a, b in re.findall(
            r"stopped at step (\d+), resuming at step (\d+)", run["log"])]
        return max(0, max(behind)) if behind else None
    if mode == "torchrun":
        lost = [s - c for _, c, s in run["kills"] if s is not None]
        return statistics.mean(lost) if lost else None
    return None


def kill_to_step(mode, run):
    """kill -9 -> the next completed step, per measured fault."""
    kills = [t for t, _, _ in run["kills"]]
    if not kills:
        return []
    if mode.startswith("in-place"):
        return [s - t for s, t in
                zip(run["summary"].get("resumed_step_unix_seconds", []), kills)]
    first = run["summary"].get("first_step_unix_seconds")
    return [first - kills[-1]] if first else []


# Breakdown of an in-place recovery: (name, pattern of the log line that
# ends it). The first line matching after the previous event counts.
EVENTS = [
    ("agent sees the exit", r"\[ddprun\] .*ended: signal SIGKILL"),
    ("failure reported", r"\[ddprun\] .*reported the failure of round"),
    ("next round assigned", r"\[ddprun\] .*\] round \d+: node rank"),
    ("replacement activated", r"\[ddprun\] .*local rank \d+ \(rank \d+\) "
                              r"(replaced by a prewarmed worker|started anew)"),
    ("survivor has the round", r"round \d+'s environment received"),
    ("group formed", r"in-place recovery: process group formed"),
    ("state synced", r"in-place recovery: state synced"),
]


def breakdown(run):
    """Per fault: the time of each event after the kill (s), and the first
    completed step's."""
    lines = run["log"].splitlines()
    stamps = []
    for line in lines:
        if line.startswith("[20"):
            try:
                stamps.append((log_time(line), line))
            except ValueError:
                pass
    resumed = run["summary"].get("resumed_step_unix_seconds", [])
    out = []
    for i, (kill, _, _) in enumerate(run["kills"]):
        at = kill - 0.002  # the log's clock has ms
        parts = []
        for name, pattern in EVENTS:
            hit = next((t for t, l in stamps
                        if t >= at and re.search(pattern, l)), None)
            if hit is None:
                break
            parts.append((name, hit - kill))
            at = hit
        if i < len(resumed):
            parts.append(("first step completed", resumed[i] - kill))
        out.append(parts)
    return out


# Each mode with faults and the fault-free mode its wall is compared with.
BASES = {"in-place": "fault-free", "restart-all": "fault-free",
         "torchrun": "torchrun fault-free",
         "in-place normal-standby": "fault-free normal-standby",
         "in-place base": "fault-free base"}
# The same modes with --baseline-build's binaries.
BASELINE = ("fault-free base", "in-place base")
POLICY_NAMES = {os.SCHED_OTHER: "SCHED_OTHER", os.SCHED_IDLE: "SCHED_IDLE",
                os.SCHED_BATCH: "SCHED_BATCH"}


def zygote_deltas(run):
    """The zygote's CPU-s between consecutive faults: one refill (fork) each."""
    z = run["zygote_cpu"]
    return [b - a for a, b in zip(z, z[1:])]


def refill_cpu(run):
    """A run's CPU-s per refill: the waiting standbys' own (+ the zygote's)."""
    text = f"{statistics.median(run['standby_cpu']):.2f} CPU-s"
    deltas = zygote_deltas(run)
    if deltas:
        text += f" + zygote {statistics.median(deltas):.3f}"
    return text


def main():
    global POLL_S
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--faults", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--prewarm", action="store_true")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--torchrun-epochs", type=int, default=4)
    parser.add_argument("--train-limit", type=int, default=12000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default="in-place,restart-all,torchrun")
    parser.add_argument("--breakdown", action="store_true")
    parser.add_argument("--normal-standby", action="store_true",
                        help="also run in-place and fault-free with the "
                        "standbys at the training's priority (ddprun without "
                        "CAP_SYS_NICE), interleaved with the idle ones")
    parser.add_argument("--baseline-build", default="",
                        help="also run in-place and fault-free with the "
                        "ddprun and ddprun-mnist of this build folder "
                        "(launcher/ddprun, mnist/ddprun-mnist), interleaved: "
                        "the baseline of a comparison")
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--poll", type=float, default=POLL_S,
                        help="seconds between the bench's looks at the job "
                        "(the bench ran with 0.005 before)")
    args = parser.parse_args()
    POLL_S = args.poll
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    wanted = args.modes.split(",")
    modes = []
    if "in-place" in wanted or "restart-all" in wanted:
        modes.append("fault-free")
    modes += [m for m in ("in-place", "restart-all") if m in wanted]
    if args.normal_standby and "in-place" in wanted:
        modes += list(NORMAL_STANDBY)
    if args.baseline_build and "in-place" in wanted:
        modes += list(BASELINE)
    if "torchrun" in wanted:
        modes += ["torchrun fault-free", "torchrun"]
    results = {m: [] for m in modes}
    for run in range(args.runs):
        for mode in modes:
            r = one_run(args, build, mode, args.seed * 1000 + run)
            results[mode].append(r)
            base = BASES.get(mode)
            line = (f"run {run} {mode:20s} wall {r['wall']:6.2f} s "
                    f"(bench {r['own_cpu']:.2f} CPU-s)")
            if base:
                lost = (r["wall"] - results[base][-1]["wall"]) / args.faults
                line += f" lost/fault {lost:5.2f} s"
                steps = kill_to_step(mode, r)
                if steps:
                    line += " kill->step " + " ".join(f"{s:.3f}" for s in steps)
                lost_steps = steps_lost(mode, r)
                if lost_steps is not None:
                    line += f" steps lost {lost_steps:g}"
            accuracy = r["summary"].get("test_accuracy")
            if accuracy is not None:
                line += f" accuracy {100 * accuracy:.2f}%"
            if r["standby_cpu"]:
                line += (" refill " + refill_cpu(r) +
                         f", {r['forked_activations']} forked activated")
            print(line, flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"\nmedians over {args.runs} rounds, {args.faults} kills -9 per "
          f"run, --nproc-per-node {args.nproc}"
          f"{' --prewarm' if args.prewarm else ''}, --epochs {args.epochs} "
          f"(torchrun {args.torchrun_epochs}), "
          f"load {load}:")
    for mode, base in BASES.items():
        if mode not in results:
            continue
        lost_time = [(r["wall"] - b["wall"]) / args.faults
                     for r, b in zip(results[mode], results[base])]
        policies = set().union(*(r["standby_policies"] for r in results[mode]))
        steps = [s for r in results[mode] for s in kill_to_step(mode, r)]
        lost = [x for x in (steps_lost(mode, r) for r in results[mode])
                if x is not None]
        print(f"  {mode:12s} lost s/fault {statistics.median(lost_time):6.2f}"
              f" (runs {min(lost_time):.2f}..{max(lost_time):.2f})"
              + (f"  kill->step s {statistics.median(steps):6.3f}"
                 if steps else "")
              + (f"  steps lost/fault {max(lost):g} (worst run)"
                 if lost else "")
              + f"  ({base} wall {statistics.median(r['wall'] for r in results[base]):.2f} s)"
              + (f"  standbys waited under "
                 + ",".join(POLICY_NAMES.get(p, str(p)) for p in sorted(policies))
                 if policies else ""))
    for mode in results:
        runs = [r for r in results[mode] if r["standby_cpu"]]
        if runs:
            per = [c for r in runs for c in r["standby_cpu"]]
            zyg = [d for r in runs for d in zygote_deltas(r)]
            print(f"  {mode:12s} CPU-s per refill: the waiting standby's own "
                  f"{statistics.median(per):.3f} (median of {len(per)})"
                  + (f" + the zygote's per fork {statistics.median(zyg):.3f}"
                     f" (median of {len(zyg)})" if zyg else "")
                  + f"; forked standbys activated: "
                  f"{sum(r['forked_activations'] for r in results[mode])}")
    for bd_mode in ("in-place", "in-place base"):
        if args.breakdown and bd_mode in results:
            print_breakdown(bd_mode, results[bd_mode])


def print_breakdown(mode, runs):
    """The --breakdown table of `mode`'s in-place recoveries."""
    per_event = {}
    for r in runs:
        for parts in breakdown(r):
            for name, seconds in parts:
                per_event.setdefault(name, []).append(seconds)
    print(f"\n{mode} recovery, kill -9 -> (median over every fault, s "
          "after the kill; the log clocks have ms):")
    previous = 0.0
    for name, _ in EVENTS + [("first step completed", None)]:
        if name in per_event:
            median = statistics.median(per_event[name])
            print(f"  {name:24s} {median:7.3f}  (+{median - previous:.3f})"
                  f"  n={len(per_event[name])}")
            previous = median
    cpu = [c for r in runs for c in r["standby_cpu"]]
    if cpu:
        print(f"  a waiting standby took {statistics.median(cpu):.2f} CPU-s "
              f"to get ready (median of {len(cpu)}; exec'd: torch, the data "
              f"from the node's cache; forked by the zygote: since its fork)")


if __name__ == "__main__":
    main()
