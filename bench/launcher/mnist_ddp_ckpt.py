"""The torchrun side of bench/launcher/inplace_recovery.py: the seed's MNIST
MLP in plain Python DDP (Gloo, env://), batched as ddprun-mnist batches
(index_select on the in-memory set in DistributedSampler order: the data
loading of bench/worker/mnist_ddp.py), with checkpoints as a torchrun user
writes them: rank 0 saves model, optimizer and where the epoch stands every
--checkpoint-every steps and at each epoch's end, and every rank resumes
from the newest one after a restart. So a kill -9 of one worker costs what
it costs under torchrun: every worker restarts and the steps since the last
checkpoint are trained again.

For the benchmark: every rank writes its pid to OUT/pid_<restart>_<rank>
(the victims), rank 0 writes its current step to OUT/step after each step
(steps lost = the step at the kill - the step resumed from), and rank 0
writes a summary JSON with the fields the benchmark reads from
ddprun-mnist's (steps, test_accuracy, resumed_from_step,
first_step_unix_seconds, epoch_samples).

  python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
      --max-restarts 3 --redirects 1 --tee 1 bench/launcher/mnist_ddp_ckpt.py \\
      --data-dir data/mnist --out OUT --checkpoint-dir OUT/ckpt
"""
import argparse
import glob
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "worker"))
from mnist_ddp import load  # noqa: E402  (the same decoding and normalizing)


def newest_checkpoint(folder):
    files = sorted(glob.glob(os.path.join(folder, "ckpt-*.pt")))
    return files[-1] if files else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--train-limit", type=int, default=0)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--out", required=True)
    parser.add_argument("--summary-json", default="")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    rank = dist.get_rank()
    with open(os.path.join(args.out, f"pid_{restart}_{rank}"), "w") as f:
        f.write(str(os.getpid()))
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    images, labels = load(args.data_dir, "train", args.train_limit)
    test_x, test_y = load(args.data_dir, "t10k", 0)
    train = TensorDataset(images, labels)

    epoch, position, step, resumed_from = 0, 0, 0, -1
    epoch_samples = []
    newest = newest_checkpoint(args.checkpoint_dir)
    if newest:
        state = torch.load(newest)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, position, step = state["epoch"], state["position"], state["step"]
        epoch_samples = list(state["epoch_samples"])
        resumed_from = step
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters

    def save(at_epoch, at_position):
        if rank != 0:
            return
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        path = os.path.join(args.checkpoint_dir, f"ckpt-{step:010d}.pt")
        torch.save({"model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "epoch": at_epoch,
                    "position": at_position, "step": step,
                    "epoch_samples": list(epoch_samples)}, path + ".tmp")
        os.replace(path + ".tmp", path)
        for old in sorted(glob.glob(os.path.join(args.checkpoint_dir,
                                                 "ckpt-*.pt")))[:-2]:
            os.remove(old)

    step_file = os.open(os.path.join(args.out, "step"),
                        os.O_WRONLY | os.O_CREAT) if rank == 0 else -1
    summary = {"world_size": world, "resumed_from_step": resumed_from}
    loss_fn = nn.CrossEntropyLoss()
    first = True
    while epoch < args.epochs:
        sampler = DistributedSampler(train, num_replicas=world, rank=rank,
                                     shuffle=True, seed=args.seed)
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.long)
        if len(epoch_samples) <= epoch:
            epoch_samples.append(0)
        # The samples the checkpoint's steps trained are behind: each rank
        # skips its share of them.
        begin = position // world
        for i in range(begin, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            optimizer.zero_grad()
            loss_fn(ddp(images.index_select(0, idx)),
                    labels.index_select(0, idx)).backward()
            optimizer.step()
            step += 1
            position += len(idx) * world
            epoch_samples[epoch] += len(idx) * world
            if first:
                summary["first_step_unix_seconds"] = time.time()
                first = False
            if rank == 0:
                os.pwrite(step_file, f"{step:12d}\n".encode(), 0)
            if (step % args.checkpoint_every == 0
                    and i + args.batch_size < len(order)):
                save(epoch, position)
        epoch += 1
        position = 0
        save(epoch, 0)
    if rank == 0:
        with torch.no_grad():
            summary["test_accuracy"] = (
                model(test_x).argmax(1) == test_y).float().mean().item()
        summary["steps"] = step
        summary["epoch_samples"] = epoch_samples
        if args.summary_json:
            with open(args.summary_json, "w") as f:
                json.dump(summary, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
