"""The agent-hosted rendezvous (torchrun's c10d is_host form) over TLS, with
real certificates made here and real processes: the hosting agent serves
TLS with --host-tls-cert-file/--host-tls-key-file (what ddprun-rendezvous
takes as --tls-cert-file/--tls-key-file); a second agent with only
--tls-ca-file joins it, and both nodes' workers (ddprun-mnist, whose store
client carries the NCCL-ID/Gloo exchange) train through it. A plaintext
client is refused; the token and status rules are those of the plaintext
hosted rendezvous: no Status without the token, no other run id. The
static form's node rank 0 serves TLS with the same flags.

Mutual TLS (--host-tls-client-ca-file, what ddprun-rendezvous takes as
--tls-client-ca-file): two agents with client certificates train through it
(their workers' store clients present the certificate too); `ddprun status`
and an agent with the CA but no client certificate, or with one signed by
another CA, are refused, while `ddprun status` with the right certificate is
answered. It runs on loopback without a token, where the hosted rendezvous
answers Status to anyone: the client certificate is the only thing that
tells the callers apart. On 0.0.0.0 without a token, where it would warn
and hide Status, a client certificate counts as a credential: no warning,
Status for its holders.

Usage: hosted_tls_test.py --ddprun PATH --mnist PATH --data-dir DIR
                          --make-certs PATH
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from ports import free_port  # noqa: E402
from processes import stop  # noqa: E402
from waits import wait_until  # noqa: E402


def run(argv, env, timeout=60):
    return subprocess.run(argv, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env,
                          timeout=timeout)


def start_host(argv_for, log_path, env, cwd):
    """Starts argv_for(endpoint) on a free loopback port until one is
    served; returns (process, endpoint)."""
    for _ in range(5):
        endpoint = "127.0.0.1:%d" % free_port()
        log = open(log_path, "w")
        host = subprocess.Popen(argv_for(endpoint), stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            wait_until(lambda: "serving the rendezvous" in open(
                log_path).read() or host.poll() is not None,
                "the agent to serve", 60)
        except AssertionError:
            stop(host)
            raise
        if host.poll() is None:
            return host, endpoint
        host.wait()
    raise AssertionError("no port could be served: " + open(log_path).read())


def check_mutual_tls(args, env, work, certs, other, program, failures):
    """Mutual TLS on the hosted rendezvous: only certificates signed by the
    client CA get in, agents, workers and `ddprun status` alike."""
    ca = os.path.join(certs, "ca.crt")

    def pem(where, name):
        return os.path.join(where, name)

    own_cert = ["--tls-cert-file", pem(certs, "client.crt"),
                "--tls-key-file", pem(certs, "client.key")]
    foreign_cert = ["--tls-cert-file", pem(other, "client.crt"),
                    "--tls-key-file", pem(other, "client.key")]

    def agent_argv(endpoint, hosts, cert, prog, conf):
        argv = [args.ddprun, "--nnodes", "2", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", endpoint, "--rdzv-id", "mtlsjob",
                "--rdzv-conf", conf, "--tls-ca-file", ca] + cert
        if hosts:
            argv += ["--host-tls-cert-file", pem(certs, "server.crt"),
                     "--host-tls-key-file", pem(certs, "server.key"),
                     "--host-tls-client-ca-file", ca]
        return argv + prog

    # The job's nodes share one --rdzv-conf, as the rendezvous requires.
    job_conf = "join_timeout=60,read_timeout=5"
    log_path = os.path.join(work, "mtls-host.log")
    host, endpoint = start_host(
        lambda e: agent_argv(e, True, own_cert, program, job_conf),
        log_path, env, work)
    try:
        if "(run id mtlsjob) over mutual TLS" not in open(log_path).read():
            failures.append("the host does not say it serves mutual TLS: %r"
                            % open(log_path).read())

        def status(cert):
            return run([args.ddprun, "status", "--rdzv-endpoint", endpoint,
                        "--rdzv-id", "mtlsjob", "--tls-ca-file", ca,
                        "--timeout", "3"] + cert, env)

        def answered(p):
            return p.returncode == 0 and "mtlsjob" in p.stdout.replace(
                "--rdzv-id mtlsjob", "")

        # The right certificate is answered (on loopback without a token
        # the hosted rendezvous answers Status), so a refusal below is the
        # certificate's doing.
        mine = status(own_cert)
        if not answered(mine):
            failures.append("Status with the client certificate failed: "
                            "rc %d %r" % (mine.returncode, mine.stdout))
        for what, cert in (("no client certificate", []),
                           ("a certificate of another CA", foreign_cert)):
            p = status(cert)
            if answered(p) or p.returncode == 0:
                failures.append("Status answered a caller with %s: rc %d %r"
                                % (what, p.returncode, p.stdout))
            # An agent of the job that cannot prove itself never joins:
            # it gives up after read_timeout (75), and the host still
            # waits for its second node.
            p = run(agent_argv(endpoint, False, cert,
                               ["--no-python", "true"], "read_timeout=2"),
                    env)
            if p.returncode != 75 or "--tls-cert-file" not in p.stdout:
                failures.append("an agent with %s was not refused, or not "
                                "told to check --tls-cert-file: rc %d %r"
                                % (what, p.returncode, p.stdout))
            if host.poll() is not None:
                failures.append("the host ended after the agent with %s: %r"
                                % (what, open(log_path).read()))
                return
        # The job's second node, with its certificate: both nodes' workers
        # (whose store clients present it too) train through the rendezvous.
        second = run(agent_argv(endpoint, False, own_cert, program,
                                job_conf), env, timeout=180)
        if second.returncode != 0:
            failures.append("the second node failed over mutual TLS: rc %d %r"
                            % (second.returncode, second.stdout))
        if host.wait(timeout=120) != 0:
            failures.append("the mutual-TLS host failed: %r" %
                            open(log_path).read())
        text = open(log_path).read()
        for want in ("world size 2", "test accuracy", "succeeded in round 0"):
            if want not in text:
                failures.append("the mutual-TLS host's log lacks %r: %r" %
                                (want, text))
    finally:
        stop(host)


def check_mutual_tls_off_loopback(args, env, work, certs, failures):
    """Off loopback without a token the hosted rendezvous hides Status and
    warns (a torchrun store is as open); a verified client certificate is a
    credential as the token is: no warning, Status for certificate
    holders."""
    ca = os.path.join(certs, "ca.crt")
    log_path = os.path.join(work, "mtls-wild.log")
    host, endpoint = start_host(
        lambda e: [args.ddprun, "--nnodes", "2", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", e.replace("127.0.0.1", "0.0.0.0"),
                   "--rdzv-id", "mtlswild", "--tls-ca-file", ca,
                   "--tls-server-name", "localhost",
                   "--tls-cert-file", os.path.join(certs, "client.crt"),
                   "--tls-key-file", os.path.join(certs, "client.key"),
                   "--host-tls-cert-file", os.path.join(certs, "server.crt"),
                   "--host-tls-key-file", os.path.join(certs, "server.key"),
                   "--host-tls-client-ca-file", ca, "--no-python", "true"],
        log_path, env, work)
    try:
        text = open(log_path).read()
        if "(all interfaces)" not in text or "takes no token" in text:
            failures.append("off loopback with mutual TLS: want no "
                            "open-network warning: %r" % text)
        p = run([args.ddprun, "status", "--rdzv-endpoint", endpoint,
                 "--rdzv-id", "mtlswild", "--tls-ca-file", ca,
                 "--tls-cert-file", os.path.join(certs, "client.crt"),
                 "--tls-key-file", os.path.join(certs, "client.key"),
                 "--timeout", "3"], env)
        if p.returncode != 0 or "job mtlswild" not in p.stdout:
            failures.append("off loopback, Status refused a caller with a "
                            "client certificate: rc %d %r" %
                            (p.returncode, p.stdout))
    finally:
        stop(host, grace_s=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--mnist", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--make-certs", required=True)
    args = parser.parse_args()
    env = dict(os.environ)
    for name in ("DDPRUN_TOKEN", "DDPRUN_TOKEN_FILE", "PET_TOKEN_FILE"):
        env.pop(name, None)
    failures = []
    with tempfile.TemporaryDirectory() as work:
        certs = os.path.join(work, "certs")
        os.makedirs(certs)
        subprocess.run(["/bin/sh", args.make_certs, certs], check=True,
                       stdout=subprocess.DEVNULL, timeout=60)
        ca = os.path.join(certs, "ca.crt")
        token = os.path.join(work, "token")
        with open(token, "w") as f:
            f.write("hosted-tls-token\n")
        os.chmod(token, 0o600)
        program = ["--no-python", args.mnist, "--epochs", "1", "--data-dir",
                   args.data_dir, "--train-limit", "2000", "--test-limit",
                   "500", "--max-steps", "5", "--save", ""]

        def agent_argv(endpoint, run_id, host_certs, extra=()):
            argv = [args.ddprun, "--nnodes", "2", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
                    "--rdzv-conf", "join_timeout=60,read_timeout=5",
                    "--token-file", token, "--tls-ca-file", ca]
            if host_certs:
                argv += ["--host-tls-cert-file",
                         os.path.join(certs, "server.crt"),
                         "--host-tls-key-file",
                         os.path.join(certs, "server.key")]
            return argv + list(extra) + program

        host_log = os.path.join(work, "host.log")
        host, endpoint = start_host(
            lambda e: agent_argv(e, "tlsjob", True), host_log, env, work)
        try:
            text = open(host_log).read()
            if "for this job (run id tlsjob) over TLS" not in text:
                failures.append("the host does not say it serves TLS: %r" %
                                text)
            # A plaintext client (no --tls-ca-file) gets nothing, even with
            # the token.
            plain = run([args.ddprun, "status", "--rdzv-endpoint", endpoint,
                         "--rdzv-id", "tlsjob", "--token-file", token,
                         "--timeout", "3"], env)
            if plain.returncode == 0 or "tlsjob" in plain.stdout.replace(
                    "--rdzv-id tlsjob", ""):
                failures.append("a plaintext client was answered: rc %d %r"
                                % (plain.returncode, plain.stdout))
            # A plaintext agent of the same job cannot join: the port is
            # taken, so it connects, in plaintext, and gives up (75).
            plain_agent = run(
                [args.ddprun, "--nnodes", "2", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", endpoint, "--rdzv-id", "tlsjob",
                 "--rdzv-conf", "read_timeout=2", "--token-file", token,
                 "--no-python", "true"], env)
            if plain_agent.returncode != 75:
                failures.append("a plaintext agent was not refused: rc %d %r"
                                % (plain_agent.returncode,
                                   plain_agent.stdout))
            # The token rules of the hosted rendezvous: Status with the
            # token (over TLS), none without it.
            status = run([args.ddprun, "status", "--rdzv-endpoint", endpoint,
                          "--rdzv-id", "tlsjob", "--token-file", token,
                          "--tls-ca-file", ca], env)
            if status.returncode != 0 or "tlsjob" not in status.stdout:
                failures.append("Status over TLS with the token failed: "
                                "rc %d %r" % (status.returncode,
                                              status.stdout))
            no_token = run([args.ddprun, "status", "--rdzv-endpoint",
                            endpoint, "--rdzv-id", "tlsjob", "--tls-ca-file",
                            ca], env)
            if no_token.returncode == 0 or "--token-file" not in \
                    no_token.stdout:
                failures.append("Status answered a caller without the token:"
                                " rc %d %r" % (no_token.returncode,
                                               no_token.stdout))
            # Another run id is refused, over TLS and with the token too.
            other = run([args.ddprun, "--nnodes", "2", "--rdzv-backend",
                         "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                         "other", "--token-file", token, "--tls-ca-file", ca,
                         "--no-python", "true"], env)
            if (other.returncode == 0 or
                    "serves no other run id" not in other.stdout):
                failures.append("another run id was admitted: rc %d %r" %
                                (other.returncode, other.stdout))
            # The job's second node: --tls-ca-file only (it never serves),
            # and the job trains through the hosted TLS rendezvous.
            second = run(agent_argv(endpoint, "tlsjob", False), env,
                         timeout=180)
            if second.returncode != 0:
                failures.append("the second node failed: rc %d %r" %
                                (second.returncode, second.stdout))
            if host.wait(timeout=120) != 0:
                failures.append("the hosting agent failed: %r" %
                                open(host_log).read())
            text = open(host_log).read()
            for want in ("world size 2", "test accuracy",
                         "succeeded in round 0"):
                if want not in text:
                    failures.append("the host's log lacks %r: %r" %
                                    (want, text))
        finally:
            stop(host)
        # The static form (--master-addr): node rank 0 serves over TLS with
        # the same flags, node rank 1 joins; both run the same line.
        for attempt in range(5):
            port = free_port()
            static = [args.ddprun, "--nnodes", "2", "--master-addr",
                      "127.0.0.1", "--master-port", str(port), "--rdzv-id",
                      "static-tls", "--rdzv-conf", "join_timeout=60",
                      "--token-file", token, "--tls-ca-file", ca,
                      "--host-tls-cert-file",
                      os.path.join(certs, "server.crt"),
                      "--host-tls-key-file",
                      os.path.join(certs, "server.key")]
            log_path = os.path.join(work, "static0.log")
            rank0 = subprocess.Popen(
                static + ["--node-rank", "0", "--no-python", "true"],
                stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
                env=env, cwd=work)
            try:
                wait_until(lambda: "serving the rendezvous" in open(
                    log_path).read() or rank0.poll() is not None,
                    "node rank 0 to serve", 60)
                if rank0.poll() is not None:
                    continue  # the port was taken meanwhile
                rank1 = run(static + ["--node-rank", "1", "--no-python",
                                      "true"], env)
                if rank1.returncode != 0:
                    failures.append("static node rank 1 failed: rc %d %r" %
                                    (rank1.returncode, rank1.stdout))
                if rank0.wait(timeout=60) != 0:
                    failures.append("static node rank 0 failed: %r" %
                                    open(log_path).read())
                if "(run id static-tls) over TLS" not in open(
                        log_path).read():
                    failures.append("static node rank 0 does not serve TLS:"
                                    " %r" % open(log_path).read())
                break
            finally:
                stop(rank0)
        else:
            failures.append("no port could be served for the static form")
        # Mutual TLS, with a second CA whose client certificate must not
        # get in.
        other = os.path.join(work, "other")
        os.makedirs(other)
        subprocess.run(["/bin/sh", args.make_certs, other], check=True,
                       stdout=subprocess.DEVNULL, timeout=60)
        check_mutual_tls(args, env, work, certs, other, program, failures)
        check_mutual_tls_off_loopback(args, env, work, certs, failures)
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("OK: an agent-hosted TLS rendezvous trains a 2-node job, refuses "
          "plaintext, keeps the token and status rules; with mutual TLS it "
          "trains and refuses callers without a certificate of its CA")


if __name__ == "__main__":
    main()
