"""Allreduce latency and bandwidth on one node, 4 KB ... 256 MB, at world 2
and 4: libddp's gradient allreduce (shared memory) as DataParallel uses it
by default under ddprun (gradients allocated in the node's shared memory,
summed where they lie), and its other layouts (copied: a gradient in
private memory, copied into the segment, DataParallel's default before
shared gradients; flat: PyTorch DDP's default bucket in the segment;
resident: gradient_as_bucket_view),
ProcessGroupGloo in C++, Python torch.distributed's Gloo, and
memcpy of the same bytes on this machine (rank 0 alone, measured inside the
C++ run). Launches alternate (C++, Python, Python, C++, ...) and inside the
C++ run the three alternate per repetition; figures are medians.

  /usr/bin/python3 bench/collectives/compare.py [--runs 3] [--worlds 2,4]
      [--pin] [--baseline OTHER_BUILD_DIR]
  (bench/collectives/run.sh builds what is needed and calls this)

Bandwidth is algorithm bandwidth: bytes / seconds per allreduce. The memcpy
baseline copies the same bytes once, private buffer to private buffer, by
rank 0 alone; "libddp / memcpy" is memcpy's time over libddp's.

--pin: one CPU per local rank in the C++ runs (the bench's --pin); on a
loaded machine it keeps the scheduler from putting two ranks on one core.
--baseline: also runs OTHER_BUILD_DIR's ddprun-allreduce-bench (e.g. a
build of main) in the same rotation, and prints libddp's time against it.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = [4 << 10, 64 << 10, 400 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]


def run(command, env, timeout):
    result = subprocess.run(command, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, timeout=timeout, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(command)}\n{result.stdout[-3000:]}")


def human(n):
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3, help="launches of each program")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per launch")
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--pin", action="store_true",
                        help="one CPU per local rank in the C++ runs")
    parser.add_argument("--baseline", default="",
                        help="another build dir whose C++ bench runs interleaved")
    parser.add_argument("--no-python", action="store_true",
                        help="skip torch.distributed (the C++ runs only)")
    parser.add_argument("--results", default="",
                        help="only print the tables of an earlier run's results.jsonl")
    args = parser.parse_args()
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    ddprun = os.path.join(build, "launcher", "ddprun")
    bench = os.path.join(build, "bench", "collectives", "ddprun-allreduce-bench")
    for path in (ddprun, bench) if not args.results else ():
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is not built; run bench/collectives/run.sh")
    env = dict(os.environ, PYTHON_EXEC=args.python)
    env.pop("OMP_NUM_THREADS", None)
    out = tempfile.mkdtemp(prefix="bench-collectives-")
    results = os.path.join(out, "results.jsonl")
    worlds = [int(w) for w in args.worlds.split(",")]
    common = ["--out", results, "--reps", str(args.reps), "--sizes", args.sizes]
    pin = ["--pin"] if args.pin else []
    programs = {"cpp": [bench, *common, *pin]}
    if not args.no_python:
        programs["python"] = [os.path.join(ROOT, "bench", "collectives", "allreduce_torch.py"),
                              *common]
    baseline_results = os.path.join(out, "baseline.jsonl")
    if args.baseline:
        other = os.path.join(args.baseline, "bench", "collectives", "ddprun-allreduce-bench")
        if not os.access(other, os.X_OK):
            sys.exit(f"--baseline: {other} is not built")
        programs["baseline"] = [other, "--out", baseline_results, *common[2:], *pin]
    if args.results:
        results = args.results
    for i in range(args.runs if not args.results else 0):
        for world in worlds:
            order = list(programs) if i % 2 == 0 else list(programs)[::-1]
            for name in order:
                run([ddprun, "--standalone", "--nproc-per-node", str(world), *programs[name]],
                    env, args.timeout)
                print(f"run {i + 1}/{args.runs} world {world} {name} done", flush=True)

    samples = collections.defaultdict(list)
    slept = collections.defaultdict(list)
    median_call = collections.defaultdict(list)
    with open(results) as f:
        for line in f:
            r = json.loads(line)
            samples[(r["impl"], r["world"], r["bytes"])].append(r["seconds"])
            if "slept" in r:
                slept[(r["impl"], r["world"], r["bytes"])].append(r["slept"])
            if "median_call_seconds" in r:
                median_call[(r["impl"], r["world"], r["bytes"])].append(
                    r["median_call_seconds"])
    if os.path.exists(baseline_results):
        with open(baseline_results) as f:
            for line in f:
                r = json.loads(line)
                samples[("baseline " + r["impl"], r["world"], r["bytes"])].append(r["seconds"])

    def med(impl, world, size):
        s = samples.get((impl, world, size))
        return statistics.median(s) if s else float("nan")

    sizes = [int(s) for s in args.sizes.split(",")]
    load = os.getloadavg()
    print()
    print(f"{os.cpu_count()} cores, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; "
          f"median of {args.runs} launches x {args.reps} repetitions, interleaved"
          f"{'; ranks pinned one per CPU' if args.pin else ''}")
    def sleeps(impl, world, size):
        s = slept.get((impl, world, size))
        return statistics.mean(s) if s else float("nan")

    def median_of_calls(impl, world, size):
        s = median_call.get((impl, world, size))
        return statistics.median(s) if s else float("nan")

    for world in worlds:
        print()
        print(f"world {world}, one node: time per allreduce (us) and bandwidth (GB/s = bytes/time)")
        print("times are means per call (median over launches and repetitions); "
              "'median call' is the median single call")
        print("libddp: what DataParallel does by default (the gradient allocated in the "
              "node's shared memory, summed where it lies, the average written back); "
              "copied: a gradient in private memory copied into the segment (the default "
              "with shared_gradients off); flat: PyTorch DDP's default bucket in the segment "
              "(copy in, sum in place, copy out); resident: gradient_as_bucket_view")
        print("| size | libddp | libddp copied | libddp flat | libddp resident "
              "| ProcessGroupGloo (C++) | torch.distributed (Python) | libddp GB/s "
              "| memcpy GB/s | libddp / memcpy | copied / memcpy | flat / memcpy "
              "| resident / memcpy | libddp median call | libddp sleeps/call | vs Gloo C++ |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for size in sizes:
            ours, gloo = med("libddp", world, size), med("ProcessGroupGloo", world, size)
            res, flat = med("libddp-resident", world, size), med("libddp-flat", world, size)
            copied = med("libddp-copied", world, size)
            py, mem = med("torch.distributed", world, size), med("memcpy", world, size)
            print(f"| {human(size)} | {1e6 * ours:.1f} | {1e6 * copied:.1f} "
                  f"| {1e6 * flat:.1f} | {1e6 * res:.1f} "
                  f"| {1e6 * gloo:.1f} | {1e6 * py:.1f} | {size / ours / 1e9:.2f} "
                  f"| {size / mem / 1e9:.2f} | {mem / ours:.2f} | {mem / copied:.2f} "
                  f"| {mem / flat:.2f} "
                  f"| {mem / res:.2f} | {1e6 * median_of_calls('libddp', world, size):.1f} "
                  f"| {sleeps('libddp', world, size):.3f} | {gloo / ours:.1f}x |")
    if ("baseline libddp", worlds[0], sizes[0]) in samples:
        print()
        print(f"against --baseline {args.baseline} (same rotation; memcpy of each run "
              "beside it):")
        print("| world | size | libddp (us) | baseline libddp (us) | baseline / libddp "
              "| libddp / memcpy | baseline / its memcpy |")
        print("|---|---|---|---|---|---|---|")
        for world in worlds:
            for size in sizes:
                ours, base = med("libddp", world, size), med("baseline libddp", world, size)
                mem, base_mem = med("memcpy", world, size), med("baseline memcpy", world, size)
                print(f"| {world} | {human(size)} | {1e6 * ours:.1f} | {1e6 * base:.1f} "
                      f"| {base / ours:.2f}x | {mem / ours:.2f} | {base_mem / base:.2f} |")
    print()
    # The goals are about what users get: DataParallel's default (libddp);
    # the copied path (shared gradients off) and gradient_as_bucket_view's
    # (resident) beside it, for information.
    for impl, label in (("libddp", "DataParallel's default"),
                        ("libddp-copied", "shared_gradients off"),
                        ("libddp-resident", "gradient_as_bucket_view only")):
        if 2 in worlds and (400 << 10) in sizes:
            t = med(impl, 2, 400 << 10)
            print(f"goal ({label}): 400 KB at world 2 <= 50 us: {1e6 * t:.1f} us "
                  f"({'met' if t <= 50e-6 else 'NOT met'})")
        for world in worlds:
            for size in (s for s in sizes if s >= 64 << 20):
                ratio = med("memcpy", world, size) / med(impl, world, size)
                print(f"goal ({label}): {human(size)} at world {world} >= 0.5x memcpy "
                      f"bandwidth: {ratio:.2f}x ({'met' if ratio >= 0.5 else 'NOT met'})")
    print(f"raw results: {results}")


if __name__ == "__main__":
    main()
