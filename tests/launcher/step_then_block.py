# A Python worker that reports each step with ddprun's module
# (python/ddprun/progress.py) and then appends "<step> <unix microseconds>
# <pid>" to argv[1], as ddprun-mnist's --step-times does. When argv[1] is a
# FIFO that its reader stops draining, the write blocks once the pipe is
# full: the program hangs in its step phase, alive and not stopped, as a
# deadlocked program does (hang_parity_test.py).
import os
import sys
import time

import ddprun.progress as progress

fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
step = 0
while True:
    sum(i * i for i in range(2000))  # the step's own work (~0.1 ms of CPU)
    step += 1
    progress.step()
    os.write(fd, b"%d %d %d\n" % (step, time.time_ns() // 1000, os.getpid()))
