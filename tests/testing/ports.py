"""Ports for the Python tests that must name one in advance (several nodes
of one job told the same endpoint; port 0 cannot be shared).

    sys.path.insert(0, os.path.join(HERE, "..", "testing"))
    from ports import free_port
"""

import socket


def free_port(host="127.0.0.1"):
    """A port the kernel just gave out on `host` and took back. Another
    process may take it meanwhile: a test that gets it taken retries."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
