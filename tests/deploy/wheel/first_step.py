# An unmodified torch.distributed program as a torchrun user writes it:
# env:// initialization, DDP over Gloo, one training step. Each rank writes
# OUT/rank_<r>: the world size, the allreduced value, and the interpreter it
# ran under (sys.prefix), which must be the virtual environment's.
import os
import sys

import torch
import torch.distributed as dist


def main():
    out_dir = sys.argv[1]
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.full((8, 4), float(rank + 1))).pow(2).mean()
    loss.backward()
    optimizer.step()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    assert value.item() == world * (world + 1) / 2, value.item()
    print(f"rank {rank}/{world}: first step done, loss {loss.item():.4f}", flush=True)
    with open(os.path.join(out_dir, f"rank_{rank}"), "w") as f:
        f.write(f"{world} {value.item()} {sys.prefix}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
