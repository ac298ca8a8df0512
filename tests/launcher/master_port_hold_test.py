"""The MASTER_PORT a node offers is held from its Join until its workers
start, and free for them then: the agent of node rank 0 (torchrun's static
form, waiting for node 1) holds a bound, non-listening socket on a port that
a plain bind cannot take; once node 1 joins, global rank 0 binds that very
MASTER_PORT without SO_REUSEADDR.

Usage: master_port_hold_test.py --ddprun PATH
"""
import argparse
import errno
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "bind_master_port.py")
HOLDING = re.compile(r"holding port (\d+) on ")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    args = parser.parse_args()
    out = tempfile.mkdtemp()
    port = free_port()
    agents, logs = [], []
    try:
        for node in range(2):
            argv = [args.ddprun, "--nnodes", "2", "--node-rank", str(node),
                    "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "--log-level", "debug",
                    WORKER, out]
            env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3")
            logs.append(os.path.join(out, "agent%d.log" % node))
            with open(logs[-1], "w") as log:
                agents.append(subprocess.Popen(argv, env=env, stdout=log,
                                               stderr=subprocess.STDOUT))
            if node == 1:
                break
            # Node 0 waits in its Join for node 1, holding its offer.
            deadline = time.monotonic() + 60
            offer = None
            while offer is None and time.monotonic() < deadline:
                if agents[0].poll() is not None:
                    break
                with open(logs[0]) as f:
                    found = HOLDING.search(f.read())
                offer = int(found.group(1)) if found else None
                time.sleep(0.05)
            if offer is None:
                sys.exit("FAIL: node 0 says it holds no port:\n" +
                         open(logs[0]).read())
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", offer))
                    sys.exit("FAIL: port %d is not held: a plain bind took it"
                             % offer)
                except OSError as e:
                    if e.errno != errno.EADDRINUSE:
                        raise
            if agents[0].poll() is not None:
                sys.exit("FAIL: node 0 ended before node 1 started:\n" +
                         open(logs[0]).read())
        for a in agents:
            a.wait(timeout=120)
        outputs = [open(log).read()[-3000:] for log in logs]
        if any(a.returncode != 0 for a in agents):
            sys.exit("FAIL: agents exited %s:\n%s" %
                     ([a.returncode for a in agents], "\n".join(outputs)))
        with open(os.path.join(out, "rank_0")) as f:
            result = f.read().split()
        if result != ["bound", str(offer)]:
            sys.exit("FAIL: rank 0 of node 0 got %s for the offered port %d\n%s"
                     % (result, offer, "\n".join(outputs)))
        print("PASS: node 0 held port %d during its Join; rank 0 bound it "
              "without SO_REUSEADDR" % offer)
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
        subprocess.run(["rm", "-rf", out])


if __name__ == "__main__":
    main()
