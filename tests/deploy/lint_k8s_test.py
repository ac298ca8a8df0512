"""Lints deploy/k8s: parses every manifest and checks what ties them
together (names, labels, ports, probe port, secrets and their keys, the
Indexed Job's size against --nnodes and GPUs against --nproc-per-node), and
the commands and PET_* variables against the real programs. No manifest
carries a Secret: every Secret a pod mounts, with its keys, is one that the
README's `kubectl create secret` commands make. `kubectl kustomize` must
build the base and every overlay (kubectl is required: scripts/setup.sh
installs Debian's kubernetes-client)."""

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

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
    c.check(all(isinstance(d, dict) and ("kind" in d or "resources" in d or "bases" in d) or
                # An overlay's JSON patch (patchesJson6902).
                isinstance(d, list) and all({"op", "path"} <= set(op) for op in d)
                for d in docs),
            f"{path}: not a Kubernetes manifest, kustomization or JSON patch")

# No Secret in any manifest: a placeholder would replace the real Secret on
# every `kubectl apply -k` (and a server would accept a token printed here).
for path in glob.glob(os.path.join(k8s, "**", "*.yaml"), recursive=True):
    with open(path) as f:
        text = f.read()
    c.check(not any(isinstance(d, dict) and d.get("kind") == "Secret"
                    for d in yaml.safe_load_all(text)),
            f"{path}: holds a Secret; the README's `kubectl create secret` makes it")
    c.check("REPLACE-WITH" not in text, f"{path}: holds a placeholder secret")
    with open(path) as f:
        kustomization = yaml.safe_load(f) if path.endswith("kustomization.yaml") else {}
    c.check(not (kustomization or {}).get("secretGenerator"),
            f"{path}: a secretGenerator in the repository is a shared secret")


def readme_secrets():
    """{name: {"type": type, "keys": set}} of every `kubectl create secret`
    command in the Kubernetes section of the deploy README (deploy/README.md,
    where the README's cluster how-tos live)."""
    with open(c.path("deploy/README.md")) as f:
        readme = f.read()
    section = readme.split("## Kubernetes", 1)[-1].split("\n## ", 1)[0]
    made = {}
    for line in section.splitlines():
        if not line.startswith("kubectl create secret "):
            continue
        words = shlex.split(line, comments=True)
        kind, name, options = words[3], words[4], words[5:]
        keys = set()
        if kind == "tls":
            keys = {"tls.crt", "tls.key"}
            c.check(any(o.startswith("--cert=") for o in options) and
                    any(o.startswith("--key=") for o in options),
                    f"README: {line}: needs --cert= and --key=")
        for option in options:
            for flag in ("--from-literal=", "--from-file="):
                if option.startswith(flag):
                    value = option[len(flag):]
                    key = value.split("=", 1)[0] if "=" in value else os.path.basename(value)
                    keys.add(key)
        made[name] = {"type": {"tls": "kubernetes.io/tls"}.get(kind, "Opaque"), "keys": keys}
    return made


secrets = readme_secrets()
c.check("ddprun-token" in secrets and secrets["ddprun-token"]["keys"] == {"token"},
        f"README: no `kubectl create secret generic ddprun-token` with key token: {secrets}")
# The agents' Secret: a run id and its job token (`ddprun-rendezvous
# job-token`), never the server's own token, which user code would read.
c.check(secrets.get("ddprun-job", {}).get("keys") == {"run-id", "token"},
        f"README: no `kubectl create secret generic ddprun-job` with keys run-id and token: "
        f"{secrets}")
pvcs = {n for (k, n) in objects if k == "PersistentVolumeClaim"}


def secret_keys(name):
    return secrets.get(name, {}).get("keys", set())


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
                c.check(name in secrets, f"{where}: uses Secret {name}, which the "
                        "README's `kubectl create secret` commands do not make")
                mode = volume["secret"].get("defaultMode", 0o644)
                c.check(mode & 0o007 == 0,
                        f"{where}: Secret {name} files are readable by others "
                        f"(defaultMode {mode:o}); use 0440 with the pod's fsGroup")
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


def check_conventions(pod, where):
    """Every container: requests (cpu, memory) and a memory limit, no
    privilege escalation, no capabilities, seccompProfile RuntimeDefault
    (set on the container itself, whatever the pod says)."""
    for container in pod.get("containers", []) + pod.get("initContainers", []):
        name = f"{where} container {container['name']}"
        resources = container.get("resources", {})
        c.check({"cpu", "memory"} <= set(resources.get("requests", {})),
                f"{name}: needs cpu and memory requests (else BestEffort, evicted first)")
        c.check("memory" in resources.get("limits", {}), f"{name}: needs a memory limit")
        ctx = container.get("securityContext", {})
        c.check(ctx.get("allowPrivilegeEscalation") is False,
                f"{name}: securityContext.allowPrivilegeEscalation must be false")
        c.check(ctx.get("capabilities", {}).get("drop") == ["ALL"],
                f"{name}: securityContext.capabilities.drop must be [ALL]")
        c.check(ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault",
                f"{name}: securityContext.seccompProfile must be RuntimeDefault")
        c.check(not ctx.get("privileged") and not ctx.get("runAsUser") == 0,
                f"{name}: must not run privileged or as root")


def check_shm(pod, where):
    """/dev/shm is a memory-backed emptyDir with a size limit (the
    runtime's default is 64 MB: too small for NCCL and the shared dataset)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for container in pod["containers"]:
        mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
        empty = volumes.get(mounts[0]["name"], {}).get("emptyDir", {}) if mounts else {}
        c.check(empty.get("medium") == "Memory" and "sizeLimit" in empty,
                f"{where}: /dev/shm must be an emptyDir of medium Memory with a sizeLimit")


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def check_job_credentials(container, files, where):
    """The run id and the token file are the job Secret's pair; the server's
    token is nowhere in the pod; agents wait for the rendezvous up to the
    join timeout (read_timeout); checkpoints go to the shared claim."""
    (rdzv_id,) = [e for e in container["env"] if e["name"] == "PET_RDZV_ID"]
    ref = rdzv_id.get("valueFrom", {}).get("secretKeyRef", {})
    c.check(ref.get("name") == "ddprun-job" and ref.get("key") == "run-id",
            f"{where}: PET_RDZV_ID must come from Secret ddprun-job, key run-id "
            f"(the run id its job token admits), not {rdzv_id}")
    env = env_of(container)
    c.check(files.get(env.get("PET_TOKEN_FILE")) == ("ddprun-job", "token"),
            f"{where}: PET_TOKEN_FILE={env.get('PET_TOKEN_FILE')} must be the job token "
            "(Secret ddprun-job, key token)")
    c.check(all(secret != "ddprun-token" for secret, _ in files.values()),
            f"{where}: mounts the server's token; give the agents the job token")
    c.check("read_timeout=600" in (env.get("PET_RDZV_CONF") or ""),
            f"{where}: PET_RDZV_CONF must hold read_timeout=600: agents started before the "
            "rendezvous wait for it up to the join timeout")
    c.check(flag_value(container["command"], "--checkpoint-dir") is not None,
            f"{where}: the program needs --checkpoint-dir on the shared claim: a restart "
            "resumes from it")


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


def flag_value(argv, flag):
    """The value of `flag` in argv (`--flag V` or `--flag=V`), or None."""
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


# /metrics has no authentication: the base serves it on the pod's loopback
# (kubectl port-forward reaches it), nothing exposes it.
metrics_port = flag_value(cmd, "--metrics-port")
c.check(metrics_port is not None, "k8s: the rendezvous serves no /metrics (--metrics-port)")
c.check(flag_value(cmd, "--metrics-host") == "127.0.0.1",
        f"k8s base: --metrics-host {flag_value(cmd, '--metrics-host')} must be 127.0.0.1 "
        "(overlays/metrics opens it)")
c.check("metrics" not in ports and "metrics" not in {p["name"] for p in service["spec"]["ports"]}
        and not pod["metadata"].get("annotations"),
        "k8s base: /metrics is loopback-only; no port, Service port or scrape annotations")
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
check_job_credentials(agent, afiles, "k8s agents Job")
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
    # The Secret files (root's, mode 0440) are the user's through its group;
    # the agents' data volume is writable through it.
    c.check(ctx.get("fsGroup") == ctx.get("runAsUser"),
            f"k8s {name}: fsGroup must be the image's user's: it reads the Secret "
            "files (0440) and writes the data volume through it")

for (kind, name), d in objects.items():
    if kind in ("Deployment", "Job"):
        check_conventions(d["spec"]["template"]["spec"], f"k8s {kind} {name}")
check_shm(apod, "k8s agents Job")

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
    check_conventions(replica["template"]["spec"], f"PyTorchJob {role}")
    check_shm(replica["template"]["spec"], f"PyTorchJob {role}")
    check_job_credentials(container, pfiles, f"PyTorchJob {role}")
    # ddprun restarts its workers; the container is restarted on a non-zero
    # exit such as 75 (no rendezvous yet), bounded by runPolicy.backoffLimit.
    c.check(replica.get("restartPolicy") == "OnFailure",
            f"PyTorchJob {role}: restartPolicy OnFailure")
c.check("backoffLimit" in ptj["spec"].get("runPolicy", {}),
        "PyTorchJob: runPolicy.backoffLimit bounds the OnFailure restarts")
c.check("generateName" in ptj["metadata"] and "name" not in ptj["metadata"],
        "PyTorchJob: metadata.generateName (a new name per `kubectl create`)")

# ---- first use: an image from a registry, a claim every node can share ----
(kustomization,) = c.load_yaml("deploy", "k8s", "base", "kustomization.yaml")
(image,) = kustomization["images"]
c.check("/" in image.get("newName", ""),
        f"k8s base: image {image.get('newName')} names no registry; nodes cannot pull a "
        "local tag (write registry.example.com/ddprun and say so)")
for (kind, name), d in objects.items():
    if kind == "PersistentVolumeClaim" and "ReadWriteMany" in d["spec"]["accessModes"]:
        c.check(d["spec"].get("storageClassName"),
                f"k8s {name}: a ReadWriteMany claim needs a storageClassName that offers it "
                "(default classes are mostly ReadWriteOnce: the claim stays Pending)")

# ---- the JobSet example, against JobSet's API ------------------------------
# tests/deploy/jobset_v1alpha2_schema.json is JobSet's CRD schema
# (kubernetes-sigs/jobset config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml
# at 08dfbdfd, v0.13 development) without descriptions and CEL rules; the
# Jobs' pod templates are left to the pod checks above.
import json


def validate(value, schema, where):
    """A structural schema as the API server applies it: types, enums,
    required fields, and no unknown field (it would be pruned silently)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if schema.get("x-kubernetes-int-or-string"):
        c.check(isinstance(value, (int, str)) and not isinstance(value, bool),
                f"{where}: must be an integer or a string")
        return
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "boolean": bool,
             "integer": int, "number": (int, float)}
    if kind and not c.check(isinstance(value, types[kind]) and
                            (kind in ("boolean",) or not isinstance(value, bool)),
                            f"{where}: {value!r} is not of type {kind}"):
        return
    if "enum" in schema:
        c.check(value in schema["enum"], f"{where}: {value!r} is not one of {schema['enum']}")
    if kind == "object":
        props = schema.get("properties", {})
        for field in schema.get("required", []):
            c.check(field in value, f"{where}: required field {field} missing")
        for key, item in value.items():
            if key in props:
                validate(item, props[key], f"{where}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                validate(item, schema["additionalProperties"], f"{where}.{key}")
            elif "properties" in schema:
                c.check(False, f"{where}: unknown field {key} (the API has "
                        f"{sorted(props)})")
            # (no properties: a free-form object, as metadata)
    if kind == "array":
        if "maxItems" in schema:
            c.check(len(value) <= schema["maxItems"], f"{where}: more than "
                    f"{schema['maxItems']} items")
        for i, item in enumerate(value):
            validate(item, schema.get("items", {}), f"{where}[{i}]")


with open(c.path("tests", "deploy", "jobset_v1alpha2_schema.json")) as f:
    jobset_schema = json.load(f)
(jobset,) = c.load_yaml("deploy", "k8s", "examples", "jobset.yaml")
c.check(jobset.get("apiVersion") == "jobset.x-k8s.io/v1alpha2" and
        jobset.get("kind") == "JobSet", "JobSet example: apiVersion/kind")
validate(jobset, jobset_schema, "JobSet")
# The schema checker finds what it must: an unknown field and a bad enum.
probe = Checker("jobset_schema_probe")
saved, c.check = c.check, probe.check
validate({"spec": {"replicatedJobs": [{"name": "x", "tempalte": {}}],
                   "startupPolicy": {"startupPolicyOrder": "Sometimes"}}},
         jobset_schema, "probe")
c.check = saved
c.check(any("unknown field tempalte" in f for f in probe.failures) and
        any("'Sometimes' is not one of" in f for f in probe.failures) and
        any("required field template missing" in f for f in probe.failures),
        f"the JobSet schema check missed a defect: {probe.failures}")
jspec = jobset["spec"]
c.check(jspec.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder",
        "JobSet: startupPolicy InOrder: the agents start once the rendezvous is ready")
rjobs = {r["name"]: r for r in jspec["replicatedJobs"]}
c.check(list(rjobs) == ["rendezvous", "agents"],
        f"JobSet: replicatedJobs rendezvous, then agents (InOrder): {list(rjobs)}")
c.check(jspec.get("successPolicy", {}).get("targetReplicatedJobs") == ["agents"],
        "JobSet: the set succeeds when the agents do (the rendezvous never ends by itself)")
if "rendezvous" in rjobs and "agents" in rjobs:
    rpod = rjobs["rendezvous"]["template"]["spec"]["template"]["spec"]
    (rc,) = rpod["containers"]
    c.check_command(rc["command"], "JobSet rendezvous command")
    rfiles = check_pod(rpod, "JobSet rendezvous")
    c.check(rfiles.get(flag_value(rc["command"], "--token-file")) == ("ddprun-token", "token"),
            "JobSet rendezvous: --token-file must be the server's token Secret")
    c.check(rc.get("readinessProbe", {}).get("grpc", {}).get("port") ==
            int(flag_value(rc["command"], "--port")),
            "JobSet rendezvous: a gRPC readiness probe on its port (InOrder waits for Ready)")
    ajob = rjobs["agents"]["template"]["spec"]
    apod_js = ajob["template"]["spec"]
    (ac,) = apod_js["containers"]
    c.check_command(ac["command"], "JobSet agents command")
    jenv = env_of(ac)
    c.check_pet_env(jenv, "JobSet agents")
    jfiles = check_pod(apod_js, "JobSet agents")
    check_job_credentials(ac, jfiles, "JobSet agents")
    subdomain = jspec.get("network", {}).get("subdomain", jobset["metadata"]["name"])
    want = (f"{jobset['metadata']['name']}-rendezvous-0-0.{subdomain}:"
            f"{flag_value(rc['command'], '--port')}")
    c.check(jspec.get("network", {}).get("enableDNSHostnames") is True and
            jenv.get("PET_RDZV_ENDPOINT") == want,
            f"JobSet agents: PET_RDZV_ENDPOINT {jenv.get('PET_RDZV_ENDPOINT')} must be the "
            f"rendezvous pod's DNS name {want} (network.enableDNSHostnames)")
    c.check(ajob.get("completionMode") == "Indexed" and
            ajob.get("completions") == ajob.get("parallelism") ==
            int(jenv.get("PET_NNODES", "0:0").split(":")[-1]),
            "JobSet agents: an Indexed Job, one pod per node (MAX of PET_NNODES)")
    arules = ajob.get("podFailurePolicy", {}).get("rules", [])
    c.check([r["action"] for r in arules] == ["Ignore", "Count", "FailJob"],
            f"JobSet agents: podFailurePolicy as the base Job's: {arules}")
    c.check(jspec.get("failurePolicy", {}).get("maxRestarts", 0) == 0,
            "JobSet: ddprun restarts its workers itself; the set must not recreate its jobs")
    for name, spec in (("rendezvous", rpod), ("agents", apod_js)):
        check_conventions(spec, f"JobSet {name}")
        c.check(spec.get("restartPolicy") in ("Never", "OnFailure"),
                f"JobSet {name}: a Job's pods restart Never or OnFailure")
    check_shm(apod_js, "JobSet agents")

# ---- the Kubeflow Trainer v2 example, against the Trainer's API -------------
# tests/deploy/trainer_v1alpha1_{trainjob,trainingruntime}_schema.json are the
# Trainer's CRD schemas (kubeflow/trainer manifests/base/crds at 8c0f5059b)
# without descriptions and CEL rules; pod specs are left to the pod checks.
trainer_schemas = {}
for kind, name in (("TrainJob", "trainjob"), ("TrainingRuntime", "trainingruntime")):
    with open(c.path("tests", "deploy", f"trainer_v1alpha1_{name}_schema.json")) as f:
        trainer_schemas[kind] = json.load(f)
trainer_docs = {d["kind"]: d for d in c.load_yaml("deploy", "k8s", "examples", "trainjob.yaml")}
c.check(set(trainer_docs) == {"TrainJob", "TrainingRuntime"},
        f"Trainer example: a TrainingRuntime and a TrainJob, not {sorted(trainer_docs)}")
for kind, doc in trainer_docs.items():
    c.check(doc.get("apiVersion") == "trainer.kubeflow.org/v1alpha1",
            f"Trainer example {kind}: apiVersion {doc.get('apiVersion')}")
    if kind in trainer_schemas:
        validate(doc, trainer_schemas[kind], kind)
tj, tr = trainer_docs.get("TrainJob"), trainer_docs.get("TrainingRuntime")
if tj and tr:
    ref = tj["spec"]["runtimeRef"]
    c.check(ref.get("name") == tr["metadata"]["name"] and
            ref.get("kind") == "TrainingRuntime",
            f"TrainJob: runtimeRef {ref} must name the TrainingRuntime")
    c.check("torch" in tr["spec"].get("mlPolicy", {}),
            "TrainingRuntime: mlPolicy.torch: the Trainer then sets torchrun's PET_* variables")
    # The Trainer's torch plugin finds the container named node in the
    # replicated job labelled trainjob-ancestor-step: trainer.
    (rj,) = tr["spec"]["template"]["spec"]["replicatedJobs"]
    c.check(rj["template"]["metadata"]["labels"].get(
        "trainer.kubeflow.org/trainjob-ancestor-step") == "trainer",
        "TrainingRuntime: the replicated job needs trainjob-ancestor-step: trainer")
    tpod = rj["template"]["spec"]["template"]["spec"]
    (tc,) = tpod["containers"]
    c.check(tc["name"] == "node", "TrainingRuntime: the Trainer needs the container named node")
    trainer = tj["spec"]["trainer"]
    c.check_command(trainer["command"], "TrainJob command")
    tenv = env_of(tc)
    c.check_pet_env(tenv, "TrainingRuntime node")
    c.check(tenv.get("PET_RDZV_ENDPOINT") == endpoint,
            f"TrainingRuntime: PET_RDZV_ENDPOINT must be the rendezvous Service {endpoint}")
    tfiles = check_pod(tpod, "TrainingRuntime node")
    check_job_credentials({**tc, "command": trainer["command"]}, tfiles, "TrainingRuntime node")
    check_conventions(tpod, "TrainingRuntime node")
    check_shm(tpod, "TrainingRuntime node")
    c.check(str(tc["resources"]["limits"].get("nvidia.com/gpu")) ==
            str(trainer.get("numProcPerNode")),
            "TrainJob: numProcPerNode must equal the node's GPUs")
    trules = rj["template"]["spec"].get("podFailurePolicy", {}).get("rules", [])
    c.check([r["action"] for r in trules] == ["Ignore", "Count", "FailJob"] and
            all(r["onExitCodes"]["containerName"] == "node" for r in trules[1:]),
            f"TrainingRuntime: podFailurePolicy as the base Job's: {trules}")

# ---- kustomize: the base and every overlay build ---------------------------
kubectl = shutil.which("kubectl")
if not kubectl:
    print("FAIL: kubectl not found; apt-get install kubernetes-client "
          "(scripts/setup.sh does): the kustomizations cannot be built", file=sys.stderr)
    sys.exit(1)
overlays = sorted(os.path.relpath(os.path.dirname(p), k8s)
                  for p in glob.glob(os.path.join(k8s, "overlays", "*", "kustomization.yaml")))
c.check({"overlays/tls", "overlays/metrics"} <= set(overlays), f"k8s overlays: {overlays}")
built_targets = {}
for target in ["base"] + overlays:
    run = subprocess.run([kubectl, "kustomize", os.path.join(k8s, target)],
                         capture_output=True, text=True, timeout=60)
    if not c.check(run.returncode == 0, f"kubectl kustomize {target}: {run.stderr}"):
        continue
    built = [d for d in yaml.safe_load_all(run.stdout) if d]
    built_targets[target] = built
    c.check(all(d["metadata"].get("labels", {}).get("app.kubernetes.io/part-of") == "ddprun"
                for d in built), f"kustomize {target}: part-of label missing")
    c.check(not any(d["kind"] == "Secret" for d in built),
            f"kustomize {target}: builds a Secret (a placeholder would replace the real one)")
    c.check({(d["kind"], d["metadata"]["name"]) for d in built} >= set(objects),
            f"kustomize {target}: lacks objects of the base")
    for d in built:
        if d["kind"] in ("Deployment", "Job"):
            check_pod(d["spec"]["template"]["spec"], f"kustomize {target} {d['kind']}")
            check_conventions(d["spec"]["template"]["spec"], f"kustomize {target} {d['kind']}")

# TLS: the server's files from the TLS Secret, the agents trusting the CA.
tls = built_targets.get("overlays/tls", [])
if c.check(tls, "kustomize overlays/tls: nothing built"):
    (d,) = [d for d in tls if d["kind"] == "Deployment"]
    (ct,) = d["spec"]["template"]["spec"]["containers"]
    c.check(ct["readinessProbe"].get("tcpSocket", {}).get("port") == port,
            "TLS overlay: the probe must move to TCP on the service port")
    c.check_command(ct["command"], "TLS overlay rendezvous command")
    tls_files = check_pod(d["spec"]["template"]["spec"], "TLS overlay rendezvous")
    (tls_volume,) = [v for v in d["spec"]["template"]["spec"]["volumes"]
                     if v.get("secret", {}).get("secretName") == "ddprun-rendezvous-tls"]
    c.check(tls_volume["secret"].get("optional") is False,
            "TLS overlay: the TLS Secret must not be optional (no plaintext fallback)")
    c.check(secrets.get("ddprun-rendezvous-tls", {}).get("type") == "kubernetes.io/tls",
            "README: the TLS Secret must be made with `kubectl create secret tls`")
    for flag, key in (("--tls-cert-file", "tls.crt"), ("--tls-key-file", "tls.key")):
        path = flag_value(ct["command"], flag)
        c.check(path and tls_files.get(path) == ("ddprun-rendezvous-tls", key),
                f"TLS overlay: {flag} must name {key} of the TLS Secret")
    (j,) = [d for d in tls if d["kind"] == "Job"]
    (jc,) = j["spec"]["template"]["spec"]["containers"]
    jenv = env_of(jc)
    c.check_pet_env(jenv, "TLS overlay agents Job")
    ca_files = check_pod(j["spec"]["template"]["spec"], "TLS overlay agents Job")
    c.check(ca_files.get(jenv.get("PET_TLS_CA_FILE")) == ("ddprun-ca", "ca.crt"),
            "TLS overlay: agents' PET_TLS_CA_FILE must be ca.crt of Secret ddprun-ca")

# Metrics: the flag, the container port, the Service port, the scrape
# annotations name one port; a NetworkPolicy admits /metrics from Prometheus
# alone and gRPC from everyone.
metrics = built_targets.get("overlays/metrics", [])
if c.check(metrics, "kustomize overlays/metrics: nothing built"):
    (d,) = [d for d in metrics if d["kind"] == "Deployment"]
    mpod = d["spec"]["template"]
    (ct,) = mpod["spec"]["containers"]
    c.check_command(ct["command"], "metrics overlay rendezvous command")
    mport = int(flag_value(ct["command"], "--metrics-port"))
    c.check(flag_value(ct["command"], "--metrics-host") == "0.0.0.0",
            "metrics overlay: --metrics-host must be the pod's addresses (0.0.0.0)")
    mports = {p["name"]: p["containerPort"] for p in ct["ports"]}
    c.check(mports.get("metrics") == mport,
            f"metrics overlay: --metrics-port {mport} must be the containerPort named metrics")
    (svc,) = [d for d in metrics if d["kind"] == "Service"]
    c.check(any(p["name"] == "metrics" and p["targetPort"] == "metrics"
                for p in svc["spec"]["ports"]),
            "metrics overlay: the Service must expose the metrics port")
    annotations = mpod["metadata"].get("annotations", {})
    c.check(annotations.get("prometheus.io/port") == str(mport) and
            annotations.get("prometheus.io/path") == "/metrics",
            f"metrics overlay: prometheus.io annotations {annotations} must name "
            f"port {mport}, /metrics")
    policies = [d for d in metrics if d["kind"] == "NetworkPolicy"]
    if c.check(len(policies) == 1, "metrics overlay: one NetworkPolicy expected"):
        policy = policies[0]["spec"]
        c.check(all(mpod["metadata"]["labels"].get(k) == v
                    for k, v in policy["podSelector"]["matchLabels"].items()),
                "metrics overlay: the NetworkPolicy must select the rendezvous pods")
        rules = policy.get("ingress", [])
        open_ports = {p["port"] for r in rules if not r.get("from") for p in r["ports"]}
        c.check(open_ports == {port},
                f"metrics overlay: ports open to everyone {open_ports}, expected gRPC {port}")
        metrics_rules = [r for r in rules if any(p["port"] == mport for p in r["ports"])]
        c.check(metrics_rules and all(
            r.get("from") and all(f.get("podSelector", {}).get("matchLabels") for f in r["from"])
            for r in metrics_rules),
            "metrics overlay: /metrics must be admitted from selected (Prometheus) pods only")
print("kubectl kustomize: built", ", ".join(sorted(built_targets)))
c.finish()
