"""torchrun command lines from PyTorch's docs, Kubeflow's PyTorchJob
(PET_* variables) and Slurm recipes, with `torchrun` replaced by `ddprun`
and nothing else changed, each running the unmodified env:// program
allreduce.py, and then (with --mnist) each line where it makes sense with
ddprun-mnist, a libddp program, which must train: every agent exits 0 and
rank 0's summary names the line's world size, steps and a test accuracy
above chance. The -m lines have no ddprun-mnist form (a module is Python's);
every other line runs the binary, named as the program (ddprun runs a
program that is not a .py file directly; torchrun would need --no-python,
which the --no-python line gives). Multi-node lines start two agents on
loopback. Lines run in parallel; prints "N of N command lines work" for
each program and the wall time.

Usage: torchrun_corpus_test.py --ddprun PATH [--mnist PATH --data-dir DIR]
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "allreduce.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# (name, flags per node (PORT, RANK, LOGDIR substituted), extra env per node,
#  nodes, world size, how the program is named: script | module | no-python)
CORPUS = [
    ("docs: single node, standalone", "--standalone --nproc-per-node 2", {}, 1, 2, "script"),
    ("docs: standalone, underscores, =", "--standalone --nnodes=1 --nproc_per_node=2", {}, 1, 2, "script"),
    ("docs: plain single node", "--nproc-per-node 2", {}, 1, 2, "script"),
    ("docs: plain, underscores", "--nnodes=1 --nproc_per_node=2", {}, 1, 2, "script"),
    ("docs: stacked single node, port 0",
     "--rdzv-backend c10d --rdzv-endpoint localhost:0 --nnodes 1 --nproc-per-node 2", {}, 1, 2, "script"),
    ("blog: c10d on localhost",
     "--nnodes=1 --nproc_per_node=2 --rdzv_id=100 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:PORT",
     {}, 1, 2, "script"),
    ("docs: -m module", "--standalone --nproc-per-node 2 -m", {}, 1, 2, "module"),
    ("docs: --no-python", "--standalone --nproc-per-node 2 --no-python", {}, 1, 2, "no-python"),
    ("docs: log flags", "--standalone --nproc-per-node 2 --log-dir LOGDIR --redirects 3 --tee 1", {}, 1, 2, "script"),
    ("docs: short log flags, filter", "--standalone --nproc_per_node 2 -r 1 -t 2 --local_ranks_filter 0",
     {}, 1, 2, "script"),
    ("docs: fault tolerant, one node",
     "--standalone --nproc-per-node 2 --max-restarts 3 --monitor-interval 1", {}, 1, 2, "script"),
    ("torchrun flags without meaning",
     "--standalone --nproc-per-node 2 --start-method spawn --role trainer --run-path "
     "--logs-specs x --signals-to-handle SIGTERM",
     {}, 1, 2, "script"),
    ("rdzv-conf keys", "--nproc-per-node 2 --rdzv-endpoint localhost:0 --rdzv-conf "
     "timeout=900,read_timeout=60,store_type=tcp,use_libuv=0,keep_alive_max_attempt=5",
     {}, 1, 2, "script"),
    ("Kubeflow single node, PET_* only", "",
     {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2"}, 1, 2, "script"),
    ("docs: agent-hosted multi-node, c10d",
     "--nnodes 2 --nproc-per-node 1 --rdzv-id job1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT",
     {}, 2, 2, "script"),
    ("Slurm: srun torchrun, c10d, underscores",
     "--nnodes 2 --nproc_per_node 2 --rdzv_id 4242 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:PORT",
     {}, 2, 4, "script"),
    ("docs: elastic MIN:MAX",
     "--nnodes 1:2 --nproc-per-node 1 --max-restarts 3 --rdzv-id elastic --rdzv-backend c10d "
     "--rdzv-endpoint 127.0.0.1:PORT",
     {}, 2, None, "script"),
    ("Slurm: static, --master-addr/--master-port",
     "--nnodes 2 --node-rank RANK --nproc-per-node 1 --master-addr 127.0.0.1 --master-port PORT",
     {}, 2, 2, "script"),
    ("static, underscores and =",
     "--nnodes=2 --node_rank=RANK --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=PORT",
     {}, 2, 4, "script"),
    ("Kubeflow PyTorchJob, PET_* only (static)", "",
     {"PET_NNODES": "2", "PET_NODE_RANK": "RANK", "PET_MASTER_ADDR": "127.0.0.1",
      "PET_MASTER_PORT": "PORT", "PET_NPROC_PER_NODE": "1"}, 2, 2, "script"),
    ("Kubeflow elastic, PET_* rendezvous", "",
     {"PET_NNODES": "2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "127.0.0.1:PORT",
      "PET_RDZV_ID": "kf", "PET_NPROC_PER_NODE": "1"}, 2, 2, "script"),
    ("static multi-node, the program as -m",
     "--nnodes 2 --node-rank RANK --nproc-per-node 1 --master-addr 127.0.0.1 --master-port PORT -m",
     {}, 2, 2, "module"),
]


# ddprun-mnist's training: a subset and one epoch, so that the whole corpus
# stays short on CI's 2 cores; enough steps that the accuracy must rise.
MNIST_ARGS = ["--epochs", "1", "--train-limit", "1024", "--test-limit", "500",
              "--batch-size", "16", "--lr", "0.05", "--save", ""]
# Above chance (0.1) by a margin: the model learned from the subset.
MNIST_MIN_ACCURACY = 0.5


# Failures that are not the command line's, each retried once (never
# twice), with the reason in the line's name.
TRANSIENT = [
    # Cases run in parallel, each picking free ports that it releases: one
    # may take a port another case was about to bind.
    ("Address already in use", "a port race between cases"),
    # The Gloo in Debian 13's torch 2.6 (libgloo0 2023-12) fails a pair
    # whose first connect fails, and reports it as "no error" (its Error is
    # passed by value and sliced); Gloo retries since gloo#413 (2025). It is
    # torch's own mesh forming, between the workers, after ddprun has
    # started them with the right environment: torchrun's workers run it too.
    ("Gloo connectFullMesh failed with", "Gloo's connect failed, in torch"),
]


def run_case(ddprun, case, mnist=None):
    name, ok, output = run_case_once(ddprun, case, mnist)
    for signature, reason in TRANSIENT:
        if not ok and signature in output:
            print("retrying %s once: %s\n%s\n" % (name, reason, output),
                  flush=True)
            name, ok, output = run_case_once(ddprun, case, mnist)
            name += " (retried after %s)" % reason
            break
    return name, ok, output


def program_argv(kind, out, mnist):
    """The program part of the command line: allreduce.py, or ddprun-mnist
    (mnist = (binary, data dir)) writing its summary into `out`."""
    if mnist is not None:
        binary, data_dir = mnist
        return [binary, "--data-dir", data_dir, "--summary-json",
                os.path.join(out, "summary.json")] + MNIST_ARGS
    if kind == "script":
        return [PROGRAM, out]
    if kind == "module":
        return ["allreduce", out]
    return ["/usr/bin/python3", PROGRAM, out]


def check_allreduce(out, world):
    results = sorted(f for f in os.listdir(out) if f.endswith(".result"))
    worlds = set()
    for f in results:
        with open(os.path.join(out, f)) as fh:
            worlds.add(int(fh.read().split()[0]))
    got = len(results)
    expected = world if world is not None else got
    return (got == expected and worlds == {expected} and
            results == sorted("rank_%d.result" % r for r in range(expected)))


def check_mnist(out, world, nodes):
    """Rank 0's summary: the world size of the line (any from 1 to `nodes`
    for an elastic line), steps taken, learned."""
    try:
        with open(os.path.join(out, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        return False, "no summary: %s" % e
    worlds = [world] if world is not None else list(range(1, nodes + 1))
    ok = (summary.get("world_size") in worlds and summary.get("steps", 0) > 0
          and summary.get("test_accuracy", 0) >= MNIST_MIN_ACCURACY)
    return ok, "summary: %s" % json.dumps(summary)


def run_case_once(ddprun, case, mnist=None):
    name, flags, env_extra, nodes, world, kind = case
    port = str(free_port())
    with tempfile.TemporaryDirectory() as out:
        procs = []
        for node in range(nodes):
            subst = lambda a: (a.replace("PORT", port).replace("RANK", str(node))
                               .replace("LOGDIR", os.path.join(out, "logs")))
            argv = [ddprun] + [subst(a) for a in flags.split()]
            argv += program_argv(kind, out, mnist)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}
            env["PYTHONPATH"] = HERE
            env["PYTHON_EXEC"] = "/usr/bin/python3"  # the Python with torch
            # Logs kept without --log-dir go to a temporary folder: ours.
            env["TMPDIR"] = out
            if mnist is not None:
                # Several cases share CI's 2 cores: one thread per worker.
                env["OMP_NUM_THREADS"] = "1"
            env.update({k: subst(v) for k, v in env_extra.items()})
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outputs, ok = [], True
        for node, p in enumerate(procs):
            try:
                text, _ = p.communicate(timeout=240)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
            # Each node's own tail: a failure on one node is often explained
            # by what the other printed.
            outputs.append("--- node %d ---\n%s" % (node, text[-2500:]))
            ok = ok and p.returncode == 0
        if mnist is not None:
            trained, summary = check_mnist(out, world, nodes)
            ok = ok and trained
            outputs.append(summary)
        else:
            ok = ok and check_allreduce(out, world)
        return name, ok, "\n".join(outputs)


def report(label, results, elapsed, jobs):
    failed = [(n, o) for n, ok, o in results if not ok]
    for n, ok, _ in results:
        print("%s: %s (%s)" % ("ok" if ok else "FAILED", n, label))
    for n, o in failed:
        print("FAIL: %s (%s)\n%s\n" % (n, label, o))
    print("%s: %d of %d command lines work (%.1f s, %d in parallel)" %
          (label, len(results) - len(failed), len(results), elapsed, jobs),
          flush=True)
    return not failed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--mnist", help="ddprun-mnist: run the corpus with it too")
    parser.add_argument("--data-dir", help="MNIST's IDX files, for --mnist")
    parser.add_argument("--jobs", type=int, default=4)
    args = parser.parse_args()
    if args.mnist and not args.data_dir:
        parser.error("--mnist needs --data-dir")
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda c: run_case(args.ddprun, c), CORPUS))
    ok = report("allreduce.py", results, time.monotonic() - start, args.jobs)
    if args.mnist:
        mnist = (args.mnist, args.data_dir)
        lines = [c for c in CORPUS if c[5] != "module"]
        print("ddprun-mnist: %d lines; not the %d -m lines (a module is "
              "Python's)" % (len(lines), len(CORPUS) - len(lines)))
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(
                lambda c: run_case(args.ddprun, c, mnist), lines))
        ok = report("ddprun-mnist", results, time.monotonic() - start,
                    args.jobs) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
