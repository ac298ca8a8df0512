#!/usr/bin/env python3
"""scripts/check-layers.py refuses each kind of include it is meant to refuse.

    tests/static/check_layers_test.py ROOT

Builds small trees in a temporary folder, one rule broken in each (an
include across the layers, a getenv in libddp, a fake of a seam outside
tests/testing/), runs the checker on them and expects exit 1 naming the file; a tree that keeps every
rule must pass. Without this, a checker that looks at no file would pass.
"""
import os
import subprocess
import sys
import tempfile

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
CHECKER = os.path.join(ROOT, "scripts", "check-layers.py")

# (file, include): each alone must fail the check.
BROKEN = [
    ("rendezvous/core/job.h", "rendezvous/service/server.h"),
    ("rendezvous/core/job.cc", "grpcpp/server_context.h"),
    ("rendezvous/core/job_table.h", "ddprun/v1/rendezvous.grpc.pb.h"),
    ("rendezvous/service/server.h", "rendezvous/main.h"),
    ("rendezvous/core/job.h", "launcher/cli/flags.h"),
    ("common/clock.h", "rendezvous/core/job.h"),
    ("launcher/posix/spawn.h", "launcher/agent/agent.h"),
    ("launcher/agent/agent.h", "launcher/cli/flags.h"),
    ("rendezvous/core/job.cc", "torch/torch.h"),
    ("relay/relay.h", "rendezvous/core/job.h"),
]
# (file, line): each alone must fail the check (the rules beyond includes).
BROKEN_LINES = [
    ("worker/ddp.cc", 'const char* v = std::getenv("RANK");'),
    ("worker/process_group.cc", "if (getenv(\"X\")) {}"),
    ("tests/launcher/agent_test.cc",
     "class MyFake final : public launcher::RendezvousApi {"),
    ("tests/rendezvous/job_test.cc",
     "class StepClock : public common::Clock {"),
    ("tests/launcher/group_test.cc",
     "class Spawner : public ProcessControl {"),
]
# Lines the rules allow.
ALLOWED_LINES = [
    ("worker/worker_env.cc", 'const char* v = std::getenv("RANK");'),
    ("worker/ddp.cc", "// no getenv( here: WorkerEnv has it"),
    ("tests/testing/fake_rendezvous.h",
     "class FakeRendezvous final : public launcher::RendezvousApi {"),
    ("tests/launcher/agent_test.cc",
     "class Control final : public ::ddprun::testing::FakeProcessControl {"),
]
# Includes each rule allows.
ALLOWED = [
    ("rendezvous/core/job.h", "common/clock.h"),
    ("rendezvous/core/job.h", "ddprun/v1/rendezvous.pb.h"),
    ("rendezvous/service/server.h", "rendezvous/core/job_table.h"),
    ("rendezvous/service/server.h", "grpcpp/server.h"),
    ("rendezvous/main.cc", "rendezvous/service/server_flags.h"),
    ("launcher/cli/launch.cc", "rendezvous/service/server.h"),
]


def includes(files):
    return [(path, f'#include "{include}"') for path, include in files]


def run(files):
    """files: (path, line) pairs, written into a fresh tree."""
    with tempfile.TemporaryDirectory() as root:
        for path, line in files:
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        return subprocess.run([sys.executable, CHECKER, root],
                              capture_output=True, text=True)


def main():
    failures = []
    allowed = includes(ALLOWED) + ALLOWED_LINES
    ok = run(allowed)
    if ok.returncode != 0:
        failures.append(f"allowed lines refused:\n{ok.stderr}")
    for path, line in includes(BROKEN) + BROKEN_LINES:
        result = run(allowed + [(path, line)])
        if result.returncode != 1 or f"{path}:" not in result.stderr:
            failures.append(f"{path} with '{line}' passed "
                            f"(rc {result.returncode}):\n{result.stdout}"
                            f"{result.stderr}")
    real = subprocess.run([sys.executable, CHECKER, ROOT],
                          capture_output=True, text=True)
    if real.returncode != 0:
        failures.append(f"the tree itself breaks the layers:\n{real.stderr}")
    elif "rendezvous/core/" not in real.stdout:
        failures.append("the checker did not read rendezvous/core/")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    print(f"{len(BROKEN) + len(BROKEN_LINES)} broken trees refused, "
          f"allowed tree passed"
          if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
