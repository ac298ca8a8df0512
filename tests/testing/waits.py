"""Bounded waits for the Python tests: poll a condition until it holds or a
deadline passes, never a fixed sleep (the C++ tests' tests/testing/wait_for.h).

    sys.path.insert(0, os.path.join(HERE, "..", "testing"))
    from waits import wait_for
"""

import time


def wait_for(condition, timeout_s, poll_s=0.05):
    """Returns condition()'s first truthy value, or None once timeout_s
    passed (the condition is tried once more at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def wait_until(condition, what, timeout_s):
    """wait_for, or AssertionError naming `what` once timeout_s passed."""
    value = wait_for(condition, timeout_s)
    if not value:
        raise AssertionError("timed out waiting for " + what)
    return value
