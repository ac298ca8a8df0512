"""Python torch.distributed's Gloo allreduce, timed as allreduce_bench.cc
times libddp's (same sizes, iterations and JSON lines; impl
"torch.distributed"). Run under ddprun or torchrun:
  ddprun --standalone --nproc-per-node 2 bench/collectives/allreduce_torch.py \
      --out results.jsonl
"""
import argparse
import json
import os
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--sizes", default="4096,65536,409600,1048576,4194304,"
                        "16777216,67108864,268435456")
    args = parser.parse_args()
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = open(args.out, "a") if rank == 0 else None
    for size in (int(s) for s in args.sizes.split(",")):
        data = torch.ones(size // 4)
        iterations = max(3, min(2000, (1 << 30) // size))
        for _ in range(args.reps):
            dist.barrier()
            dist.all_reduce(data)
            data.fill_(1.0)
            start = time.perf_counter()
            for _ in range(iterations):
                dist.all_reduce(data)
            seconds = (time.perf_counter() - start) / iterations
            if out:
                out.write(json.dumps({"impl": "torch.distributed", "world": world,
                                      "bytes": size, "seconds": seconds}) + "\n")
                out.flush()
            data.fill_(1.0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
