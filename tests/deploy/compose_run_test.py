"""Runs deploy/docker/compose.yaml's services without a container engine:
each service's own command and environment, the rendezvous and the two
agents each in a network namespace of deploy/local/netns_cluster.sh, with
what Docker would provide put in place (the service name `rendezvous`
resolved to its namespace's address, the secret file, the data volume, the
programs on PATH). Checks the healthcheck command turns healthy and both
agents train MNIST to exit 0. Root only (77 = skipped; under CI=true a
failure)."""

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
secrets = os.path.join(work, "secrets")
os.makedirs(secrets)
with open(os.path.join(secrets, "ddprun_token"), "w") as f:
    f.write("compose-token\n")
os.chmod(os.path.join(secrets, "ddprun_token"), 0o600)  # must be private
data = c.path("data", "mnist")
rdzv_addr = "10.253.0.1"


def as_docker_would(word):
    """Paths and names inside the containers, mapped to this machine, and
    ${VAR:-default} interpolated from this environment as compose does."""
    word = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}",
                  lambda m: os.environ.get(m.group(1)) or m.group(2), word)
    return (word.replace("/run/secrets/", secrets + "/")
                .replace("/data/mnist", data)
                .replace("rendezvous:", rdzv_addr + ":"))


def run_in(node, argv, env, **kwargs):
    full_env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": work}
    full_env.update({k: as_docker_would(str(v)) for k, v in env.items()})
    return subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{name}-{node}"] +
        [as_docker_would(w) for w in argv], env=full_env, cwd=work, **kwargs)


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
