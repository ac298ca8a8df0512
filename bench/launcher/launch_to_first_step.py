#!/usr/bin/env python3
"""Launch -> first completed training step without a rendezvous service:
ddprun-mnist at world 2 under `ddprun --standalone --nproc-per-node 2` (the
baseline) against torchrun's agent-hosted form, two agents with
`--nnodes 2 --nproc-per-node 1` and the same `--rdzv-endpoint`, where the
first to bind it serves the rendezvous (and, with --modes ...,static,
`--master-addr/--master-port` with node rank 0 serving). The figure is rank
0's first step (`first_step_unix_seconds` of its --summary-json) minus the
moment the first agent was started. Modes run interleaved; medians, and the
ratio of each mode's median to the baseline's.

  bench/launcher/launch_to_first_step.py [--runs 7] [--modes standalone,agent-hosted]

Needs a build with ddprun-mnist (DDPRUN_BUILD_DIR, default build/) and the
MNIST files in data/mnist. Workers get OMP_NUM_THREADS=1 in every mode.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time

from proc_util import kill_group

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_flags(mode, node, port):
    if mode == "standalone":
        return ["--standalone", "--nproc-per-node", "2"]
    if mode == "agent-hosted":
        return ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend",
                "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
                "bench"]
    if mode == "static":
        return ["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
                "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    raise ValueError(f"unknown mode '{mode}'; use standalone, agent-hosted "
                     "or static")


def one_run(build, mode):
    nodes = 1 if mode == "standalone" else 2
    port = free_port()
    with tempfile.TemporaryDirectory() as out:
        summary = os.path.join(out, "summary.json")
        program = [os.path.join(build, "mnist", "ddprun-mnist"), "--epochs",
                   "1", "--max-steps", "1", "--train-limit", "2048",
                   "--test-limit", "100", "--data-dir",
                   os.path.join(ROOT, "data", "mnist"), "--summary-json",
                   summary, "--save", ""]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs, logs = [], []
        started = time.time()
        for node in range(nodes):
            log = open(os.path.join(out, f"agent{node}.log"), "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [os.path.join(build, "launcher", "ddprun")] +
                agent_flags(mode, node, port) + program, env=env,
                stdout=log, stderr=subprocess.STDOUT,
                # A process group of its own (for kill_group), but the
                # bench's session: with sched_autogroup a session per agent
                # would give two agents twice one agent's CPU share under
                # load.
                preexec_fn=os.setpgrp))
        try:
            for p in procs:
                p.wait(timeout=300)
            for log in logs:
                log.close()
            if any(p.returncode != 0 for p in procs):
                raise RuntimeError(f"{mode}: an agent failed:\n" + "\n".join(
                    open(os.path.join(out, f"agent{n}.log")).read()[-2000:]
                    for n in range(nodes)))
            with open(summary) as f:
                figures = json.load(f)
            if figures["world_size"] != 2:
                raise RuntimeError(f"{mode}: world {figures['world_size']}")
            return figures["first_step_unix_seconds"] - started
        finally:
            for p in procs:
                kill_group(p)
            for log in logs:
                log.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--modes", default="standalone,agent-hosted")
    args = parser.parse_args()
    build = os.environ.get("DDPRUN_BUILD_DIR", os.path.join(ROOT, "build"))
    modes = args.modes.split(",")
    for mode in modes:
        agent_flags(mode, 0, 0)  # a mistyped mode fails before any run
    results = {m: [] for m in modes}
    for i in range(args.runs):
        for mode in modes:  # interleaved: every mode sees the same load
            seconds = one_run(build, mode)
            results[mode].append(seconds)
            print(f"run {i + 1}/{args.runs} {mode:12s}: launch -> first step "
                  f"{seconds:.3f} s", flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    base = statistics.median(results[modes[0]])
    for mode in modes:
        times = results[mode]
        median = statistics.median(times)
        print(f"{mode:12s} launch -> first training step (ddprun-mnist, world "
              f"2): median {median:.3f} s (min {min(times):.3f}, max "
              f"{max(times):.3f}), {median / base:.2f}x {modes[0]}, "
              f"{len(times)} runs, load {load}")


if __name__ == "__main__":
    main()
