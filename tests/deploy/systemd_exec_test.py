"""Runs the systemd units' ExecStart lines as systemd would start them, with
the real programs: Environment=/EnvironmentFile= applied, $VAR split into
words and ${VAR} kept as one, %d/%i/%S replaced, the token (and TLS files)
in a credentials directory. No systemd is needed: this checks what
`systemd-analyze verify` cannot, that the command lines work.
  1. ddprun-rendezvous.service (+ tls.conf) serves, requires the token, and
     stops cleanly on SIGTERM;
  2. ddprun-agent@JOB.service runs a job's program through that rendezvous
     from PET_* variables and DDPRUN_PROGRAM in the job's environment file,
     and `systemctl stop`'s SIGTERM ends it with an exit status the unit's
     SuccessExitStatus= counts as success (not "failed")."""

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

from deploy_lint import Checker

c = Checker("systemd_exec")
ddprun, rendezvous = c.binaries["ddprun"], c.binaries["ddprun-rendezvous"]
assert ddprun and rendezvous, "needs --ddprun and --ddprun-rendezvous"
work = tempfile.mkdtemp()
bindir = os.path.join(work, "bin")
os.makedirs(bindir)
os.symlink(os.path.abspath(ddprun), os.path.join(bindir, "ddprun"))
os.symlink(os.path.abspath(rendezvous), os.path.join(bindir, "ddprun-rendezvous"))
processes = []


def unit_lines(*paths):
    """(key, value) pairs of the [Service] sections, in order."""
    pairs = []
    for path in paths:
        section = None
        with open(path) as f:
            for raw in f:
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                if line.startswith("["):
                    section = line
                elif section == "[Service]":
                    key, _, value = line.partition("=")
                    pairs.append((key, value))
    return pairs


def job_credentials(work, server_token, run_id):
    """An agent's credentials folder as the README makes it: the job token
    of `run_id` (`ddprun-rendezvous job-token`), 0400, never the server's."""
    folder = os.path.join(work, f"creds-{run_id}")
    os.makedirs(folder)
    made = subprocess.run([rendezvous, "job-token", "--run-id", run_id,
                           "--token-file", server_token],
                          capture_output=True, text=True, timeout=30)
    c.check(made.returncode == 0, f"job-token failed: {made.stderr}")
    path = os.path.join(folder, "token")
    with open(path, "w") as f:
        f.write(made.stdout)
    os.chmod(path, 0o400)
    return folder


def service_command(paths, env_file_text, specifiers, creds):
    """The argv and environment systemd would give ExecStart."""
    env = {"CREDENTIALS_DIRECTORY": creds}
    exec_start = None
    for key, value in unit_lines(*paths):
        value = value.replace("@DDPRUN_BINDIR@", bindir)
        for spec, text in specifiers.items():
            value = value.replace(spec, text)
        if key == "Environment":
            for word in shlex.split(value):
                name, _, val = word.partition("=")
                env[name] = val
        elif key == "EnvironmentFile":
            for line in env_file_text.splitlines():
                name, _, val = line.partition("=")
                env[name] = val
        elif key == "ExecStart":
            exec_start = value
    argv = []
    for word in shlex.split(exec_start):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:  # $VAR: split into words; empty: no word at all
            argv += env.get(whole.group(1), "").split()
        else:      # ${VAR}: substituted inside one word
            argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                               lambda m: env.get(m.group(1), ""), word))
    return argv, env


def start(argv, env, stdout_path):
    out = open(stdout_path, "w")
    p = subprocess.Popen(argv, env={**os.environ, **env}, stdout=out,
                         stderr=subprocess.STDOUT, start_new_session=True)
    processes.append(p)
    return p


def wait_for_line(path, prefix, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
        time.sleep(0.05)
    return None


def status_ok(endpoint, token_file, extra=()):
    run = subprocess.run([ddprun, "status", "--rdzv-endpoint", endpoint,
                          "--token-file", token_file, "--timeout", "5", *extra],
                         capture_output=True, text=True, timeout=30)
    return run.returncode == 0, run.stdout + run.stderr


try:
    units = c.path("deploy", "systemd")
    creds = os.path.join(work, "credentials")
    os.makedirs(creds)
    token = os.path.join(creds, "token")
    with open(token, "w") as f:
        f.write("a-shared-token\n")
    os.chmod(token, 0o400)  # as systemd hands credentials to the service
    # /etc/default/ddprun-rendezvous: every interface (the unit's default)
    # and ports the kernel picks; /metrics keeps the unit's default host.
    default = ("DDPRUN_RDZV_HOST=0.0.0.0\nDDPRUN_RDZV_PORT=0\n"
               "DDPRUN_RDZV_METRICS_PORT=0\n")

    # 1a. plaintext + token.
    argv, env = service_command([os.path.join(units, "ddprun-rendezvous.service.in")],
                                default, {"%d": creds}, creds)
    server = start(argv, env, os.path.join(work, "rdzv.out"))
    endpoint = wait_for_line(os.path.join(work, "rdzv.out"),
                             "ddprun-rendezvous listening on ", 30)
    if c.check(endpoint is not None, f"rendezvous unit did not start: {argv}"):
        ok, out = status_ok(endpoint, token)
        c.check(ok, f"status with the unit's token failed: {out}")
        wrong = os.path.join(work, "wrong-token")
        with open(wrong, "w") as f:
            f.write("another\n")
        ok, out = status_ok(endpoint, wrong)
        c.check(not ok and "token" in out, "the unit's server admitted a wrong token")

    # 2. the agent template, instance "job1", through that server.
    if endpoint:
        state = os.path.join(work, "state")
        os.makedirs(os.path.join(state, "ddprun", "job1"))
        worker = os.path.join(work, "worker.sh")
        with open(worker, "w") as f:
            f.write('#!/bin/sh\necho "worker rank=$RANK world=$WORLD_SIZE '
                    'run=$TORCHELASTIC_RUN_ID arg=$1"\n')
        os.chmod(worker, 0o755)
        job_env = (f"PET_NNODES=1\nPET_NPROC_PER_NODE=2\n"
                   f"PET_RDZV_ENDPOINT={endpoint}\nPET_RDZV_ID=job1\n"
                   f"PET_MAX_RESTARTS=0\nDDPRUN_PROGRAM={worker} first-arg\n")
        # The agent gets its job's token, not the server's (README).
        job1_creds = job_credentials(work, token, "job1")
        argv, env = service_command(
            [os.path.join(units, "ddprun-agent@.service.in")], job_env,
            {"%i": "job1", "%S": state, "%d": job1_creds}, job1_creds)
        agent = start(argv, env, os.path.join(work, "agent.out"))
        try:
            code = agent.wait(timeout=120)
        except subprocess.TimeoutExpired:
            code = None
        with open(os.path.join(work, "agent.out")) as f:
            agent_out = f.read()
        c.check(code == 0, f"agent unit exited {code}: {argv}\n{agent_out}")
        for rank in (0, 1):
            c.check(f"worker rank={rank} world=2 run=job1 arg=first-arg" in agent_out,
                    f"agent unit: no worker rank {rank} with the program's argument\n{agent_out}")

    # 2b. systemctl stop: SIGTERM to ddprun (KillMode=mixed) while its
    # worker runs; the exit status must be one SuccessExitStatus= lists.
    if endpoint:
        agent_unit = os.path.join(units, "ddprun-agent@.service.in")
        success = {0}
        for key, value in unit_lines(agent_unit):
            if key == "SuccessExitStatus":
                success |= {int(w) for w in value.split() if w.isdigit()}
        state = os.path.join(work, "state")
        os.makedirs(os.path.join(state, "ddprun", "job2"))
        sleeper = os.path.join(work, "sleeper.sh")
        with open(sleeper, "w") as f:
            f.write('#!/bin/sh\necho "worker running"\nexec sleep 300\n')
        os.chmod(sleeper, 0o755)
        job_env = (f"PET_NNODES=1\nPET_NPROC_PER_NODE=1\n"
                   f"PET_RDZV_ENDPOINT={endpoint}\nPET_RDZV_ID=job2\n"
                   f"PET_MAX_RESTARTS=0\nDDPRUN_PROGRAM={sleeper}\n")
        argv, env = service_command([agent_unit], job_env,
                                    {"%i": "job2", "%S": state, "%d": creds}, creds)
        stopped = start(argv, env, os.path.join(work, "agent2.out"))
        deadline = time.time() + 60
        while time.time() < deadline and stopped.poll() is None:
            with open(os.path.join(work, "agent2.out")) as f:
                if "worker running" in f.read():
                    break
            time.sleep(0.05)
        stopped.send_signal(signal.SIGTERM)  # KillMode=mixed: the main process
        try:
            code = stopped.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None
        with open(os.path.join(work, "agent2.out")) as f:
            out2 = f.read()
        c.check("worker running" in out2, f"agent unit: the worker never ran\n{out2}")
        c.check(code in success,
                f"systemctl stop: ddprun exited {code}, which SuccessExitStatus= "
                f"{sorted(success)} does not count: the unit would be left failed\n{out2}")

    # 1b. its /metrics saw the agent's job succeed.
    url = wait_for_line(os.path.join(work, "rdzv.out"), "ddprun-rendezvous metrics on ", 5)
    if c.check(url is not None, "rendezvous unit serves no /metrics"):
        # gRPC on every interface, /metrics (no authentication) on loopback.
        c.check(url.startswith("http://127.0.0.1:"),
                f"the unit serves /metrics at {url}: it must be loopback unless told")
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        c.check('ddprun_rendezvous_jobs{state="JOB_STATE_SUCCEEDED"} 1' in text,
                f"/metrics of the unit's server does not show the finished job:\n{text}")

    # 1c. SIGTERM stops the server cleanly (Restart=on-failure restarts
    # only real failures).
    server.send_signal(signal.SIGTERM)
    try:
        code = server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        code = None
    c.check(code == 0, f"rendezvous unit's server exited {code} on SIGTERM")

    # 1d. with the TLS drop-in and a self-signed certificate for localhost
    # (openssl comes with ca-certificates, which scripts/setup.sh installs).
    if c.check(shutil.which("openssl") is not None,
               "openssl not found (apt-get install openssl): the TLS drop-in cannot be run"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                        "-days", "1", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost",
                        "-keyout", os.path.join(creds, "tls-key"),
                        "-out", os.path.join(creds, "tls-cert")],
                       check=True, capture_output=True, timeout=60)
        argv, env = service_command(
            [os.path.join(units, "ddprun-rendezvous.service.in"),
             os.path.join(units, "tls.conf")], default, {"%d": creds}, creds)
        tls_server = start(argv, env, os.path.join(work, "tls.out"))
        tls_endpoint = wait_for_line(os.path.join(work, "tls.out"),
                                     "ddprun-rendezvous listening on ", 30)
        if c.check(tls_endpoint is not None, f"TLS rendezvous did not start: {argv}"):
            port = tls_endpoint.rsplit(":", 1)[1]
            ok, out = status_ok(f"localhost:{port}", token,
                                ["--tls-ca-file", os.path.join(creds, "tls-cert")])
            c.check(ok, f"status over TLS failed: {out}")
            ok, out = status_ok(f"localhost:{port}", token)
            c.check(not ok, "a plaintext client reached the TLS server")
        tls_server.send_signal(signal.SIGTERM)
        tls_server.wait(timeout=15)
finally:
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    shutil.rmtree(work, ignore_errors=True)
c.finish()
