#!/usr/bin/env python3
"""Checks that every folder includes only from the layers below it.

    scripts/check-layers.py [ROOT]

Each production folder's .h and .cc files may include the project's headers
of the folders ALLOWED names for it, and no other: a lower layer never
includes a higher one. Headers outside the project (absl/, grpcpp/, the
generated ddprun/v1/ protocol, ...) are not layers and are not checked,
except LibTorch's, which only worker/ and mnist/ may include, and those
FORBIDDEN names for a folder (gRPC for rendezvous/core, the deciders that
the gRPC adapters of rendezvous/service wrap). Exits 1,
listing each include that breaks a rule as FILE:LINE, and prints one line
per folder otherwise. The layering of docs/ARCHITECTURE.md, checked.

Two more rules of that document are checked here too: in libddp (worker/)
only GETENV_READERS call getenv, and the fakes of the SEAMS interfaces live
in tests/testing/ alone (a test extends the shared fake, it does not write
its own).
"""
import os
import re
import sys

# folder -> the project folders its files may include (itself included).
ALLOWED = {
    "common": {"common"},
    "launcher/posix": {"common", "launcher/posix"},
    "launcher/agent": {"common", "launcher/posix", "launcher/agent"},
    # --standalone runs the rendezvous server in-process.
    "launcher/cli": {"common", "launcher/posix", "launcher/agent",
                     "launcher/cli", "rendezvous/core", "rendezvous/service"},
    # The deciders: plain classes on an injected clock.
    "rendezvous/core": {"common", "rendezvous/core"},
    # The gRPC adapters over them.
    "rendezvous/service": {"common", "rendezvous/core", "rendezvous/service"},
    # main.cc of ddprun-rendezvous.
    "rendezvous": {"common", "rendezvous/core", "rendezvous/service",
                   "rendezvous"},
    # The relay holds no job state: it never includes rendezvous/.
    "relay": {"common", "relay"},
    "worker": {"common", "worker"},
    "mnist": {"common", "worker", "mnist"},
}
# The project's top-level folders: an include starting with one of these is
# a project header.
PROJECT = {"common", "launcher", "rendezvous", "relay", "worker", "mnist",
           "tests", "bench", "deploy", "examples"}
# folder -> (pattern of outside headers it must not include, why).
FORBIDDEN = {
    "rendezvous/core": (
        re.compile(r"^(grpcpp|grpc|grpc\+\+)/|\.grpc\.pb\.h$"),
        "rendezvous/core/ holds no gRPC (its adapters live in "
        "rendezvous/service/)"),
}
# Folders whose subfolders are layers of their own.
SPLIT = {"launcher", "rendezvous"}
# worker/: the files that may read the environment. worker_env.cc is the
# reader; standby.cc names a prewarmed process (ps shows "ddprun-zygote")
# in a static initialiser, before anything can call it.
# (malloc_tuning.cc reads the process's own malloc settings, GLIBC_TUNABLES,
# MALLOC_*_ and LD_PRELOAD, which no worker environment carries.)
GETENV_READERS = {"worker/worker_env.cc", "worker/standby.cc",
                  "worker/malloc_tuning.cc"}
GETENV = re.compile(r"\bgetenv\s*\(")
# The seams' interfaces: a test's class that implements one outside
# tests/testing/ is a second fake of it.
SEAMS = re.compile(r":\s*public\s+(?:[\w:]*::)?(RendezvousApi|ProcessControl|"
                   r"Clock)\b")
TORCH = re.compile(r"^(torch|ATen|c10|caffe2)/")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


def layer_of(path):
    """The ALLOWED key a header path (an include) or a file belongs to."""
    parts = path.split("/")
    if parts[0] in SPLIT and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..")
    broken = []
    counts = {}
    for folder, allowed in sorted(ALLOWED.items()):
        files = 0
        for base, dirs, names in os.walk(os.path.join(root, folder)):
            rel_base = os.path.relpath(base, root)
            if rel_base != folder and layer_of(rel_base + "/x") != folder:
                dirs[:] = []
                continue
            for name in sorted(names):
                if not name.endswith((".h", ".cc", ".h.in", ".cc.in")):
                    continue
                files += 1
                rel = os.path.join(rel_base, name)
                with open(os.path.join(root, rel), encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        if (folder == "worker" and rel not in GETENV_READERS
                                and GETENV.search(line.split("//")[0])):
                            broken.append(
                                f"{rel}:{number}: calls getenv; in libddp "
                                f"only {', '.join(sorted(GETENV_READERS))} "
                                f"read the environment (WorkerEnv)")
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        if TORCH.match(target):
                            if folder not in ("worker", "mnist"):
                                broken.append(f"{rel}:{number}: includes "
                                              f"LibTorch ({target}); torch "
                                              f"stays in worker/ and mnist/")
                            continue
                        forbidden = FORBIDDEN.get(folder)
                        if forbidden and forbidden[0].search(target):
                            broken.append(f"{rel}:{number}: includes "
                                          f"{target}; {forbidden[1]}")
                            continue
                        if target.split("/")[0] not in PROJECT:
                            continue
                        layer = layer_of(target)
                        if layer not in allowed:
                            broken.append(
                                f"{rel}:{number}: includes {target}: "
                                f"{folder}/ may include only "
                                f"{', '.join(sorted(allowed))}")
        counts[folder] = files
    fakes = 0
    for base, _, names in os.walk(os.path.join(root, "tests")):
        rel_base = os.path.relpath(base, root)
        for name in sorted(names):
            if not name.endswith((".h", ".cc")):
                continue
            rel = os.path.join(rel_base, name)
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = SEAMS.search(line)
                    if not m:
                        continue
                    fakes += 1
                    if rel_base != os.path.join("tests", "testing"):
                        broken.append(
                            f"{rel}:{number}: a fake of {m.group(1)} "
                            f"outside tests/testing/; extend the shared one "
                            f"there")
    for line in broken:
        print(f"[layers] {line}", file=sys.stderr)
    if broken:
        print(f"[layers] FAIL: {len(broken)} lines break the layers "
              "(scripts/check-layers.py's ALLOWED, GETENV_READERS and "
              "SEAMS)",
              file=sys.stderr)
        return 1
    for folder, files in counts.items():
        print(f"[layers] {folder}/ ({files} files) includes only "
              f"{', '.join(sorted(ALLOWED[folder]))}")
    print(f"[layers] worker/ calls getenv only in "
          f"{', '.join(sorted(GETENV_READERS))}")
    print(f"[layers] tests/: {fakes} fakes of the seams, all in "
          f"tests/testing/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
