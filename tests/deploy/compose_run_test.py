"""Runs deploy/docker/compose.yaml's services without a container engine:
each service's own command and environment, the rendezvous and the two
agents each in a network namespace of deploy/local/netns_cluster.sh, with
what Docker would provide put in place (the service name `rendezvous`
resolved to its namespace's address, the secret file, the data volume, the
programs on PATH). Checks the healthcheck command turns healthy and both
agents train MNIST to exit 0. Every service runs as the image's user (uid
10001, as Docker would) and the token file is made as the compose file's
recipe says (0600, chowned to 10001): the user must be able to read it. The
job-token service runs first and the agents read its job token, never the
server's. Root only (77 = skipped; under CI=true a failure)."""

import os
import re
import shutil
import subprocess
import tempfile
import time

from deploy_lint import Checker, scrape_in

c = Checker("compose_run")
if os.geteuid() != 0 or not all(c.binaries.values()):
    c.skip("needs root and all three programs")
(compose,) = c.load_yaml("deploy", "docker", "compose.yaml")
services = compose["services"]
netns = c.path("deploy", "local", "netns_cluster.sh")
name = f"ddpc{os.getpid()}"
work = tempfile.mkdtemp()
bindir = os.path.join(work, "bin")
os.makedirs(bindir)
for program, binary in c.binaries.items():
    os.symlink(os.path.abspath(binary), os.path.join(bindir, program))
IMAGE_UID = 10001  # deploy/docker/Dockerfile's useradd
os.chmod(work, 0o755)
secrets = os.path.join(work, "secrets")
os.makedirs(secrets)
# The recipe: (umask 077; head ... > deploy/docker/token); chown 10001:10001.
with open(os.open(os.path.join(secrets, "ddprun_token"), os.O_WRONLY | os.O_CREAT, 0o600),
          "w") as f:
    f.write("compose-token\n")
os.chown(os.path.join(secrets, "ddprun_token"), IMAGE_UID, IMAGE_UID)
# The job-token volume: a fresh volume takes the image's /work/job (0700,
# the image's user's); the container's working folder is the user's home.
job_volume = os.path.join(work, "volume-job-token")
os.makedirs(job_volume, mode=0o700)
os.chown(job_volume, IMAGE_UID, IMAGE_UID)
home = os.path.join(work, "home")
os.makedirs(home)
os.chown(home, IMAGE_UID, IMAGE_UID)
data = c.path("data", "mnist")
rdzv_addr = "10.253.0.1"


def as_docker_would(word):
    """Paths and names inside the containers, mapped to this machine, and
    ${VAR:-default} interpolated from this environment as compose does."""
    word = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}",
                  lambda m: os.environ.get(m.group(1)) or m.group(2), word)
    return (word.replace("/run/secrets/", secrets + "/")
                .replace("/work/job", job_volume)
                .replace("/data/mnist", data)
                .replace("rendezvous:", rdzv_addr + ":"))


def run_in(node, argv, env, **kwargs):
    full_env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": home}
    full_env.update({k: as_docker_would(str(v)) for k, v in env.items()})
    return subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{name}-{node}", "setpriv",
         f"--reuid={IMAGE_UID}", f"--regid={IMAGE_UID}", "--clear-groups"] +
        [as_docker_would(w) for w in argv], env=full_env, cwd=home, **kwargs)


procs = []
try:
    subprocess.run([netns, "up", name, "2"], check=True, capture_output=True)
    rdzv = services["rendezvous"]
    # Inside its container the rendezvous is alone on its network: its
    # namespace is.
    log = open(os.path.join(work, "rendezvous.log"), "w")
    procs.append(run_in("rdzv", rdzv["command"], rdzv.get("environment", {}),
                        stdout=log, stderr=subprocess.STDOUT))
    health = rdzv["healthcheck"]["test"][1:]
    healthy = False
    deadline = time.time() + 30
    while time.time() < deadline and not healthy:
        healthy = run_in("rdzv", health, {}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL).wait(timeout=30) == 0
        if not healthy:
            time.sleep(0.2)
    c.check(healthy, "the compose healthcheck never passed: " +
            open(os.path.join(work, "rendezvous.log")).read())

    # depends_on: the job-token service completed successfully first.
    jt = services["job-token"]
    made = run_in("rdzv", jt["command"], jt.get("environment", {}),
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = made.communicate(timeout=60)
    c.check(made.returncode == 0, f"compose job-token exited {made.returncode}: {out!r}")
    job_token = os.path.join(job_volume, "token")
    c.check(os.path.exists(job_token) and os.stat(job_token).st_mode & 0o077 == 0 and
            os.stat(job_token).st_uid == IMAGE_UID,
            "the job token must be the image user's, 0600")

    agents = sorted(n for n in services if n.startswith("agent"))
    outputs = {}
    for i, agent_name in enumerate(agents, start=1):
        agent = services[agent_name]
        out = open(os.path.join(work, f"{agent_name}.log"), "w")
        outputs[agent_name] = out.name
        procs.append((agent_name, run_in(f"h{i}", agent["command"],
                                         agent["environment"], stdout=out,
                                         stderr=subprocess.STDOUT)))
    for agent_name, proc in [p for p in procs if isinstance(p, tuple)]:
        try:
            code = proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            code = None
        c.check(code == 0, f"compose {agent_name} exited {code}:\n" +
                open(outputs[agent_name]).read()[-3000:])
    # Prometheus scrapes the published metrics port: the finished job shows.
    metrics_port = rdzv["command"][rdzv["command"].index("--metrics-port") + 1]
    text = scrape_in(f"{name}-rdzv", f"http://127.0.0.1:{metrics_port}/metrics")
    c.check('ddprun_rendezvous_jobs{state="JOB_STATE_SUCCEEDED"} 1' in text,
            f"compose rendezvous /metrics does not show the finished job:\n{text}")
    # By default on the container's loopback only: not from another one.
    c.check(scrape_in(f"{name}-h1", f"http://{rdzv_addr}:{metrics_port}/metrics") == "",
            "compose rendezvous /metrics answers another container: it must be loopback-only")
finally:
    for p in procs:
        p = p[1] if isinstance(p, tuple) else p
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    subprocess.run([netns, "down", name], capture_output=True)
    shutil.rmtree(work, ignore_errors=True)
c.finish()
