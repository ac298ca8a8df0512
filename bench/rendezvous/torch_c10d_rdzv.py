#!/usr/bin/python3
"""torchrun's c10d rendezvous at N simulated nodes: the baseline for ddprun.

Runs PyTorch's DynamicRendezvousHandler with the c10d backend over one
TCPStore, exactly as `torchrun --rdzv-backend c10d` does, with N nodes
spread over processes (threads inside each). Prints, per N, the time from
the last node calling next_rendezvous() to every node holding its rank, and
from the first call. A count that does not finish within --timeout is
reported as such. Needs Debian's python3-torch: run with /usr/bin/python3.

With --ddprun-bench PATH it first runs ddprun's benchmark (ddprun-rdzv-bench)
on the same counts and prints both side by side.

Usage: torch_c10d_rdzv.py [--nodes 100,1000,10000] [--timeout 120]
                          [--ddprun-bench build/bench/rendezvous/ddprun-rdzv-bench]
"""

import argparse
import datetime
import json
import multiprocessing as mp
import os
import subprocess
import resource
import sys
import threading
import time


def node_process(port, run_id, nodes, my_nodes, timeout_s, barrier, out):
    # Imported here so that the parent starts fast and forks cleanly.
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend,
    )
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        RendezvousTimeout,
    )

    timeout = datetime.timedelta(seconds=timeout_s)
    handlers = []
    for _ in range(my_nodes):
        store = TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        backend = C10dRendezvousBackend(store, run_id)
        handlers.append(
            DynamicRendezvousHandler.from_backend(
                run_id,
                store,
                backend,
                min_nodes=nodes,
                max_nodes=nodes,
                timeout=RendezvousTimeout(join=timeout),
            )
        )
    results = []
    lock = threading.Lock()

    def join(handler):
        start = time.time()
        try:
            _, rank, world = handler.next_rendezvous()
            end = time.time()
            with lock:
                results.append((start, end, rank, world, None))
        except Exception as e:  # reported, not raised: the parent decides
            with lock:
                results.append((start, time.time(), -1, -1, repr(e)[:200]))

    threads = [threading.Thread(target=join, args=(h,), daemon=True)
               for h in handlers]
    barrier.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 5)
    out.put(results)
    out.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    # Flush the queue's feeder thread, then end at once: the handlers'
    # heartbeat timers would otherwise keep the process alive.
    out.close()
    out.join_thread()
    sys.stdout.flush()
    os._exit(0)


def measure(nodes, timeout_s, processes):
    from torch.distributed import TCPStore

    master = TCPStore("127.0.0.1", 0, is_master=True,
                      timeout=datetime.timedelta(seconds=timeout_s),
                      wait_for_workers=False)
    port = master.port
    run_id = f"bench-{nodes}"
    processes = max(1, min(processes, nodes))
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(processes + 1)
    out = ctx.Queue()
    procs = []
    for p in range(processes):
        share = nodes // processes + (1 if p < nodes % processes else 0)
        proc = ctx.Process(target=node_process,
                           args=(port, run_id, nodes, share, timeout_s,
                                 barrier, out))
        proc.start()
        procs.append(proc)
    barrier.wait(timeout=600)
    results = []
    peak_kib = 0
    deadline = time.time() + timeout_s + 30
    for _ in procs:
        remaining = max(1, deadline - time.time())
        try:
            results.extend(out.get(timeout=remaining))
            peak_kib = max(peak_kib, out.get(timeout=30))
        except Exception:
            break
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    errors = [r[4] for r in results if r[4]]
    ok = [r for r in results if not r[4]]
    row = {"nodes": nodes, "completed": len(ok), "errors": len(errors)}
    if len(ok) == nodes:
        ranks = sorted(r[2] for r in ok)
        row["ranks_ok"] = ranks == list(range(nodes))
        last_call = max(r[0] for r in ok)
        first_call = min(r[0] for r in ok)
        done = max(r[1] for r in ok)
        row["last_join_to_all_ms"] = round((done - last_call) * 1000, 1)
        row["first_to_all_ms"] = round((done - first_call) * 1000, 1)
    elif errors:
        row["first_error"] = errors[0]
    row["agent_process_peak_MiB"] = round(peak_kib / 1024, 1)
    return row


def run_ddprun_bench(binary, nodes):
    """Rows of ddprun-rdzv-bench by node count: the columns it prints."""
    out = subprocess.run([binary, "--nodes", nodes], capture_output=True,
                         text=True, timeout=1800).stdout
    print(out, end="", flush=True)
    rows = {}
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0].isdigit():
            rows[int(fields[0])] = fields
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="100,1000,10000")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds one node count may take")
    parser.add_argument("--processes", type=int, default=8,
                        help="agent processes the nodes are spread over")
    parser.add_argument("--ddprun-bench", default="",
                        help="ddprun-rdzv-bench binary: run it too and "
                             "print both side by side")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    counts = [int(x) for x in args.nodes.split(",") if x]
    ours = run_ddprun_bench(args.ddprun_bench, args.nodes) \
        if args.ddprun_bench else {}
    print("torchrun c10d rendezvous (DynamicRendezvousHandler + TCPStore), "
          f"nodes spread over {args.processes} processes", flush=True)
    print(f"{'nodes':>8} {'last_join->all':>15} {'first->all':>12} "
          f"{'completed':>10}", flush=True)
    theirs = {}
    failed_at = None
    for n in counts:
        if failed_at is not None:
            theirs[n] = f"skipped ({failed_at} nodes did not finish)"
            print(f"{n:>8} {theirs[n]}", flush=True)
            continue
        row = measure(n, args.timeout, args.processes)
        if args.json:
            print(json.dumps(row), flush=True)
        if "last_join_to_all_ms" in row:
            theirs[n] = f"{row['last_join_to_all_ms']:.1f}ms"
            if not args.json:
                print(f"{n:>8} {row['last_join_to_all_ms']:>13.1f}ms "
                      f"{row['first_to_all_ms']:>10.1f}ms "
                      f"{row['completed']:>10}", flush=True)
        else:
            failed_at = n
            theirs[n] = f"did not finish in {int(args.timeout)} s"
            if not args.json:
                print(f"{n:>8} {theirs[n]:>28} {row['completed']:>10}  "
                      f"{row.get('first_error', '')}", flush=True)
    if ours:
        print()
        print("time from the last join to every node holding its rank")
        print(f"{'nodes':>8} {'ddprun':>12} {'torchrun c10d':>36}")
        for n in counts:
            mine = ours[n][1] if n in ours else "-"
            print(f"{n:>8} {mine:>12} {theirs.get(n, '-'):>36}")


if __name__ == "__main__":
    main()
