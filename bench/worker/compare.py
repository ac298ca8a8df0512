"""ddprun + ddprun-mnist against torchrun + Python DDP (mnist_ddp.py), the
same job on this machine: full MNIST, 1 epoch, Gloo, batch 32 per rank,
world sizes 1, 2, 4. Runs are interleaved (ddprun, torchrun, ddprun, ...)
so that load from elsewhere hits both alike; figures are medians.

Per run: samples/s (training only, from the worker's summary), launch to
first step (from starting the command to the end of rank 0's first step),
wall time of the whole command (one full epoch incl. start-up and test),
test accuracy. Also the cost of DDP itself: ddprun's samples/s at 2 ranks
against 1, and the time per step spent in gradient allreduce.

  /usr/bin/python3 bench/worker/compare.py [--runs 3] [--worlds 1,2,4]
      [--baseline OTHER_BUILD_DIR] [--ddprun-only]
  (bench/worker/run.sh builds what is needed and calls this)

--independent (with world 2): also runs two world-1 jobs at once (each the
whole of world 1's job, no gradient exchange), their samples/s added: what
two ranks can train on this machine with cores, memory bandwidth and caches
shared and no synchronisation, the ceiling of DDP's world-2 scaling here.

--world1-all-cores: also world 1 with OMP_NUM_THREADS set to every core
(ddprun sets none at world 1, so it trains at LibTorch's default, which on
some VMs is one thread), interleaved, against world 1 and world 2.

--baseline: also runs OTHER_BUILD_DIR's ddprun-mnist (e.g. a build of main)
in the same rotation, under OTHER_BUILD_DIR's own ddprun where it has one
(so that agent-side changes count too; else this build's), and prints its
cost of DDP beside this build's. --ddprun-only: no torchrun runs (the DDP cost only).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def runs_at_once(commands, summaries, env, timeout):
    """Runs `commands` at once; their summaries, each with the command's
    wall time and its launch-to-first-step time added."""
    start = time.time()
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in commands]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    wall = time.time() - start
    results = []
    for proc, out, command, summary in zip(procs, outs, commands, summaries):
        if proc.returncode != 0:
            sys.exit(f"failed ({proc.returncode}): {' '.join(command)}\n{out[-3000:]}")
        with open(summary) as f:
            s = json.load(f)
        s["command_wall_seconds"] = wall
        s["launch_to_first_step_seconds"] = s["first_step_unix_seconds"] - start
        results.append(s)
    return results


def one_run(command, summary, env, timeout):
    return runs_at_once([command], [summary], env, timeout)[0]


def built_programs():
    """This build's ddprun and ddprun-mnist (DDPRUN_BUILD_DIR, default
    build/); exits naming the one that is missing."""
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    ddprun = os.path.join(build, "launcher", "ddprun")
    mnist = os.path.join(build, "mnist", "ddprun-mnist")
    for path in (ddprun, mnist):
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} is not built; run bench/worker/run.sh or set DDPRUN_BUILD_DIR")
    return ddprun, mnist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data", "mnist"))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--baseline", default="",
                        help="another build dir whose ddprun-mnist runs interleaved")
    parser.add_argument("--ddprun-only", action="store_true",
                        help="skip torchrun (Python DDP) runs")
    parser.add_argument("--independent", action="store_true",
                        help="with world 2: two world-1 jobs at once, the ceiling")
    parser.add_argument("--world1-all-cores", action="store_true",
                        help="also world 1 with OMP_NUM_THREADS=<cores> (ddprun sets "
                             "none at world 1: LibTorch's default, which may be fewer)")
    args = parser.parse_args()
    ddprun, mnist = built_programs()
    worlds = [int(w) for w in args.worlds.split(",")]
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # both launchers set 1 per worker
    out = tempfile.mkdtemp(prefix="bench-worker-")
    common = ["--epochs", str(args.epochs), "--data-dir", args.data_dir]

    baseline_mnist = os.path.join(args.baseline, "mnist", "ddprun-mnist")
    if args.baseline and not os.access(baseline_mnist, os.X_OK):
        sys.exit(f"--baseline: {baseline_mnist} is not built")
    baseline_ddprun = os.path.join(args.baseline, "launcher", "ddprun")
    if not (args.baseline and os.access(baseline_ddprun, os.X_OK)):
        baseline_ddprun = ddprun

    def commands(world, summary):
        return {
            "ddprun": [ddprun, "--standalone", "--nproc-per-node", str(world), mnist,
                       *common, "--save", "", "--no-progress", "--summary-json", summary],
            "baseline": [baseline_ddprun, "--standalone", "--nproc-per-node", str(world),
                         baseline_mnist, *common, "--save", "", "--no-progress",
                         "--summary-json", summary],
            "torchrun": [args.python, "-m", "torch.distributed.run", "--standalone",
                         "--nproc_per_node", str(world),
                         # Debian's torchrun 1.13 crashes under Python 3.11
                         # without explicit redirects.
                         "--redirects", "1", "--tee", "1",
                         os.path.join(ROOT, "bench", "worker", "mnist_ddp.py"),
                         *common, "--summary-json", summary],
            # The same Python DDP loop with ddprun-mnist's batching
            # (index_select, no DataLoader).
            "torchrun-indexed": [args.python, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc_per_node", str(world),
                                 "--redirects", "1", "--tee", "1",
                                 os.path.join(ROOT, "bench", "worker", "mnist_ddp.py"),
                                 *common, "--batching", "index-select",
                                 "--summary-json", summary],
        }

    names = ["ddprun"] + ([] if args.ddprun_only else ["torchrun", "torchrun-indexed"])
    if args.baseline:
        names.append("baseline")
    independent = args.independent and 2 in worlds
    results = {(name, w): [] for w in worlds for name in names}
    results[("independent", 2)] = []
    all_cores = args.world1_all_cores and 1 in worlds
    results[("ddprun-all-cores", 1)] = []
    env_all_cores = dict(env, OMP_NUM_THREADS=str(os.cpu_count()))
    for i in range(args.runs):
        for world in worlds:
            order = names[i % len(names):] + names[:i % len(names)]  # rotates per run
            if independent and world == 2:
                order.insert(i % (len(order) + 1), "independent")
            if all_cores and world == 1:
                order.insert(i % (len(order) + 1), "ddprun-all-cores")
            for name in order:
                summary = os.path.join(out, f"{name}-{world}-{i}.json")
                if name == "independent":
                    # Each job holds the whole data set, as a rank of world
                    # 2 does, and both do the same work, so that they end
                    # together; samples/s add up.
                    parts = [os.path.join(out, f"{name}-{world}-{i}-{j}.json")
                             for j in range(2)]
                    pair = runs_at_once([commands(1, p)["ddprun"] for p in parts],
                                        parts, env, args.timeout)
                    s = dict(pair[0])
                    s["samples_per_sec"] = sum(p["samples_per_sec"] for p in pair)
                    s["pair_min"] = min(p["samples_per_sec"] for p in pair)
                    s["pair_max"] = max(p["samples_per_sec"] for p in pair)
                    s["test_accuracy"] = min(p["test_accuracy"] for p in pair)
                elif name == "ddprun-all-cores":
                    s = one_run(commands(world, summary)["ddprun"], summary,
                                env_all_cores, args.timeout)
                else:
                    s = one_run(commands(world, summary)[name], summary, env, args.timeout)
                results[(name, world)].append(s)
                print(f"run {i + 1}/{args.runs} world {world} {name:16s}: "
                      f"{s['samples_per_sec']:8.0f} samples/s, first step "
                      f"{s['launch_to_first_step_seconds']:.2f} s, wall "
                      f"{s['command_wall_seconds']:.2f} s, accuracy "
                      f"{100 * s['test_accuracy']:.2f}%, intra-op threads "
                      f"{s.get('intra_op_threads', '?')}", flush=True)

    def med(name, world, key):
        return statistics.median(r[key] for r in results[(name, world)])

    print()
    print(f"MNIST MLP, {args.epochs} epoch(s), Gloo, batch 32/rank, {os.cpu_count()} cores, "
          f"median of {args.runs} interleaved runs")
    if not args.ddprun_only:
        print("| world | samples/s ddprun | samples/s torchrun | ratio | launch->1st step ddprun "
              "| torchrun | epoch wall ddprun | torchrun | accuracy ddprun | torchrun |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for w in worlds:
            d, t = med("ddprun", w, "samples_per_sec"), med("torchrun", w, "samples_per_sec")
            print(f"| {w} | {d:.0f} | {t:.0f} | {d / t:.2f}x "
                  f"| {med('ddprun', w, 'launch_to_first_step_seconds'):.2f} s "
                  f"| {med('torchrun', w, 'launch_to_first_step_seconds'):.2f} s "
                  f"| {med('ddprun', w, 'command_wall_seconds'):.2f} s "
                  f"| {med('torchrun', w, 'command_wall_seconds'):.2f} s "
                  f"| {100 * med('ddprun', w, 'test_accuracy'):.2f}% "
                  f"| {100 * med('torchrun', w, 'test_accuracy'):.2f}% |")
        print()
        print("| world | samples/s ddprun | Python DDP, index_select batches | ratio "
              "| Python DDP, DataLoader (seed) | ratio |")
        print("|---|---|---|---|---|---|")
        for w in worlds:
            d = med("ddprun", w, "samples_per_sec")
            x = med("torchrun-indexed", w, "samples_per_sec")
            t = med("torchrun", w, "samples_per_sec")
            print(f"| {w} | {d:.0f} | {x:.0f} | {d / x:.2f}x | {t:.0f} | {d / t:.2f}x |")
    if 1 in worlds:
        # Scaling of ddprun-mnist: world W's samples/s over world 1's, the
        # median of the ratios within each run (neighbouring launches, so
        # that load from elsewhere hits both alike) and the ratio of medians.
        for name in ["ddprun"] + (["baseline"] if args.baseline else []):
            for w in (w for w in worlds if w > 1):
                paired = statistics.median(
                    a["samples_per_sec"] / b["samples_per_sec"]
                    for a, b in zip(results[(name, w)], results[(name, 1)]))
                one, many = med(name, 1, "samples_per_sec"), med(name, w, "samples_per_sec")
                label = "ddprun" if name == "ddprun" else f"ddprun, --baseline {args.baseline}"
                print(f"cost of DDP ({label}): {w} ranks give {paired:.2f}x the samples/s "
                      f"of 1 (median of per-run ratios; {many / one:.2f}x of medians); "
                      f"gradient allreduce "
                      f"{1000 * med(name, w, 'allreduce_seconds_per_step'):.3f} ms per step")
        if 2 in worlds:
            # Where world 2 loses against world 1, per step of one rank
            # (32 samples): the step's time at each world, and how much of
            # world 2's is the gradient allreduce (including the wait for
            # the slower rank); the rest of the difference is the two ranks
            # slowing each other down (memory bandwidth, the agent and the
            # scheduler on 2 cores).
            one = 1e6 * 32 / med("ddprun", 1, "samples_per_sec")
            two = 1e6 * 32 * 2 / med("ddprun", 2, "samples_per_sec")
            sync = 1e6 * med("ddprun", 2, "allreduce_seconds_per_step")
            print(f"per step and rank: world 1 {one:.0f} us, world 2 {two:.0f} us, of which "
                  f"{sync:.0f} us in FinishGradientSync; the other {two - one - sync:.0f} us "
                  f"are the ranks slowing each other down")
            paired = statistics.median(
                a["samples_per_sec"] / b["samples_per_sec"]
                for a, b in zip(results[("ddprun", 2)], results[("ddprun", 1)]))
            print(f"goal: world 2 >= 1.6x the samples/s of world 1: {paired:.2f}x "
                  f"({'met' if paired >= 1.6 else 'NOT met'}; both at ddprun's defaults: "
                  f"world 1 LibTorch's own thread count, world 2 one thread per rank)")
            if all_cores:
                against = statistics.median(
                    a["samples_per_sec"] / b["samples_per_sec"]
                    for a, b in zip(results[("ddprun", 2)], results[("ddprun-all-cores", 1)]))
                gain = statistics.median(
                    a["samples_per_sec"] / b["samples_per_sec"]
                    for a, b in zip(results[("ddprun-all-cores", 1)], results[("ddprun", 1)]))
                print(f"world 2 against world 1 with OMP_NUM_THREADS={os.cpu_count()}: "
                      f"{against:.2f}x; world 1 with every core against its default: "
                      f"{gain:.2f}x (medians of per-run ratios)")
            if independent:
                # The ceiling: two world-1 jobs at once, no gradient
                # exchange, paired with the same run's world 1.
                ceiling = statistics.median(
                    a["samples_per_sec"] / b["samples_per_sec"]
                    for a, b in zip(results[("independent", 2)], results[("ddprun", 1)]))
                print(f"ceiling: two independent world-1 jobs at once give {ceiling:.2f}x "
                      f"the samples/s of one (median of per-run ratios); DDP at world 2 "
                      f"reaches {paired / ceiling:.0%} of it; world 1 alone ranged "
                      f"{min(r['samples_per_sec'] for r in results[('ddprun', 1)]):.0f}-"
                      f"{max(r['samples_per_sec'] for r in results[('ddprun', 1)]):.0f} "
                      f"samples/s, each independent job "
                      f"{min(r['pair_min'] for r in results[('independent', 2)]):.0f}-"
                      f"{max(r['pair_max'] for r in results[('independent', 2)]):.0f}")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({f"{k[0]}-{k[1]}": v for k, v in results.items()}, f)
    print(f"raw summaries: {out}")


if __name__ == "__main__":
    main()
