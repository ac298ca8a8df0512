"""A worker that binds MASTER_PORT as a plain server would (no SO_REUSEADDR)
on global rank 0 and writes what happened to OUT_DIR/rank_<RANK>."""
import errno
import os
import socket
import sys

rank = int(os.environ["RANK"])
port = int(os.environ["MASTER_PORT"])
result = "not rank 0"
if rank == 0:
    s = socket.socket()
    try:
        s.bind((os.environ["MASTER_ADDR"], port))
        s.listen()
        result = "bound"
    except OSError as e:
        result = errno.errorcode.get(e.errno, str(e.errno))
    s.close()
with open(os.path.join(sys.argv[1], "rank_%d" % rank), "w") as f:
    f.write("%s %d\n" % (result, port))
