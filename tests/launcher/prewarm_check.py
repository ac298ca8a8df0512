# Run under `ddprun --prewarm`: rank 1 fails in the first attempt; in the
# next one every rank records what it sees (its environment, argv, whether
# torch was imported before the program started) and does a Gloo allreduce.
import json
import os
import sys

restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
torch_preloaded = "torch" in sys.modules
if restart == 0 and os.environ["RANK"] == "1":
    sys.exit(3)

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
value = torch.tensor([1.0])
dist.all_reduce(value)
out_dir = sys.argv[1]
record = {
    "env": dict(os.environ),
    "argv": sys.argv,
    "name": __name__,
    "torch_preloaded": torch_preloaded,
    "allreduce": value.item(),
}
with open(os.path.join(out_dir, f"rank_{dist.get_rank()}_restart_{restart}.json"), "w") as f:
    json.dump(record, f)
dist.destroy_process_group()
