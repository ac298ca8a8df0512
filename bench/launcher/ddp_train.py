# The training program of the restart benchmark, the same for ddprun and
# torchrun: an unmodified torch.distributed DDP script (env://, Gloo) that
# trains the MNIST MLP on synthetic batches. Rank 0 appends
# "<restart_count> <unix time>" to OUT/steps after every step; every rank
# writes its pid to OUT/pid_<restart>_<rank> so the benchmark can kill one.
# In the first attempt it trains until killed; after a restart it takes a few
# steps and exits 0, so the launcher ends.
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    out = sys.argv[1]
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    with open(os.path.join(out, f"pid_{restart}_{rank}"), "w") as f:
        f.write(str(os.getpid()))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(),
                      nn.Linear(128, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 1, 28, 28)
    y = torch.randint(0, 10, (32,))
    steps = 0
    while restart == 0 or steps < 5:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if rank == 0:
            with open(os.path.join(out, "steps"), "a") as f:
                f.write(f"{restart} {time.time():.6f}\n")
        if restart == 0:
            time.sleep(0.01)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
