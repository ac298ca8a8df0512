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
            torch.save(...)           # the steps after it end the phase
    progress.phase("eval")            # a validation pass (every rank: the
    evaluate(model)                   # others wait for it in their next step)
    progress.phase("stop")

Straggler figures: what tells a slow rank apart is its own compute time for
a step, its wait for the slowest peer in the gradient allreduce left out
(every rank's whole step takes as long as the slowest one's). With
DistributedDataParallel, `progress.watch(ddp_model)` measures it: a comm
hook notes when this rank's last gradient bucket is ready, and step() sends
the time from the previous step() to then. Otherwise time the rank's own
work with `with progress.compute(): ...` (forward and the loss, say), or
pass the figure yourself: `progress.step(compute=seconds)`.

The records are the lines of common/progress_record.h; writes never block
(the agent makes the pipe non-blocking) and never raise.
"""

import contextlib
import os
import time

__all__ = ["PHASES", "phase", "step", "compute", "watch", "enabled"]

# The phases a program may enter (common/progress_record.h); "start" is
# the agent's own, from the spawn to the first record.
PHASES = ("join", "sync", "step", "checkpoint", "stop", "eval")

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


# The previous step() (time.monotonic()), the end of this step's compute
# as the comm hook saw it, and the time compute() blocks measured since the
# previous step().
_last_step = None
_compute_end = None
_compute_sum = 0.0


def _figure(now):
    if _compute_end is not None and _last_step is not None:
        return max(0.0, _compute_end - _last_step)
    if _compute_sum > 0:
        return _compute_sum
    return None


def step(compute=None):
    """One training step completed.

    compute: this rank's own compute time for the step in seconds; by
    default what watch() or compute() measured since the previous step().
    """
    global _last_step, _compute_end, _compute_sum
    now = time.monotonic()
    figure = compute if compute is not None else _figure(now)
    _last_step = now
    _compute_end = None
    _compute_sum = 0.0
    if figure is None or not figure >= 0:
        _write(b"step\n")
    else:
        _write(b"step compute=%.6f\n" % float(figure))


@contextlib.contextmanager
def compute():
    """Times a block of this rank's own work; step() sends the sum."""
    global _compute_sum
    start = time.monotonic()
    try:
        yield
    finally:
        _compute_sum += time.monotonic() - start


def watch(ddp_model, process_group=None):
    """Measures each step's compute time of a DistributedDataParallel model.

    Registers a comm hook that allreduces as DDP's default does and notes
    when the last bucket is ready (this rank's backward is done). Call it
    once, before the first step; it replaces no hook of yours (DDP allows
    one: pass the figure to step() yourself then). Returns the model.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(state, bucket):
        global _compute_end
        is_last = getattr(bucket, "is_last", None)
        if is_last is None or is_last():
            _compute_end = time.monotonic()
        return default_hooks.allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(process_group, hook)
    return ddp_model
