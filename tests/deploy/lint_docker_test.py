"""Lints deploy/docker: the Dockerfile's stages and build argument, and the
compose file's services, ports, secrets and commands, against each other and
against the real programs."""

import json
import os
import re
import shlex
import subprocess

from deploy_lint import Checker

c = Checker("lint_docker")
docker_dir = c.path("deploy", "docker")


def dockerfile_instructions(path):
    with open(path) as f:
        text = re.sub(r"\\\n", " ", f.read())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            yield op.upper(), rest.strip()


global_args, stages, current = {}, {}, None
for op, rest in dockerfile_instructions(os.path.join(docker_dir, "Dockerfile")):
    if op == "ARG" and current is None:
        name, _, default = rest.partition("=")
        global_args[name] = default
    elif op == "FROM":
        m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
        c.check(m and m.group(2), f"Dockerfile: unnamed stage FROM {rest}")
        current = {"base": m.group(1), "body": []}
        stages[m.group(2)] = current
    elif current is not None:
        current["body"].append((op, rest))

c.check(global_args.get("TORCH") == "debian",
        "Dockerfile: ARG TORCH must default to debian (Debian's LibTorch)")
c.check("LIBTORCH_URL" in global_args, "Dockerfile: ARG LIBTORCH_URL missing")
# The CUDA toolkit installed for the build must match the LibTorch archive.
cu = re.search(r"/cu(\d+)(\d)/", global_args.get("LIBTORCH_URL", ""))
c.check(cu is not None and global_args.get("CUDA_VERSION") == f"{cu.group(1)}-{cu.group(2)}",
        f"Dockerfile: CUDA_VERSION {global_args.get('CUDA_VERSION')} does not match "
        f"LIBTORCH_URL {global_args.get('LIBTORCH_URL')}")
# Both values of TORCH must resolve to a chain of defined stages, and the
# final stage must be the slim runtime.
for torch in ("debian", "cuda"):
    def resolve(base):
        return base.replace("${TORCH}", torch)
    for name, stage in stages.items():
        base = resolve(stage["base"])
        if "$" not in base and ":" not in base and base != "scratch":
            c.check(base in stages and list(stages).index(base) < list(stages).index(name),
                    f"Dockerfile (TORCH={torch}): stage {name} is FROM {base}, "
                    "which is no earlier stage")
    c.check(f"torch-{torch}" in stages and f"runtime-{torch}" in stages,
            f"Dockerfile: stages torch-{torch} and runtime-{torch} needed for TORCH={torch}")
c.check(list(stages)[-1] == "runtime", "Dockerfile: the last stage must be 'runtime'")
c.check(global_args.get("RUNTIME_IMAGE", "").endswith("-slim"),
        "Dockerfile: the runtime stage must start from a slim image")
c.check(stages.get("runtime-debian", {}).get("base") == "${RUNTIME_IMAGE}",
        "Dockerfile: runtime-debian must be FROM ${RUNTIME_IMAGE}")
for name, stage in stages.items():
    for op, rest in stage["body"]:
        m = re.search(r"--from=(\S+)", rest)
        if op == "COPY" and m:
            c.check(m.group(1) in stages, f"Dockerfile: {name} copies from unknown stage {m.group(1)}")

# Every download is checked before it is used: a file by its SHA-256, a
# repository key by its full fingerprint.
for name, stage in stages.items():
    for op, rest in stage["body"]:
        if op == "RUN" and re.search(r"(^|&&|;|\|\|)\s*(curl|wget)\s", rest):
            c.check("sha256sum -c" in rest or
                    ("--show-keys" in rest and "FINGERPRINT" in rest),
                    f"Dockerfile stage {name}: a download without a checksum or "
                    f"fingerprint check: {rest[:120]}...")
c.check(re.fullmatch(r"[0-9a-f]{64}", global_args.get("LIBTORCH_SHA256", "")) is not None,
        "Dockerfile: ARG LIBTORCH_SHA256 must default to the archive's SHA-256")
c.check(re.fullmatch(r"[0-9A-F]{40}", global_args.get("CUDA_REPO_KEY_FINGERPRINT", "")) is not None,
        "Dockerfile: ARG CUDA_REPO_KEY_FINGERPRINT must be a full (40 hex digit) fingerprint")

build_runs = " ".join(r for op, r in stages.get("build", {"body": []})["body"] if op == "RUN")
c.check("cpack -G DEB" in build_runs, "Dockerfile: the build stage must make the .deb with cpack")
# The launcher stage: the three self-contained programs alone, from scratch,
# for `COPY --from=... / /usr/local/bin/` into any image.
launcher = stages.get("launcher", {"base": None, "body": []})
c.check(launcher["base"] == "scratch" and
        [op for op, _ in launcher["body"]] == ["COPY"] and
        all(f"/{p}" in build_runs.replace("${p##*/}", p) or p in build_runs
            for p in ("ddprun", "ddprun-rendezvous", "ddprun-relay")),
        "Dockerfile: a stage 'launcher' FROM scratch must only COPY ddprun, "
        "ddprun-rendezvous and ddprun-relay from the build")
runtime_runs = " ".join(r for op, r in stages.get("runtime-debian", {"body": []})["body"])
c.check("ddprun_*.deb" in runtime_runs, "Dockerfile: runtime-debian must apt install the ddprun .deb")
# Every CMake option the Dockerfile sets exists in the project.
cmake_text = ""
for root, _, files in os.walk(c.source_dir):
    if "/build" in root or "/.git" in root:
        continue
    for f in files:
        if f == "CMakeLists.txt" or f.endswith(".cmake"):
            with open(os.path.join(root, f)) as fh:
                cmake_text += fh.read()
with open(os.path.join(docker_dir, "Dockerfile")) as f:
    for option in set(re.findall(r"-D(DDPRUN_[A-Z_]+)=", f.read())):
        c.check(re.search(r"option\(\s*" + option + r"\b", cmake_text) is not None,
                f"Dockerfile sets -D{option}, which no CMake file declares")

# The build stage installs every library package scripts/setup.sh installs
# (one list of build dependencies, two places that must agree).
with open(c.path("scripts", "setup.sh")) as f:
    setup = f.read()
setup_packages = set(re.findall(r"\b(lib[a-z0-9+.-]+-dev|protobuf-compiler(?:-grpc)?)\b",
                                setup.split("packages=(", 1)[1].split(")", 1)[0]))
docker_packages = set()
for name in ("toolchain", "torch-debian"):
    for op, rest in stages.get(name, {"body": []})["body"]:
        if op == "RUN":
            docker_packages |= set(rest.split())
# Test-only packages stay out: the image is built with DDPRUN_BUILD_TESTS=OFF.
missing = sorted(setup_packages - docker_packages - {"libgtest-dev", "libgmock-dev"})
c.check(not missing, f"Dockerfile build stages lack packages that setup.sh installs: {missing}")

runtime = dict()
for op, rest in stages["runtime"]["body"]:
    runtime.setdefault(op, []).append(rest)
exposed = {int(p.split("/")[0]) for e in runtime.get("EXPOSE", []) for p in e.split()}
cmd = runtime.get("CMD", ["[]"])[-1]
c.check_command(json.loads(cmd), "Dockerfile CMD")
with open(os.path.join(docker_dir, "Dockerfile.dockerignore")) as f:
    ignore = f.read().split()
c.check("build*/" in ignore and ".git/" in ignore,
        "Dockerfile.dockerignore must keep build trees and .git out of the context")

# ---- compose ----------------------------------------------------------------
(compose,) = c.load_yaml("deploy", "docker", "compose.yaml")
services = compose.get("services", {})
c.check("rendezvous" in services, "compose: no rendezvous service")
agents = {n: s for n, s in services.items() if n.startswith("agent")}
c.check(len(agents) == 2, f"compose: expected two agents, found {sorted(agents)}")
rdzv = services.get("rendezvous", {})
build = rdzv.get("build", {})
context = os.path.normpath(os.path.join(docker_dir, build.get("context", ".")))
c.check(context == os.path.normpath(c.source_dir),
        f"compose: build context {context} is not the repository root")
c.check(os.path.isfile(os.path.join(context, build.get("dockerfile", "Dockerfile"))),
        f"compose: dockerfile {build.get('dockerfile')} not found under the context")
c.check(build.get("args", {}).get("TORCH") in ("debian", "cuda"),
        "compose: build arg TORCH must be debian or cuda")

rcmd = rdzv.get("command", [])
c.check_command(rcmd, "compose rendezvous command")
port = int(rcmd[rcmd.index("--port") + 1]) if "--port" in rcmd else None
c.check(port in exposed, f"compose: rendezvous port {port} is not EXPOSEd by the image ({exposed})")
published = [str(p) for p in rdzv.get("ports", [])]
c.check(any(p.split(":")[-1] == str(port) for p in published),
        f"compose: rendezvous publishes {published}, not its --port {port}")
metrics_port = int(rcmd[rcmd.index("--metrics-port") + 1]) if "--metrics-port" in rcmd else None
c.check(metrics_port in exposed and
        any(p.split(":")[-1] == str(metrics_port) for p in published),
        f"compose: --metrics-port {metrics_port} must be EXPOSEd ({exposed}) and published ({published})")
# /metrics has no authentication: loopback unless told otherwise, and never
# published beyond the Docker host's loopback.
metrics_host = rcmd[rcmd.index("--metrics-host") + 1] if "--metrics-host" in rcmd else None
c.check(metrics_host == "${DDPRUN_METRICS_HOST:-127.0.0.1}",
        f"compose: --metrics-host {metrics_host} must default to 127.0.0.1")
c.check(all(p.startswith("127.0.0.1:") for p in published
            if p.split(":")[-1] == str(metrics_port)),
        f"compose: the metrics port must be published on 127.0.0.1 only ({published})")
# No secret in the repository: compose's secret files are ignored by git.
with open(c.path(".gitignore")) as f:
    gitignore = f.read().split()
secrets = compose.get("secrets", {})


def check_secrets(name, service, argv):
    for s in service.get("secrets", []):
        c.check(s in secrets, f"compose: {name} uses undefined secret {s}")
    for i, token in enumerate(argv):
        if token == "--token-file":
            path = argv[i + 1]
            c.check(path.startswith("/run/secrets/") and
                    path.rsplit("/", 1)[1] in service.get("secrets", []),
                    f"compose: {name} reads {path}, which is not one of its secrets")


check_secrets("rendezvous", rdzv, rcmd)
for secret_name, secret in secrets.items():
    path = os.path.relpath(os.path.normpath(os.path.join(docker_dir, secret["file"])),
                           c.source_dir)
    c.check(path in ignore, f"compose secret {secret_name} ({path}) is not in "
            "Dockerfile.dockerignore: `COPY . /src` would put it in the image")
    c.check("/" + path in gitignore, f"compose secret {secret_name} ({path}) is not in "
            ".gitignore: a committed token is everyone's")
    tracked = subprocess.run(["git", "-C", c.source_dir, "ls-files", "--error-unmatch", path],
                             capture_output=True)
    c.check(tracked.returncode != 0, f"compose secret {secret_name}: {path} is in git")
health = rdzv.get("healthcheck", {}).get("test", [])
c.check(health[:1] == ["CMD"], "compose: rendezvous healthcheck must be exec form")
c.check_command(health[1:], "compose rendezvous healthcheck")
check_secrets("rendezvous healthcheck", rdzv, health)
c.check(f"localhost:{port}" in health, "compose: healthcheck must dial the rendezvous port")

for name, agent in agents.items():
    env = agent.get("environment", {})
    c.check_pet_env(env, f"compose {name}")
    c.check(env.get("PET_RDZV_ENDPOINT") == f"rendezvous:{port}",
            f"compose: {name} PET_RDZV_ENDPOINT={env.get('PET_RDZV_ENDPOINT')}, "
            f"the rendezvous is rendezvous:{port}")
    c.check(env.get("PET_NNODES") == str(len(agents)),
            f"compose: {name} PET_NNODES={env.get('PET_NNODES')} but {len(agents)} agents")
    c.check_command(agent.get("command", []), f"compose {name} command")
    # A job token, never the server's: the job-token service writes it, for
    # this run id, into a volume the agent mounts read-only.
    c.check(not agent.get("secrets"), f"compose: {name} must not get the server's token")
    jt = services.get("job-token", {})
    jt_cmd = shlex.split(jt.get("command", ["", "", ""])[2]) if jt.get("command") else []
    if c.binaries.get("ddprun-rendezvous") and jt_cmd[3:5] == ["ddprun-rendezvous",
                                                                "job-token"]:
        usage = subprocess.run([c.binaries["ddprun-rendezvous"], "job-token", "--help"],
                               capture_output=True, text=True, timeout=60).stdout
        for word in jt_cmd[5:-2]:
            if word.startswith("-"):
                c.check(word in usage, f"compose job-token: {word} is not a flag of "
                        "`ddprun-rendezvous job-token`")
    c.check(jt_cmd[:3] == ["umask", "077", "&&"] and "job-token" in jt_cmd and
            jt_cmd[jt_cmd.index("--run-id") + 1] == env.get("PET_RDZV_ID") and
            jt_cmd[-2:] == [">", env.get("PET_TOKEN_FILE")],
            f"compose: the job-token service must write the job token of run id "
            f"{env.get('PET_RDZV_ID')} to {env.get('PET_TOKEN_FILE')} (umask 077): {jt_cmd}")
    check_secrets("job-token", jt, jt_cmd)
    token_dir = os.path.dirname(env.get("PET_TOKEN_FILE", "/x/y"))
    c.check(f"job-token:{token_dir}:ro" in agent.get("volumes", []) and
            f"job-token:{token_dir}" in jt.get("volumes", []),
            f"compose: {name} must mount the job-token volume at {token_dir} read-only")
    c.check(agent.get("depends_on", {}).get("job-token", {}).get("condition") ==
            "service_completed_successfully",
            f"compose: {name} must wait for its job token")
    cond = agent.get("depends_on", {}).get("rendezvous", {}).get("condition")
    c.check(cond == "service_healthy", f"compose: {name} must wait for a healthy rendezvous")
    c.check(agent.get("image") == rdzv.get("image"), f"compose: {name} uses another image")
    for volume in agent.get("volumes", []):
        host = volume.split(":")[0]
        if host.startswith("."):
            c.check(os.path.normpath(os.path.join(docker_dir, host)) ==
                    c.path("data", "mnist"),
                    f"compose: {name} mounts {host}, not the repository's data/mnist")
    c.check("/data/mnist" in shlex.join(agent.get("command", [])),
            f"compose: {name} must train on the mounted /data/mnist")

c.finish()
