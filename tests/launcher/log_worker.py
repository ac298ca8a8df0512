"""A worker for the log-folder test: writes a line to stdout and to stderr
naming its rank and attempt; with --fail-rank R, local rank R of the first
attempt fails through torch's @record, which writes TORCHELASTIC_ERROR_FILE
(as a torchrun program does)."""
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    print("out of local rank %d, attempt %d" % (local_rank, attempt), flush=True)
    print("err of local rank %d, attempt %d" % (local_rank, attempt),
          file=sys.stderr, flush=True)
    if "--fail-rank" in sys.argv and attempt == 0:
        fail = int(sys.argv[sys.argv.index("--fail-rank") + 1])
        if local_rank == fail:
            raise RuntimeError("local rank %d fails its first attempt" % fail)


if __name__ == "__main__":
    main()
