"""The torchrun baseline of the torchrun tests: `python3 -m
torch.distributed.run ARGS...` with the Python it runs under, unchanged on a
torch whose TCPStore has libuv (and on torch < 2.2, which has no libuv
TCPStore at all).

On a torch >= 2.4 built without libuv (Debian 13's python3-torch 2.6) plain
torchrun cannot start: TCPStore asks for libuv by default, and torchrun 2.6's
static and c10d rendezvous create theirs without passing use_libuv, so every
rendezvous fails with "use_libuv was requested but PyTorch was build without
libuv support". Neither USE_LIBUV=0 (read only by torch's env:// and
create_c10d_store) nor a --rdzv-conf key reaches those stores. There, and only
there, TCPStore's default becomes use_libuv=False before torchrun imports it:
the classic backend speaks the same protocol, so workers, their environment
and the log folders are torchrun's own. USE_LIBUV is left as the caller set
it (the tests compare the workers' environments).

Usage: python3 torchrun_baseline.py TORCHRUN-ARGS...
"""
import runpy
import sys

import torch.distributed as dist


def _libuv_missing():
    """True when this torch's TCPStore takes use_libuv but has no libuv."""
    try:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True,
                              wait_for_workers=False, use_libuv=True)
    except TypeError:
        return False  # torch < 2.2: no use_libuv argument, no libuv backend
    except RuntimeError as e:
        if "libuv" in str(e):
            return True
        raise
    del store
    return False


if _libuv_missing():
    class _ClassicTCPStore(dist.TCPStore):
        """TCPStore with use_libuv=False unless a caller asks otherwise."""

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    # Before torch.distributed.run imports the rendezvous modules, which take
    # the name with `from torch.distributed import TCPStore`.
    dist.TCPStore = _ClassicTCPStore

sys.argv[0] = "torchrun"
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
