"""The workers' environment under ddprun against Debian's torchrun (torch
1.13; 2.6 in Debian 13) for the same command line: the diff must be empty apart from
ddprun's own DDPRUN_* names, ports, run ids and file paths.

Usage: torchrun_env_test.py --ddprun PATH
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DUMP = os.path.join(HERE, "dump_env.py")
LOOPBACK = {"localhost", "127.0.0.1", "::1"}

# Keys whose values differ by nature: ids picked per run, and MASTER_PORT
# where the line names none (torchrun's static default is 29500, ddprun
# picks a free port; lines with --master_port compare it).
PER_RUN = {"TORCHELASTIC_RUN_ID"}
# Set by ddprun and not by torchrun, on purpose: USE_LIBUV=0 for a
# distribution's torch >= 2.4 (Debian 13's 2.6 has no libuv, and rank 0's
# env:// TCPStore would fail). The NCCL names follow the workers' torch as
# torchrun of that torch sets them, so they compare.
EXTRA_OK = {"USE_LIBUV"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(launcher, line, out_dir, home, extra_env=None):
    # TMPDIR: --redirects/--tee without --log-dir log into a temporary
    # folder that both launchers keep; the test's own, not /tmp.
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
           "TMPDIR": home}
    env.update(extra_env or {})
    argv = launcher + line + [DUMP, out_dir]
    p = subprocess.run(argv, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=180, text=True)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d:\n%s" % (argv, p.returncode, p.stdout))
    envs = {}
    for name in os.listdir(out_dir):
        if name.startswith("env_"):
            with open(os.path.join(out_dir, name)) as f:
                envs[name] = json.load(f)
    return envs


def diff(torchrun_env, ddprun_env, same_port):
    problems = []
    for key in sorted(set(torchrun_env) | set(ddprun_env)):
        t, d = torchrun_env.get(key), ddprun_env.get(key)
        if key == "DDPRUN_TOKEN" and d is not None:
            problems.append("DDPRUN_TOKEN: a worker must not see the token")
            continue
        if t == d or key.startswith("DDPRUN_") or key in PER_RUN:
            continue
        if key == "MASTER_PORT" and not same_port:
            continue
        if key in EXTRA_OK and t is None:
            continue
        if key == "PYTHONPATH" and d and d.split(":")[-1].endswith("/python") \
                and ":".join(d.split(":")[:-1]) == (t or ""):
            continue  # ddprun's own package (import ddprun.progress), last
        if key == "MASTER_ADDR" and t in LOOPBACK and d in LOOPBACK:
            continue  # both this host's loopback
        if (key == "TORCHELASTIC_ERROR_FILE" and t and d and
                t.split("/")[-3:] == d.split("/")[-3:]):
            # A file in a per-run temporary folder in both, the same
            # attempt_<n>/<local_rank>/error.json under it.
            continue
        if key == "TORCHELASTIC_USE_AGENT_STORE" and (t, d) == ("True", "False"):
            # torchrun's static form serves a TCPStore at MASTER_PORT from
            # the agent; ddprun's store is its rendezvous, so rank 0 serves
            # torch's TCPStore itself, as with c10d (where torchrun says
            # False too).
            continue
        problems.append("%s: torchrun %r, ddprun %r" % (key, t, d))
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    args = parser.parse_args()
    torchrun = [
        # torchrun itself, made to start on a torch without libuv too.
        "/usr/bin/python3", os.path.join(HERE, "torchrun_baseline.py")]
    # torch 1.13's torchrun crashes without --redirects/--tee here (its
    # tee of a missing log file); ddprun takes the same flags.
    common = ["--redirects", "1", "--tee", "1"]
    lines = [
        ["--standalone", "--nproc_per_node", "2"],
        # torchrun's static default: one worker, --master_port only.
        ["--nproc_per_node", "1", "--master_port", "PORT"],
        ["--nnodes", "1", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
         "--rdzv_endpoint", "127.0.0.1:PORT", "--rdzv_id", "envdiff"],
    ]
    failures = []
    home = tempfile.mkdtemp()
    for line in lines:
        with tempfile.TemporaryDirectory() as t, \
                tempfile.TemporaryDirectory() as d:
            # --master_port: the same port for both (one after the other),
            # so that MASTER_PORT compares; an endpoint's port is the
            # rendezvous', not the workers'.
            same_port = "--master_port" in line
            port = free_port()
            t_line = [a.replace("PORT", str(port)) for a in line]
            d_line = [a.replace("PORT", str(port if same_port else free_port()))
                      for a in line]
            t_envs = run(torchrun, common + t_line, t, home)
            # A token in the agent's environment never reaches a worker.
            d_envs = run([args.ddprun], common + d_line, d, home,
                         {"DDPRUN_TOKEN": "secret-of-the-agent"})
            if sorted(t_envs) != sorted(d_envs) or not t_envs:
                failures.append("%s: ranks %s vs %s" %
                                (line, sorted(t_envs), sorted(d_envs)))
                continue
            for name in sorted(t_envs):
                for p in diff(t_envs[name], d_envs[name], same_port):
                    failures.append("%s %s: %s" % (" ".join(line), name, p))
        print("compared: %s" % " ".join(line), flush=True)
    shutil.rmtree(home, ignore_errors=True)
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("OK: %d command lines, no difference" % len(lines))


if __name__ == "__main__":
    main()
