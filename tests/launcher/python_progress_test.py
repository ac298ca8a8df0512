"""The Python module's step records carry the rank's compute time in the
wire format of common/progress_record.h, measured by compute() blocks, by
watch() on a real DistributedDataParallel model, or given by the program."""

import os
import re
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "..", "python")
TORCH_PYTHON = os.environ.get("DDPRUN_TORCH_PYTHON", "/usr/bin/python3")

PROGRAM = r"""
import os, sys, time
import ddprun.progress as progress
progress.step()                      # the first: nothing measured yet
progress.step(compute=0.25)          # given
with progress.compute():
    time.sleep(0.05)
progress.step()                      # measured by compute()
if sys.argv[1] == "ddp":
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    # USE_LIBUV=0: Debian 13's torch 2.6 has no libuv, and env:// asks for it.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2],
                      USE_LIBUV="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = progress.watch(DDP(torch.nn.Linear(8, 2)))
    progress.step()
    for _ in range(3):
        time.sleep(0.05)             # the rank's own work
        model(torch.randn(4, 8)).sum().backward()
        progress.step()
    dist.destroy_process_group()
    # Every record is written (unbuffered). Skip the interpreter's teardown,
    # where Debian's torch 1.13 once aborted in CI ("terminate called without
    # an active exception": a thread of its own still joinable), after this
    # test's work was done.
    os._exit(0)
"""


def run(mode, python):
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, DDPRUN_PROGRESS_FD=str(write_fd),
               PYTHONPATH=PYTHON_DIR)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([python, "-c", PROGRAM, mode, str(port)], env=env,
                          pass_fds=(write_fd,), timeout=120)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        lines = f.read().decode().splitlines()
    return proc.returncode, lines


def figure(line):
    m = re.fullmatch(r"step compute=(\d+\.\d{6})", line)
    return float(m.group(1)) if m else None


class PythonProgressTest(unittest.TestCase):
    def test_compute_figures(self):
        rc, lines = run("plain", sys.executable)
        self.assertEqual(rc, 0)
        self.assertEqual(lines[0], "step")
        self.assertEqual(figure(lines[1]), 0.25)
        self.assertGreaterEqual(figure(lines[2]), 0.05)

    def test_watch_measures_ddp_steps(self):
        if not os.path.exists(TORCH_PYTHON):
            self.skipTest("no %s with torch" % TORCH_PYTHON)
        rc, lines = run("ddp", TORCH_PYTHON)
        self.assertEqual(rc, 0)
        ddp_steps = lines[4:]
        self.assertEqual(len(ddp_steps), 3, lines)
        for line in ddp_steps:
            self.assertIsNotNone(figure(line), line)
            self.assertGreaterEqual(figure(line), 0.05, line)

    def test_phases_are_the_agents_words(self):
        # The module repeats common/progress_record.cc's phase names; the
        # agent's own two ("start", "first-step") are not a program's to
        # enter. A phase added on one side only would be refused (here) or
        # read as a mere sign of life (by the agent).
        source = os.path.join(HERE, "..", "..", "common", "progress_record.cc")
        with open(source) as f:
            names = re.search(r"kNames = \{([^}]*)\}", f.read()).group(1)
        agents = re.findall(r'"([a-z-]+)"', names)
        self.assertIn("eval", agents)
        sys.path.insert(0, PYTHON_DIR)
        try:
            import ddprun.progress as progress
        finally:
            sys.path.remove(PYTHON_DIR)
        self.assertEqual(
            list(progress.PHASES),
            [n for n in agents if n not in ("start", "first-step")])


if __name__ == "__main__":
    unittest.main()
