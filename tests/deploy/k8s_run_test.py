"""Runs deploy/k8s/base's rendezvous and its agents Job without a cluster:
the Deployment's container command and the Job's pod template (command,
env with its fieldRefs resolved, workingDir, the token Secret's file (a
random token, made as the README's `kubectl create secret` does) and the
data volume) as two pods, each in a network namespace of
deploy/local/netns_cluster.sh; `ddprun-rendezvous` (the Service) resolves to
the rendezvous' namespace. One change from the manifest: one worker per pod
instead of one per GPU (PET_NPROC_PER_NODE), as this machine has none.
Both pods must finish the job (MNIST) with exit 0, and the rendezvous'
/metrics answers on its pod's loopback and not from another pod. Start
order: the agents start first, as Kubernetes may start them; the
rendezvous' pod refuses their connections (counted: its namespace's TCP
resets) and they must wait for it (read_timeout), not fail the Job. The
agents get the job token of Secret ddprun-job, as the README makes it.
Root only (77 = skipped; under CI=true a failure)."""

import base64
import glob
import os
import shutil
import subprocess
import tempfile
import time

from deploy_lint import Checker, scrape_in

c = Checker("k8s_run")
if os.geteuid() != 0 or not all(c.binaries.values()):
    c.skip("needs root and all three programs")
objects = {}
for path in glob.glob(c.path("deploy", "k8s", "base", "*.yaml")):
    for doc in c.load_yaml(path):
        objects[(doc.get("kind"), doc.get("metadata", {}).get("name"))] = doc
deployment = objects[("Deployment", "ddprun-rendezvous")]
service = objects[("Service", "ddprun-rendezvous")]
(job,) = [d for (k, _), d in objects.items() if k == "Job"]
# The Secrets the README's `kubectl create secret` commands make: the
# server's token, and a run id with its job token (`ddprun-rendezvous
# job-token`, from a 0600 copy of the server's token).
server_token = base64.b64encode(os.urandom(32)).decode() + "\n"
run_id = f"k8s-run-{os.getpid()}"
with tempfile.TemporaryDirectory() as keep:
    token_path = os.path.join(keep, "ddprun.token")
    with open(os.open(token_path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(server_token)
    made = subprocess.run([c.binaries["ddprun-rendezvous"], "job-token", "--run-id", run_id,
                           "--token-file", token_path],
                          capture_output=True, text=True, timeout=30)
c.check(made.returncode == 0 and made.stdout.strip(),
        f"ddprun-rendezvous job-token failed: {made.stderr}")
secrets = {("Secret", "ddprun-token"): {"token": server_token},
           ("Secret", "ddprun-job"): {"run-id": run_id, "token": made.stdout}}

netns = c.path("deploy", "local", "netns_cluster.sh")
name = f"ddpk{os.getpid()}"
work = tempfile.mkdtemp()
bindir = os.path.join(work, "bin")
os.makedirs(bindir)
for program, binary in c.binaries.items():
    os.symlink(os.path.abspath(binary), os.path.join(bindir, program))
rdzv_addr = "10.253.0.1"


def pod_root(pod, volumes_spec, mounts):
    """A directory per mount path: the Secret's items as files, the claim
    shared by every pod (with the MNIST files, as the README says to fill
    it), emptyDirs per pod. Returns {mount path: directory}."""
    volumes = {v["name"]: v for v in volumes_spec}
    mapping = {}
    for mount in mounts:
        volume = volumes[mount["name"]]
        if "secret" in volume:
            d = os.path.join(work, pod, mount["name"])
            os.makedirs(d)
            key = ("Secret", volume["secret"]["secretName"])
            # As the kubelet: a missing optional Secret is an empty folder, a
            # missing required one keeps the pod from starting.
            c.check(key in secrets or volume["secret"].get("optional"),
                    f"{pod}: needs {key}, which the README does not make")
            secret = secrets.get(key, {})
            for item in volume["secret"].get("items", []) if secret else []:
                path = os.path.join(d, item["path"])
                with open(path, "w") as f:
                    f.write(secret[item["key"]])
                os.chmod(path, volume["secret"].get("defaultMode", 0o644))
        elif "persistentVolumeClaim" in volume:
            d = os.path.join(work, "claim-" + volume["persistentVolumeClaim"]["claimName"])
            if not os.path.isdir(d):
                os.makedirs(d)
                os.symlink(c.path("data", "mnist"), os.path.join(d, "mnist"))
        else:
            d = os.path.join(work, pod, mount["name"])
            os.makedirs(d)
        mapping[mount["mountPath"]] = d
    return mapping


def translate(word, mapping):
    for mount_path in sorted(mapping, key=len, reverse=True):
        if word == mount_path or word.startswith(mount_path + "/"):
            return mapping[mount_path] + word[len(mount_path):]
    return word.replace(f"{service['metadata']['name']}:", f"{rdzv_addr}:")


def start(node, container, mapping, env, log_name):
    full_env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": work}
    full_env.update({k: translate(v, mapping) for k, v in env.items()})
    cwd = translate(container.get("workingDir", work), mapping)
    out = open(os.path.join(work, log_name), "w")
    return subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{name}-{node}"] +
        [translate(w, mapping) for w in container["command"]],
        env=full_env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)


procs = []
try:
    subprocess.run([netns, "up", name, str(job["spec"]["parallelism"])],
                   check=True, capture_output=True)
    (rc,) = deployment["spec"]["template"]["spec"]["containers"]
    rmap = pod_root("rendezvous", deployment["spec"]["template"]["spec"]["volumes"],
                    rc.get("volumeMounts", []))
    def rdzv_resets():
        """TCP resets the rendezvous' namespace sent: refused connections."""
        snmp = subprocess.run(["ip", "netns", "exec", f"{name}-rdzv", "cat",
                               "/proc/net/snmp"], capture_output=True, text=True).stdout
        header, values = [line.split() for line in snmp.splitlines()
                          if line.startswith("Tcp:")][:2]
        return int(values[header.index("OutRsts")])

    resets_before = rdzv_resets()
    pod_spec = job["spec"]["template"]["spec"]
    (ac,) = pod_spec["containers"]
    agents = []
    for index in range(job["spec"]["parallelism"]):
        host = f"h{index + 1}"
        amap = pod_root(f"pod{index}", pod_spec["volumes"], ac.get("volumeMounts", []))
        env = {}
        for e in ac["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "secretKeyRef" in e["valueFrom"]:
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = secrets.get(("Secret", ref["name"]), {}).get(ref["key"], "")
                c.check(env[e["name"]] != "", f"no Secret key {ref} for {e['name']}")
            else:
                field = e["valueFrom"]["fieldRef"]["fieldPath"]
                env[e["name"]] = {
                    "status.podIP": f"10.253.0.{11 + index}",
                }.get(field, f"uid-{name}" if "controller-uid" in field else "")
                c.check(env[e["name"]] != "", f"unknown fieldRef {field}")
        env["PET_NPROC_PER_NODE"] = "1"  # no GPUs on this machine
        env["JOB_COMPLETION_INDEX"] = str(index)
        agents.append(start(host, ac, amap, env, f"pod{index}.log"))
        procs.append(agents[-1])
    # Start order: the agents came first, as Kubernetes may start them; the
    # rendezvous' address refuses them (TCP resets from its namespace) and
    # they wait for it (read_timeout) instead of failing the Job.
    def log_of(index):
        return open(os.path.join(work, f"pod{index}.log")).read()
    deadline = time.time() + 30
    while time.time() < deadline and rdzv_resets() < resets_before + 2 * len(agents):
        time.sleep(0.05)
    c.check(rdzv_resets() >= resets_before + 2 * len(agents),
            "the agents never tried the rendezvous before it started")
    c.check(all(a.poll() is None for a in agents),
            "the agents did not wait for a rendezvous that is not up yet: " +
            " | ".join(log_of(i)[-500:] for i in range(len(agents))))
    procs.append(start("rdzv", rc, rmap, {}, "rendezvous.log"))
    for index, agent in enumerate(agents):
        try:
            code = agent.wait(timeout=300)
        except subprocess.TimeoutExpired:
            code = None
        c.check(code == 0, f"agents Job pod {index} exited {code}:\n" +
                open(os.path.join(work, f"pod{index}.log")).read()[-3000:])
    # /metrics: on the rendezvous pod's loopback (kubectl port-forward),
    # not on its address from another pod (overlays/metrics opens that).
    metrics_port = rc["command"][rc["command"].index("--metrics-port") + 1]
    text = scrape_in(f"{name}-rdzv", f"http://127.0.0.1:{metrics_port}/metrics")
    c.check('ddprun_rendezvous_jobs{state="JOB_STATE_SUCCEEDED"} 1' in text,
            f"rendezvous /metrics does not show the finished job:\n{text}")
    c.check(scrape_in(f"{name}-h1", f"http://{rdzv_addr}:{metrics_port}/metrics") == "",
            "rendezvous /metrics answers another pod: it must be loopback-only")
finally:
    for p in procs:
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
