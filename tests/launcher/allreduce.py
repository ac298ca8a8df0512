# An unmodified torch.distributed program, as people run it under torchrun:
# env:// initialization, a Gloo allreduce, one result file per rank.
import os
import sys

import torch
import torch.distributed as dist


def main():
    out_dir = sys.argv[1]
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    world = dist.get_world_size()
    assert rank == int(os.environ["RANK"]), "RANK disagrees with the group"
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    assert value.item() == expected, f"allreduce gave {value.item()}, not {expected}"
    print(f"rank {rank}/{world}: allreduce {value.item()}", flush=True)
    with open(os.path.join(out_dir, f"rank_{rank}.result"), "w") as f:
        f.write(f"{world} {value.item()} {os.environ['LOCAL_RANK']} "
                f"{os.environ['GROUP_RANK']}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
