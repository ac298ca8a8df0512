"""Lints deploy/k8s: parses every manifest and checks what ties them
together (names, labels, ports, probe port, secrets and their keys, the
Indexed Job's size against --nnodes and GPUs against --nproc-per-node), and
the commands and PET_* variables against the real programs. With kubectl
on PATH, `kubectl kustomize` must also build the base and the overlay."""

import glob
import os
import re
import shutil
import subprocess

import yaml

from deploy_lint import Checker

c = Checker("lint_k8s")
k8s = c.path("deploy", "k8s")

# Every file parses; the base lists every manifest next to it.
(kustomization,) = c.load_yaml("deploy", "k8s", "base", "kustomization.yaml")
listed = set(kustomization.get("resources", []))
present = {os.path.basename(p) for p in glob.glob(os.path.join(k8s, "base", "*.yaml"))}
c.check(listed == present - {"kustomization.yaml"},
        f"k8s base: kustomization lists {sorted(listed)}, folder has {sorted(present)}")
objects = {}
for name in sorted(listed):
    for doc in c.load_yaml("deploy", "k8s", "base", name):
        objects[(doc["kind"], doc["metadata"]["name"])] = doc
for path in glob.glob(os.path.join(k8s, "**", "*.yaml"), recursive=True):
    with open(path) as f:
        docs = list(yaml.safe_load_all(f))
    c.check(all(isinstance(d, dict) and ("kind" in d or "resources" in d) for d in docs),
            f"{path}: not a Kubernetes manifest or kustomization")

secrets = {n: d for (k, n), d in objects.items() if k == "Secret"}
pvcs = {n for (k, n) in objects if k == "PersistentVolumeClaim"}


def secret_keys(name):
    s = secrets.get(name, {})
    return set(s.get("stringData", {})) | set(s.get("data", {}))


def check_pod(pod, where):
    """Volumes name existing Secrets/claims and keys; mounts name volumes.
    Returns {mount path of each secret key file: (secret, key)}."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = {}
    for container in pod["containers"]:
        for mount in container.get("volumeMounts", []):
            volume = volumes.get(mount["name"])
            if not c.check(volume is not None,
                           f"{where}: mounts undefined volume {mount['name']}"):
                continue
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                c.check(name in secrets, f"{where}: uses undefined Secret {name}")
                for item in volume["secret"].get("items", []):
                    c.check(item["key"] in secret_keys(name),
                            f"{where}: Secret {name} has no key {item['key']}")
                    files[f"{mount['mountPath']}/{item['path']}"] = (name, item["key"])
                if "items" not in volume["secret"]:
                    for key in secret_keys(name):
                        files[f"{mount['mountPath']}/{key}"] = (name, key)
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                c.check(claim in pvcs, f"{where}: uses undefined claim {claim}")
    return files


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


# ---- rendezvous ------------------------------------------------------------
deploy = objects.get(("Deployment", "ddprun-rendezvous"))
service = objects.get(("Service", "ddprun-rendezvous"))
c.check(deploy and service, "k8s: Deployment and Service ddprun-rendezvous needed")
pod = deploy["spec"]["template"]
c.check(deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate",
        "k8s: the rendezvous holds state in memory: 1 replica, Recreate")
labels = pod["metadata"]["labels"]
c.check(all(labels.get(k) == v for k, v in deploy["spec"]["selector"]["matchLabels"].items()),
        "k8s: Deployment selector does not match its pod labels")
c.check(all(labels.get(k) == v for k, v in service["spec"]["selector"].items()),
        f"k8s: Service selector {service['spec']['selector']} does not match the pods {labels}")
(rdzv,) = pod["spec"]["containers"]
cmd = rdzv["command"]
c.check_command(cmd, "k8s rendezvous command")
port = int(cmd[cmd.index("--port") + 1])
ports = {p["name"]: p["containerPort"] for p in rdzv["ports"]}
c.check(port in ports.values(), f"k8s: --port {port} is not a containerPort {ports}")
for probe in ("readinessProbe", "livenessProbe"):
    grpc = rdzv.get(probe, {}).get("grpc")
    c.check(grpc is not None and grpc.get("port") == port,
            f"k8s: {probe} must be a gRPC probe on the service port {port}")
sports = {p["name"]: p for p in service["spec"]["ports"]}
sport = sports.get("grpc", {})
c.check(ports.get(sport.get("targetPort")) == port,
        f"k8s: Service port grpc targets {sport.get('targetPort')}, not the container's port {port}")
# /metrics: the flag, the container port, the Service port and the scrape
# annotations name one port.
metrics_port = int(cmd[cmd.index("--metrics-port") + 1]) if "--metrics-port" in cmd else None
c.check(metrics_port is not None and ports.get("metrics") == metrics_port,
        f"k8s: --metrics-port {metrics_port} must be the containerPort named metrics {ports.get('metrics')}")
c.check(sports.get("metrics", {}).get("targetPort") == "metrics",
        "k8s: the Service must expose the metrics port")
annotations = pod["metadata"].get("annotations", {})
c.check(annotations.get("prometheus.io/port") == str(metrics_port) and
        annotations.get("prometheus.io/path") == "/metrics",
        f"k8s: prometheus.io annotations {annotations} must name port {metrics_port}, /metrics")
files = check_pod(pod["spec"], "k8s rendezvous")
token_path = cmd[cmd.index("--token-file") + 1]
c.check(files.get(token_path, (None, None))[0] == "ddprun-token",
        f"k8s: rendezvous --token-file {token_path} is not a key of Secret ddprun-token")
c.check(secrets.get("ddprun-rendezvous-tls", {}).get("type") == "kubernetes.io/tls" and
        {"tls.crt", "tls.key"} <= secret_keys("ddprun-rendezvous-tls"),
        "k8s: the TLS Secret must be kubernetes.io/tls with tls.crt and tls.key")
endpoint = f"{service['metadata']['name']}:{sport['port']}"

# ---- agents: an Indexed Job ------------------------------------------------
jobs = [d for (k, _), d in objects.items() if k == "Job"]
c.check(len(jobs) == 1, "k8s: one agents Job expected")
job = jobs[0]
spec = job["spec"]
c.check(spec.get("completionMode") == "Indexed", "k8s: agents must be an Indexed Job")
apod = spec["template"]["spec"]
c.check(apod.get("restartPolicy") == "Never",
        "k8s: restartPolicy Never (ddprun restarts workers; podFailurePolicy needs it)")
(agent,) = apod["containers"]
env = env_of(agent)
c.check_pet_env(env, "k8s agents Job")
c.check_command(agent["command"], "k8s agents Job command")
nnodes = env.get("PET_NNODES", "")
c.check(":" in nnodes, f"k8s: PET_NNODES={nnodes} must be MIN:MAX (elastic)")
max_nodes = int(nnodes.split(":")[-1])
c.check(spec["completions"] == spec["parallelism"] == max_nodes,
        f"k8s: one pod per node: completions/parallelism {spec['completions']}/"
        f"{spec['parallelism']} must equal MAX of --nnodes {max_nodes}")
gpus = agent.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
c.check(gpus is not None and str(gpus) == env.get("PET_NPROC_PER_NODE"),
        f"k8s: nvidia.com/gpu {gpus} must equal PET_NPROC_PER_NODE "
        f"{env.get('PET_NPROC_PER_NODE')} (one worker per GPU)")
c.check(env.get("PET_RDZV_ENDPOINT") == endpoint,
        f"k8s: PET_RDZV_ENDPOINT={env.get('PET_RDZV_ENDPOINT')}, the Service is {endpoint}")
afiles = check_pod(apod, "k8s agents Job")
c.check(afiles.get(env.get("PET_TOKEN_FILE"), (None,))[0] == "ddprun-token",
        f"k8s: PET_TOKEN_FILE={env.get('PET_TOKEN_FILE')} is not the token Secret's file")
rules = spec.get("podFailurePolicy", {}).get("rules", [])
fail_rule = [r for r in rules if r["action"] == "FailJob" and "onExitCodes" in r]
c.check(fail_rule and fail_rule[0]["onExitCodes"]["containerName"] == agent["name"] and
        fail_rule[0]["onExitCodes"]["operator"] == "NotIn" and
        fail_rule[0]["onExitCodes"]["values"] == [0],
        "k8s: a non-zero exit of ddprun (restarts exhausted) must fail the Job, not retry")
c.check(any(r["action"] == "Ignore" and
            {"type": "DisruptionTarget"} in r.get("onPodConditions", []) for r in rules),
        "k8s: a pod lost to a disruption must be replaced without counting as a failure")
c.check(apod.get("terminationGracePeriodSeconds", 30) >= 30,
        "k8s: ddprun needs time to stop its workers in two phases")
c.check(agent["image"] == rdzv["image"], "k8s: agents and rendezvous use different images")
# The pods run as the image's own user (deploy/docker/Dockerfile's useradd).
with open(c.path("deploy", "docker", "Dockerfile")) as f:
    uid = re.search(r"useradd .*--uid (\d+)", f.read())
for name, spec in (("rendezvous", pod["spec"]), ("agents", apod)):
    ctx = spec.get("securityContext", {})
    c.check(uid and ctx.get("runAsUser") == int(uid.group(1)) and ctx.get("runAsNonRoot"),
            f"k8s {name}: runAsUser {ctx.get('runAsUser')} must be the image's user "
            f"{uid.group(1) if uid else '?'} (non-root)")
c.check(apod.get("securityContext", {}).get("fsGroup") == apod["securityContext"].get("runAsUser"),
        "k8s agents: fsGroup must let the image's user write the data volume")

# ---- the Kubeflow PyTorchJob example ---------------------------------------
(ptj,) = c.load_yaml("deploy", "k8s", "examples", "pytorchjob.yaml")
c.check(ptj["kind"] == "PyTorchJob" and ptj["apiVersion"] == "kubeflow.org/v1",
        "PyTorchJob example: kind/apiVersion")
for role, replica in ptj["spec"]["pytorchReplicaSpecs"].items():
    (container,) = replica["template"]["spec"]["containers"]
    c.check(container["name"] == "pytorch",
            f"PyTorchJob {role}: the training operator needs the container named pytorch")
    penv = env_of(container)
    c.check_pet_env(penv, f"PyTorchJob {role}")
    c.check_command(container["command"], f"PyTorchJob {role} command")
    c.check(penv.get("PET_RDZV_ENDPOINT") == endpoint,
            f"PyTorchJob {role}: PET_RDZV_ENDPOINT must be the rendezvous Service {endpoint}")
    pfiles = check_pod(replica["template"]["spec"], f"PyTorchJob {role}")
    c.check(penv.get("PET_TOKEN_FILE") in pfiles, f"PyTorchJob {role}: token file not mounted")
    limits = container.get("resources", {}).get("limits", {})
    c.check(str(limits.get("nvidia.com/gpu")) == ptj["spec"]["nprocPerNode"],
            f"PyTorchJob {role}: GPUs must equal nprocPerNode")

# ---- kustomize build (when kubectl is here) ---------------------------------
kubectl = shutil.which("kubectl")
if kubectl:
    for target in ("base", "overlays/tls"):
        run = subprocess.run([kubectl, "kustomize", os.path.join(k8s, target)],
                             capture_output=True, text=True, timeout=60)
        if c.check(run.returncode == 0, f"kubectl kustomize {target}: {run.stderr}"):
            built = list(yaml.safe_load_all(run.stdout))
            c.check(len(built) == len(objects), f"kustomize {target}: object count")
            c.check(all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ddprun"
                        for d in built), f"kustomize {target}: part-of label missing")
            if target == "overlays/tls":
                (d,) = [d for d in built if d["kind"] == "Deployment"]
                (ct,) = d["spec"]["template"]["spec"]["containers"]
                c.check(ct["readinessProbe"].get("tcpSocket", {}).get("port") == port,
                        "TLS overlay: the probe must move to TCP on the service port")
                c.check_command(ct["command"], "TLS overlay rendezvous command")
                tls_files = check_pod(d["spec"]["template"]["spec"], "TLS overlay rendezvous")
                for flag, key in (("--tls-cert-file", "tls.crt"), ("--tls-key-file", "tls.key")):
                    paths = [t.split("=", 1)[1] for t in ct["command"] if t.startswith(flag + "=")]
                    c.check(paths and tls_files.get(paths[0]) == ("ddprun-rendezvous-tls", key),
                            f"TLS overlay: {flag} must name {key} of the TLS Secret")
                (j,) = [d for d in built if d["kind"] == "Job"]
                (jc,) = j["spec"]["template"]["spec"]["containers"]
                jenv = env_of(jc)
                c.check_pet_env(jenv, "TLS overlay agents Job")
                ca_files = check_pod(j["spec"]["template"]["spec"], "TLS overlay agents Job")
                c.check(ca_files.get(jenv.get("PET_TLS_CA_FILE")) == ("ddprun-ca", "ca.crt"),
                        "TLS overlay: agents' PET_TLS_CA_FILE must be ca.crt of Secret ddprun-ca")
print("kubectl kustomize:", "checked" if kubectl else "not installed, skipped")
c.finish()
