"""torchrun's static two-node line across two network namespaces joined by a
veth pair: `--nnodes 2 --node-rank R --master-addr A --master-port P`, one
agent in each namespace, no rendezvous service; the only way between them is
the veth. The job (ddprun-mnist) must train at world size 2, and traffic must
have crossed the pair. The namespaces are created here and deleted on any
exit (failure, exception, SIGTERM from ctest's timeout).

Usage: dropin_netns_test.py --ddprun PATH --mnist PATH --data-dir DIR
Needs root and iproute2; exits 77 (skipped) without them, unless CI=true.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

SUBNET = "10.254.0"
MASTER_PORT = "29500"  # a fresh namespace: nothing else listens in it
MNIST_ARGS = ["--epochs", "1", "--train-limit", "2048", "--test-limit", "500",
              "--batch-size", "16", "--lr", "0.05", "--save", ""]


def ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), check=check,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


class Namespaces:
    """Two namespaces, NAME-0 (SUBNET.1) and NAME-1 (SUBNET.2), on a veth
    pair. Deletes them, and every process left in them, on close()."""

    def __init__(self, name):
        self.names = ["%s-0" % name, "%s-1" % name]
        self.created = []

    def up(self):
        for ns in self.names:
            ip("netns", "add", ns)
            self.created.append(ns)
        ip("link", "add", "veth0", "netns", self.names[0], "type", "veth",
           "peer", "name", "veth1", "netns", self.names[1])
        for i, ns in enumerate(self.names):
            ip("-n", ns, "addr", "add", "%s.%d/24" % (SUBNET, i + 1),
               "dev", "veth%d" % i)
            ip("-n", ns, "link", "set", "veth%d" % i, "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def rx_bytes(self, i):
        out = ip("-n", self.names[i], "-s", "-j", "link", "show",
                 "veth%d" % i).stdout
        return json.loads(out)[0]["stats64"]["rx"]["bytes"]

    def close(self):
        for ns in reversed(self.created):
            pids = ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            ip("netns", "del", ns, check=False)
        self.created = []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--mnist", required=True)
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI") == "true":
            sys.exit("FAIL: network namespaces need root and iproute2 "
                     "(CI=true: no skips)")
        print("SKIP: network namespaces need root and iproute2")
        sys.exit(77)

    # ctest's timeout sends SIGTERM: leave through `finally`.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _: sys.exit(128 + s))
    namespaces = Namespaces("ddpst%d" % os.getpid())
    work = tempfile.mkdtemp()
    agents = []
    try:
        namespaces.up()
        summary = os.path.join(work, "summary.json")
        for rank, ns in enumerate(namespaces.names):
            argv = ["ip", "netns", "exec", ns, args.ddprun, "--nnodes", "2",
                    "--node-rank", str(rank), "--nproc-per-node", "1",
                    "--master-addr", "%s.1" % SUBNET,
                    "--master-port", MASTER_PORT,
                    args.mnist, "--data-dir", args.data_dir,
                    "--summary-json", summary] + MNIST_ARGS
            env = dict(os.environ, OMP_NUM_THREADS="1")
            log = open(os.path.join(work, "node%d.log" % rank), "w")
            agents.append((subprocess.Popen(argv, env=env, stdout=log,
                                            stderr=subprocess.STDOUT), log))
        codes = []
        for p, log in agents:
            try:
                codes.append(p.wait(timeout=240))
            except subprocess.TimeoutExpired:
                codes.append("timeout")
            log.close()
        logs = ""
        for rank in range(2):
            with open(os.path.join(work, "node%d.log" % rank)) as f:
                logs += "--- node %d\n%s" % (rank, f.read()[-3000:])
        if codes != [0, 0]:
            sys.exit("FAIL: the agents exited %s\n%s" % (codes, logs))
        with open(summary) as f:
            figures = json.load(f)
        if figures["world_size"] != 2 or figures["steps"] <= 0 or \
                figures["test_accuracy"] < 0.5:
            sys.exit("FAIL: it did not train at world 2: %s" % figures)
        # The node-1 agent used the static rendezvous of node 0 and its
        # worker the master's store, through the veth only.
        if "%s.1:%s" % (SUBNET, MASTER_PORT) not in logs:
            sys.exit("FAIL: node 1 did not name the master endpoint\n" + logs)
        crossed = [namespaces.rx_bytes(i) for i in range(2)]
        if min(crossed) < 100000:
            sys.exit("FAIL: little traffic crossed the veth pair: %s bytes"
                     % crossed)
        print("PASS: static 2-node job across namespaces %s: world %d, "
              "%d steps, accuracy %.3f, veth rx %s bytes" %
              (namespaces.names, figures["world_size"], figures["steps"],
               figures["test_accuracy"], crossed))
    finally:
        for p, log in agents:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
        namespaces.close()
        shutil.rmtree(work, ignore_errors=True)
        left = [n for n in namespaces.names
                if n in ip("netns", "list", check=False).stdout]
        if left:
            print("FAIL: namespaces left behind: %s" % left)
            sys.exit(1)


if __name__ == "__main__":
    main()
