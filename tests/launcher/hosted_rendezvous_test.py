"""torchrun's agent-hosted rendezvous (`--rdzv-backend c10d --rdzv-endpoint
0.0.0.0:PORT`, no token), tried as an outsider would: the agent warns once
at warning level with the fix, really listens on every interface and says
so, answers no Status, refuses another run id, and still lets the job's own
second node join (torchrun's c10d store is as open, no more).

Usage: hosted_rendezvous_test.py --ddprun PATH
"""
import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from ports import free_port  # noqa: E402
from waits import wait_until  # noqa: E402






def other_addresses():
    """This host's non-loopback IPv4 addresses."""
    out = subprocess.run(["hostname", "-I"], stdout=subprocess.PIPE,
                         text=True).stdout.split()
    return [a for a in out if re.fullmatch(r"[0-9.]+", a)
            and not a.startswith("127.")]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    args = parser.parse_args()
    env = dict(os.environ)
    for name in ("DDPRUN_TOKEN", "DDPRUN_TOKEN_FILE", "PET_TOKEN_FILE"):
        env.pop(name, None)
    failures = []
    with tempfile.TemporaryDirectory() as work:
        log_path = os.path.join(work, "host.log")
        for attempt in range(5):
            port = free_port("")
            log = open(log_path, "w")
            host = subprocess.Popen(
                [args.ddprun, "--nnodes", "2", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", "0.0.0.0:%d" % port, "--rdzv-id",
                 "hosted", "--no-python", "true"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
            try:
                wait_until(lambda: "serving the rendezvous" in open(
                    log_path).read() or host.poll() is not None,
                    "the agent to serve", 30)
            except AssertionError:
                host.kill()
                raise
            if host.poll() is None:
                break
            host.wait()
        else:
            raise AssertionError("no port could be served: " +
                                 open(log_path).read())
        try:
            text = open(log_path).read()
            warnings = [line for line in text.splitlines()
                        if "[warning]" in line and "takes no token" in line]
            if len(warnings) != 1 or "--token-file" not in warnings[0]:
                failures.append("want one warning naming --token-file: %r"
                                % text)
            if ("serving the rendezvous on 0.0.0.0:%d (all interfaces)" %
                    port) not in text:
                failures.append("the log does not say it listens on every "
                                "interface: %r" % text)
            # It really listens beyond loopback.
            for address in other_addresses():
                try:
                    socket.create_connection((address, port), 5).close()
                except OSError as e:
                    failures.append("not listening on %s:%d: %s" %
                                    (address, port, e))
            endpoint = "127.0.0.1:%d" % port
            status = subprocess.run(
                [args.ddprun, "status", "--rdzv-endpoint", endpoint,
                 "--rdzv-id", "hosted"], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, env=env, timeout=30)
            if status.returncode == 0 or "--token-file" not in status.stdout:
                failures.append("Status answered an unauthenticated caller: "
                                "rc %d %r" % (status.returncode,
                                              status.stdout))
            other = subprocess.run(
                [args.ddprun, "--nnodes", "2", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", endpoint, "--rdzv-id", "other",
                 "--no-python", "true"], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, env=env, timeout=60)
            if (other.returncode == 0 or
                    "serves no other run id" not in other.stdout):
                failures.append("another run id was admitted: rc %d %r" %
                                (other.returncode, other.stdout))
            # The job's own second node joins, as with torchrun.
            second = subprocess.run(
                [args.ddprun, "--nnodes", "2", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", endpoint, "--rdzv-id", "hosted",
                 "--no-python", "true"], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, env=env, timeout=60)
            if second.returncode != 0:
                failures.append("the job's second node failed: rc %d %r" %
                                (second.returncode, second.stdout))
            # Finding the port taken is no error: no raw gRPC bind failure.
            for p in (other, second):
                if "chttp2_server" in p.stdout or "Address already" in p.stdout:
                    failures.append("raw gRPC errors where the port was "
                                    "served: %r" % p.stdout)
            if host.wait(timeout=60) != 0:
                failures.append("the hosting agent failed: %r" %
                                open(log_path).read())
        finally:
            if host.poll() is None:
                host.kill()
                host.wait()
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("OK: the hosted rendezvous warns, listens on every interface, "
          "answers only its own job")


if __name__ == "__main__":
    main()
