#!/usr/bin/python3
"""A Python program that reports with ddprun's module has its hang found as
quickly as a libddp program's.

Each program runs alone under `ddprun --standalone` with one fixed step
bound (--hang-bound step=BOUND_S) and hangs the same way, without a signal:
after each step it appends "<step> <unix microseconds> <pid>" to a FIFO
(ddprun-mnist's --step-times; tests/launcher/step_then_block.py for the
Python program, which reports with `import ddprun.progress`). The test
reads the FIFO until the program has stepped a while, then stops reading:
the next write that finds the pipe full blocks, and the program hangs in
its step phase, alive and not stopped, as a deadlocked program does.

From the last step the FIFO holds to the agent's "is hung" line (its JSON
log's time), each program must be found no sooner than the bound and
within twice the bound, in phase step, and the two delays may differ by no
more than the bound. The log line and the FIFO are stamped by the same
clock (CLOCK_REALTIME) on this machine.

usage: hang_parity_test.py --ddprun BIN --mnist BIN --data-dir DIR
"""

import argparse
import datetime
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "testing"))
from waits import wait_for  # noqa: E402

BOUND_S = 2.0
# Steps read before the test stops reading: the program is well into its
# step phase, past the first step's own bound.
STEPS_BEFORE_HANG = 50
# The smallest pipe Linux makes (one page): the program blocks within a
# hundred or so steps of the test's last read.
PIPE_BYTES = 4096
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

ARGS = None


def log_time(text):
    """Unix seconds of a JSON log line's "time" (UTC, milliseconds)."""
    stamp = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    return stamp.replace(tzinfo=datetime.timezone.utc).timestamp()


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def hung_lines(err_path):
    found = []
    with open(err_path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("program") == "ddprun" and \
                    "is hung" in record.get("message", ""):
                found.append(record)
    return found


class Lines:
    """The FIFO's reader: whole lines, read without blocking."""

    def __init__(self, fd):
        self.fd = fd
        self.pending = b""
        self.lines = []

    def drain(self):
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            self.pending += chunk
            *whole, self.pending = self.pending.split(b"\n")
            self.lines.extend(whole)


def hang_delay(name, program, tmp):
    """Runs `program` (argv, its FIFO as {fifo}) under ddprun, hangs it by
    no longer reading its FIFO and returns (seconds from its last step to
    "is hung", the agent's message, the agent's stderr)."""
    fifo = os.path.join(tmp, name + ".fifo")
    os.mkfifo(fifo)
    # The reader first, so that the program's open for writing returns.
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
    err_path = os.path.join(tmp, name + ".err")
    env = dict(os.environ, DDPRUN_LOG_FORMAT="json", OMP_NUM_THREADS="1")
    argv = [ARGS.ddprun, "--standalone", "--nproc-per-node", "1",
            "--max-restarts", "0", "--hang-bound", "step=%g" % BOUND_S] + \
        [a.replace("{fifo}", fifo) for a in program]
    with open(err_path, "w") as err:
        agent = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err,
                                 env=env, cwd=tmp, start_new_session=True)
    lines = Lines(fd)
    try:
        def stepped():
            lines.drain()
            return len(lines.lines) >= STEPS_BEFORE_HANG or \
                agent.poll() is not None
        if not wait_for(stepped, 120, poll_s=0.01) or agent.poll() is not None:
            raise AssertionError("%s did not step %d times:\n%s" % (
                name, STEPS_BEFORE_HANG, read(err_path)))
        # From here on nobody reads: the program blocks once the pipe is
        # full, and the agent finds it hung BOUND_S later.
        try:
            agent.wait(timeout=60 + 10 * BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError("%s: ddprun did not end:\n%s" % (
                name, read(err_path)))
        lines.drain()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
        os.close(fd)
    err_text = read(err_path)
    if agent.returncode != 1:
        raise AssertionError("%s: ddprun exited %s, not 1:\n%s" % (
            name, agent.returncode, err_text))
    hung = hung_lines(err_path)
    if not hung:
        raise AssertionError("%s: no 'is hung' line:\n%s" % (name, err_text))
    last_step_s = int(lines.lines[-1].split()[1]) / 1e6
    return log_time(hung[0]["time"]) - last_step_s, hung[0]["message"], \
        err_text


class HangParityTest(unittest.TestCase):
    def test_python_hang_is_found_as_quickly_as_libddp(self):
        programs = {
            "libddp": [ARGS.mnist, "--data-dir", ARGS.data_dir, "--epochs",
                       "100", "--save", "", "--no-progress", "--step-times",
                       "{fifo}"],
            "python": [os.path.join(HERE, "step_then_block.py"), "{fifo}"],
        }
        delays = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name, program in programs.items():
                delay, message, err = hang_delay(name, program, tmp)
                print("%s: found hung %.3f s after its last step (bound "
                      "%.1f s): %s" % (name, delay, BOUND_S, message),
                      flush=True)
                self.assertIn("in phase step", message, err)
                # Not before the bound: the silence is what was judged.
                self.assertGreaterEqual(delay, BOUND_S - 0.01, err)
                self.assertLessEqual(delay, 2 * BOUND_S, err)
                delays[name] = delay
        self.assertLessEqual(abs(delays["python"] - delays["libddp"]),
                             BOUND_S, delays)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--mnist", required=True)
    parser.add_argument("--data-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    # The agents run in a temporary folder.
    for key in ("ddprun", "mnist", "data_dir"):
        setattr(ARGS, key, os.path.abspath(getattr(ARGS, key)))
    unittest.main(argv=[sys.argv[0]] + rest)
