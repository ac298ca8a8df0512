"""Which threads wake while world 2 trains: runs `ddprun --standalone
--nproc-per-node 2 ddprun-mnist`, waits until both ranks train, then reads
/proc/<pid>/task/*/status of the agent and of each rank twice, `--window`
seconds apart, and prints each thread's voluntary (it slept: a wakeup) and
involuntary (it was switched out) context switches per second, busiest
first, with totals per process.

  /usr/bin/python3 bench/worker/wakeups.py [--window 3] [--epochs 60]
      [--build DIR]   (default: DDPRUN_BUILD_DIR or build/)

Indicative only: the run is one sample, on whatever else the machine runs.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def children(pid):
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def switches(pid):
    """{tid: (name, voluntary, involuntary)} of every thread of `pid`."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        out[int(tid)] = (fields["Name"].strip(),
                         int(fields["voluntary_ctxt_switches"]),
                         int(fields["nonvoluntary_ctxt_switches"]))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--build", default=os.environ.get(
        "DDPRUN_BUILD_DIR", os.path.join(ROOT, "build")))
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data", "mnist"))
    args = parser.parse_args()
    ddprun = os.path.join(args.build, "launcher", "ddprun")
    mnist = os.path.join(args.build, "mnist", "ddprun-mnist")
    summary = os.path.join(tempfile.mkdtemp(prefix="wakeups-"), "summary.json")
    agent = subprocess.Popen(
        [ddprun, "--standalone", "--nproc-per-node", "2", mnist,
         "--epochs", str(args.epochs), "--data-dir", args.data_dir, "--save", "",
         "--no-progress", "--summary-json", summary],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Training: two ranks, each past its start-up (its CPU time grows
        # steadily). A fixed settle time is good enough for a benchmark.
        deadline = time.time() + 60
        ranks = []
        while time.time() < deadline:
            ranks = [c for c in children(agent.pid) if comm(c).startswith("ddprun-mnist")]
            if len(ranks) == 2:
                break
            time.sleep(0.1)
        if len(ranks) != 2:
            sys.exit("the two ranks did not start within 60 s")
        time.sleep(3)  # past loading and the forming of the group
        procs = {"agent": agent.pid, "rank A": ranks[0], "rank B": ranks[1]}
        before = {name: switches(pid) for name, pid in procs.items()}
        time.sleep(args.window)
        after = {name: switches(pid) for name, pid in procs.items()}
        if agent.poll() is not None:
            sys.exit("the job ended during the window; raise --epochs")
        print(f"per second over {args.window:.1f} s of world-2 training "
              f"({args.build}):")
        print(f"{'process':8s} {'thread':18s} {'voluntary/s':>12s} {'involuntary/s':>14s}")
        for name in procs:
            rows = []
            for tid, (tname, vol, inv) in after[name].items():
                if tid not in before[name]:
                    continue
                _, vol0, inv0 = before[name][tid]
                rows.append((tname, (vol - vol0) / args.window, (inv - inv0) / args.window))
            rows.sort(key=lambda r: -(r[1] + r[2]))
            for tname, vol, inv in rows:
                if vol + inv >= 0.5:
                    print(f"{name:8s} {tname:18s} {vol:12.1f} {inv:14.1f}")
            print(f"{name:8s} {'(all threads)':18s} {sum(r[1] for r in rows):12.1f} "
                  f"{sum(r[2] for r in rows):14.1f}")
    finally:
        if agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()


if __name__ == "__main__":
    main()
