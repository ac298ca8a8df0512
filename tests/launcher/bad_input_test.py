"""Bad input, as a careless or hostile user types it, to ddprun,
ddprun-rendezvous and ddprun-relay: each is refused before anything starts
(no worker, no listening server, no folder outside --log-dir), with an exit
status other than 0 and a message that names the value and says what to
write instead.

Usage: bad_input_test.py --ddprun PATH --rendezvous PATH --relay PATH
                         [--mnist PATH]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time


def run(argv, cwd, env=None):
    start = time.monotonic()
    p = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60,
                       env=env)
    return p, time.monotonic() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--relay", required=True)
    parser.add_argument("--mnist", help="ddprun-mnist, where it is built")
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as top:
        work = os.path.join(top, "a", "b")
        logs = os.path.join(work, "logs")
        os.makedirs(logs)
        marker = os.path.join(top, "worker-ran")
        program = ["--no-python", "sh", "-c", "touch " + marker]
        token_dir = os.path.join(top, "tokens")
        os.makedirs(token_dir)
        ca_file = os.path.join(token_dir, "ca.crt")
        open(ca_file, "w").close()
        cases = [
            # (argv, exit status, what the message must say)
            ([args.ddprun, "--log-dir", logs, "--rdzv-id", "../../escaped"]
             + program, 2, "'../../escaped' is not a run id"),
            ([args.ddprun, "--rdzv-id", "x" * 200] + program, 2,
             "1 to 128 letters"),
            ([args.ddprun, "--nproc-per-node", "100000"] + program, 2,
             "--max-nproc-per-node 100000 if you mean it"),
            ([args.ddprun, "--monitor-interval", "nan"] + program, 2,
             "'nan' is not a finite"),
            ([args.ddprun, "--shutdown-grace", "inf"] + program, 2,
             "'inf' is not a finite"),
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint",
              "no-such-host.invalid:29400"] + program, 2,
             "'no-such-host.invalid' does not resolve"),
            ([args.ddprun, "--token-file", token_dir, "--nnodes", "2",
              "--rdzv-endpoint", "127.0.0.1:1"] + program, 2,
             "is a folder; give the path of the file inside it"),
            # With --tls-ca-file an agent that must serve needs a
            # certificate (--host-tls-*): never a plaintext rendezvous.
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
              "--tls-ca-file", ca_file, "--rdzv-conf", "is_host=1"] + program,
             2, "with no certificate: give --host-tls-cert-file and "
             "--host-tls-key-file"),
            # The static form's node rank 0 serves too.
            ([args.ddprun, "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", "1", "--node-rank", "0", "--tls-ca-file",
              ca_file] + program,
             2, "with no certificate: give --host-tls-cert-file and "
             "--host-tls-key-file"),
            # A certificate without its key, or the key alone.
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
              "--tls-ca-file", ca_file, "--host-tls-cert-file", ca_file]
             + program, 2, "--host-tls-cert-file without --host-tls-key-file"),
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
              "--tls-ca-file", ca_file, "--host-tls-key-file", ca_file]
             + program, 2, "--host-tls-key-file without --host-tls-cert-file"),
            # Serving TLS that no agent or worker could check.
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
              "--host-tls-cert-file", ca_file, "--host-tls-key-file",
              ca_file] + program, 2,
             "--host-tls-cert-file without --tls-ca-file"),
            # As PET_ variables, the flags' house form.
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1"]
             + program, 2, "--host-tls-cert-file without --tls-ca-file",
             {"PET_HOST_TLS_CERT_FILE": ca_file,
              "PET_HOST_TLS_KEY_FILE": ca_file}),
            # Mutual TLS (--host-tls-client-ca-file) is TLS that checks its
            # callers: it needs the served certificate, and the serving
            # agent's own client certificate, since it calls itself.
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
              "--tls-ca-file", ca_file, "--tls-cert-file", ca_file,
              "--tls-key-file", ca_file, "--host-tls-client-ca-file",
              ca_file] + program, 2,
             "--host-tls-client-ca-file without --host-tls-cert-file"),
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
              "--tls-ca-file", ca_file, "--host-tls-cert-file", ca_file,
              "--host-tls-key-file", ca_file] + program, 2,
             "--host-tls-client-ca-file without --tls-cert-file and "
             "--tls-key-file", {"PET_HOST_TLS_CLIENT_CA_FILE": ca_file}),
            # A served file that cannot be read: refused at once, never
            # hidden by joining a rendezvous served elsewhere instead.
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
              "--tls-ca-file", ca_file, "--tls-cert-file", ca_file,
              "--tls-key-file", ca_file, "--host-tls-cert-file", ca_file,
              "--host-tls-key-file", ca_file, "--host-tls-client-ca-file",
              os.path.join(token_dir, "missing-ca.crt")] + program, 2,
             "cannot read the TLS client CA file"),
            # Without a certificate an agent with --tls-ca-file joins a TLS
            # rendezvous and never serves one itself (then 75).
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1",
              "--tls-ca-file", ca_file, "--rdzv-conf", "read_timeout=1"]
             + program, 75, "never serves one itself"),
            # No rendezvous within read_timeout: 75 (start me later), said.
            ([args.ddprun, "--nnodes", "2", "--rdzv-endpoint",
              "192.0.2.77:29400", "--rdzv-conf", "read_timeout=1"] + program,
             75, "exit 75, start the rendezvous first or raise --rdzv-conf "
             "read_timeout"),
            ([args.rendezvous, "--port", "0", "--max-value-bytes", "-5"], 2,
             "--max-value-bytes -5: must be at least 1"),
            ([args.rendezvous, "--port", "0", "--max-jobs", "0"], 2,
             "--max-jobs 0: must be at least 1"),
            ([args.rendezvous, "--port", "0", "--max-memory-bytes", "1000"],
             2, "give at least 67108864 (64 MiB), or 0 for no bound"),
            ([args.rendezvous, "--port", "0", "--max-poll-delay", "nan"], 2,
             "'nan' is not a finite number"),
            ([args.rendezvous, "--port", "0", "--token-file", token_dir], 1,
             "is a folder"),
            ([args.relay, "--upstream", "127.0.0.1:1", "--batch-window-ms",
              "nan"], 2, "'nan' is not a finite number"),
        ]
        if args.mnist:
            # A file where a folder belongs says so, not "does not exist".
            a_file = os.path.join(top, "tokens", "not-a-folder")
            open(a_file, "w").close()
            cases.append(([args.mnist, "--data-dir", a_file, "--epochs", "1"],
                          1, "is a file, not a folder"))
        for case in cases:
            argv, code, says = case[:3]
            env = dict(os.environ, **case[3]) if len(case) > 3 else None
            p, took = run(argv, cwd=work, env=env)
            shown = " ".join(a if len(a) < 40 else a[:37] + "..."
                             for a in argv[1:])
            name = os.path.basename(argv[0])
            if p.returncode != code or says not in p.stdout:
                failures.append("%s %s: rc %d (want %d), output %r" %
                                (name, shown, p.returncode, code, p.stdout))
            elif took > 10:
                failures.append("%s %s: refused after %.1f s, not at once" %
                                (name, shown, took))
            else:
                print("refused: %s %s -> %d" % (name, shown, p.returncode))
        if os.path.exists(marker):
            failures.append("a worker ran for a refused command line")
        # Nothing was created beside or above --log-dir.
        strays = sorted(set(os.listdir(top)) - {"a", "tokens"}) + sorted(
            set(os.listdir(os.path.join(top, "a"))) - {"b"}) + sorted(
            set(os.listdir(work)) - {"logs"})
        if strays or os.listdir(logs):
            failures.append("folders created: %s, in --log-dir: %s" %
                            (strays, os.listdir(logs)))
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("OK: %d bad command lines refused" % len(cases))


if __name__ == "__main__":
    main()
