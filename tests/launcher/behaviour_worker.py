"""The worker of torchrun_behaviour_test.py: one mode per behaviour, each
leaving files in OUT_DIR that the test reads (the launchers' own words are
never the evidence). Every file name carries the attempt
(TORCHELASTIC_RESTART_COUNT) and the rank; a file is written whole under a
temporary name, then renamed, so that its presence means its content.

Usage: behaviour_worker.py OUT_DIR MODE   (also as `-m behaviour_worker`)

Modes:
  ok          write ok_<attempt>_<rank> (the module name and a few variables)
              and exit 0
  fail        rank 0 waits (up to 60 s) for a SIGTERM, rank 1 exits 3 once
              rank 0 is ready
  always      every rank writes its start, waits for all local ranks' starts
              of this attempt, then exits 1
  term        every rank waits (up to 60 s) for a SIGTERM; its handler writes
              term_begin, takes TERM_S seconds, writes term_end and exits 0
  raise       rank 1 raises RuntimeError(MESSAGE) under torch's @record;
              rank 0 waits (up to 60 s) for a SIGTERM
  print       print a line naming the local rank to stdout and exit 0
"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from waits import wait_for  # noqa: E402

MESSAGE = "behaviour-test failure of rank 1"
TERM_S = 4.0
WAIT_S = 60.0


def _write(out_dir, name, content=""):
    tmp = os.path.join(out_dir, "." + name)
    with open(tmp, "w") as f:
        f.write(content)
    os.rename(tmp, os.path.join(out_dir, name))


def _wait_for_term(out_dir, tag, handler_s=0.0):
    """Ready file, then up to WAIT_S for a SIGTERM; exit 0 from the handler
    after handler_s, exit 4 when none came."""
    def on_term(signum, frame):
        _write(out_dir, "term_begin_" + tag)
        time.sleep(handler_s)  # work the handler does before it ends
        _write(out_dir, "term_end_" + tag)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    _write(out_dir, "ready_" + tag, str(os.getpid()))
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        time.sleep(0.05)
    _write(out_dir, "no_term_" + tag)
    sys.exit(4)


def main():
    out_dir, mode = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    tag = "%s_%d" % (attempt, rank)
    if mode == "ok":
        seen = {k: os.environ.get(k) for k in
                ("MASTER_PORT", "OMP_NUM_THREADS", "TORCHELASTIC_RUN_ID")}
        seen["module"] = __spec__.name if __spec__ else None
        _write(out_dir, "ok_" + tag, json.dumps(seen, sort_keys=True))
    elif mode == "fail":
        if rank == 0:
            _wait_for_term(out_dir, tag)
        ready = os.path.join(out_dir, "ready_%s_0" % attempt)
        wait_for(lambda: os.path.exists(ready), WAIT_S)
        _write(out_dir, "failed_" + tag)
        sys.exit(3)
    elif mode == "always":
        _write(out_dir, "start_" + tag)
        starts = ["start_%s_%d" % (attempt, r) for r in range(local_world)]
        wait_for(lambda: all(os.path.exists(os.path.join(out_dir, s))
                             for s in starts), WAIT_S)
        sys.exit(1)
    elif mode == "term":
        _wait_for_term(out_dir, tag, TERM_S)
    elif mode == "raise":
        if rank == 0:
            _wait_for_term(out_dir, tag)
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def fail():
            ready = os.path.join(out_dir, "ready_%s_0" % attempt)
            wait_for(lambda: os.path.exists(ready), WAIT_S)
            raise RuntimeError(MESSAGE)

        fail()
    elif mode == "print":
        print("behaviour line of local rank %s" % os.environ["LOCAL_RANK"],
              flush=True)
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
