# A Python DDP program that reports its progress to ddprun with the module
# every worker can import (python/ddprun/progress.py): one step() per
# training step, its compute time measured by watch(). The MNIST MLP on
# synthetic batches, env:// and Gloo, as an unmodified torchrun script plus
# three lines. It trains for argv[1] steps, a few ms each.
import os
import sys

import ddprun.progress as progress
import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    steps = int(sys.argv[1])
    torch.set_num_threads(1)
    progress.phase("join")
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    model = progress.watch(nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(),
                      nn.Linear(128, 10))))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 1, 28, 28)
    y = torch.randint(0, 10, (32,))
    progress.phase("step")
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        progress.step()
    progress.phase("stop")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("USE_LIBUV", "0")  # Debian 13's torch has none
    main()
