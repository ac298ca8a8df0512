"""Reports a Python worker's progress to its ddprun agent.

One call per step gives a Python program what a libddp program has: the
agent finds it hung when it stops stepping (or stays too long in another
phase), with bounds learned from its own step times. A program that never
calls it behaves as under torchrun. Outside ddprun (no DDPRUN_PROGRESS_FD)
every call does nothing, so a script runs unchanged under torchrun or alone.

    import ddprun.progress as progress

    progress.phase("join")            # before init_process_group
    dist.init_process_group("gloo")
    progress.phase("step")            # training starts
    for batch in loader:
        ...
        optimizer.step()
        progress.step()               # one step done
        if time_to_save:
            progress.phase("checkpoint")
            torch.save(...)           # the next step() ends the phase
    progress.phase("stop")

The records are the lines of common/progress_record.h; writes never block
(the agent makes the pipe non-blocking) and never raise.
"""

import os

__all__ = ["PHASES", "phase", "step", "enabled"]

# The phases a program may enter (common/progress_record.h); "start" is
# the agent's own, from the spawn to the first record.
PHASES = ("join", "sync", "step", "checkpoint", "stop")

_ENV = "DDPRUN_PROGRESS_FD"


def _read_fd():
    try:
        fd = int(os.environ.get(_ENV, "-1"))
    except ValueError:
        return -1
    return fd if fd >= 0 else -1


_fd = _read_fd()


def enabled():
    """Whether a ddprun agent is listening (DDPRUN_PROGRESS_FD is set)."""
    return _fd >= 0


def _write(line):
    global _fd
    if _fd < 0:
        return
    try:
        os.write(_fd, line)
    except BlockingIOError:
        pass  # the agent is behind; the next record counts
    except OSError:
        _fd = -1  # the agent is gone (EPIPE) or the fd is not ours


def phase(name):
    """Enters a phase: one of PHASES. The next record ends it."""
    if name not in PHASES:
        raise ValueError(
            "ddprun.progress.phase: unknown phase %r; the phases are %s"
            % (name, ", ".join(PHASES)))
    _write(b"phase " + name.encode() + b"\n")


def step():
    """One training step completed."""
    _write(b"step\n")
