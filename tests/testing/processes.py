"""Ending the processes a Python test started, always reaping them.

    sys.path.insert(0, os.path.join(HERE, "..", "testing"))
    from processes import stop
"""

import subprocess


def stop(proc, grace_s=0):
    """Ends `proc` if it still runs: SIGTERM and up to grace_s seconds for
    it to exit (grace_s 0: none), then SIGKILL; reaps it either way."""
    if proc.poll() is not None:
        return
    if grace_s > 0:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            pass
    proc.kill()
    proc.wait()
