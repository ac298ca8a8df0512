"""The seed program in Python DDP, the baseline ddprun-mnist is measured
against: same model, data, sampler, batch, optimizer and Gloo backend.

--batching index-select gathers batches as ddprun-mnist does (no
DataLoader). Run with torchrun (or alone, as one process):
  /usr/bin/python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
      bench/worker/mnist_ddp.py --data-dir data/mnist --epochs 1 \
      --summary-json out.json

Like ddprun-mnist it holds the whole set in memory as normalized float
tensors (torchvision's ToTensor + Normalize), so both sides measure training,
not decoding. It writes the same summary JSON fields.
"""
import argparse
import json
import os
import time


def seconds_since_process_start():
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22, counted after the command name
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")


def read_idx(path, header):
    import numpy as np
    with open(path, "rb") as f:
        return np.frombuffer(f.read()[header:], dtype=np.uint8).copy()


def load(data_dir, split, limit):
    import torch
    images = torch.from_numpy(read_idx(f"{data_dir}/{split}-images-idx3-ubyte", 16))
    labels = torch.from_numpy(read_idx(f"{data_dir}/{split}-labels-idx1-ubyte", 8)).long()
    images = (images.float().view(-1, 1, 28, 28) / 255.0 - 0.1307) / 0.3081
    if limit:
        images, labels = images[:limit], labels[:limit]
    return images, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default="data/mnist")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-limit", type=int, default=0)
    parser.add_argument("--summary-json", default="")
    # dataloader: the seed's DataLoader over a TensorDataset; index-select:
    # batches gathered as ddprun-mnist gathers them (index_select on the
    # in-memory set in DistributedSampler order), so that what is left
    # between the two is the launcher, DDP and Python.
    parser.add_argument("--batching", choices=["dataloader", "index-select"],
                        default="dataloader")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    ddp = DistributedDataParallel(model) if world > 1 else model
    train = TensorDataset(*load(args.data_dir, "train", args.train_limit))
    test_x, test_y = load(args.data_dir, "t10k", 0)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed)
    if args.batching == "dataloader":
        loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    else:
        images, labels = train.tensors

        def loader_fn():
            order = torch.tensor(list(sampler), dtype=torch.long)
            for i in range(0, len(order), args.batch_size):
                idx = order[i:i + args.batch_size]
                yield images.index_select(0, idx), labels.index_select(0, idx)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    summary = {"world_size": world, "epochs": 0, "steps": 0}
    trained = 0
    train_seconds = 0.0
    loss = None
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        for x, y in (loader if args.batching == "dataloader" else loader_fn()):
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
            summary["steps"] += 1
            trained += len(y)
            if summary["steps"] == 1:
                summary["time_to_first_step_seconds"] = seconds_since_process_start()
                summary["first_step_unix_seconds"] = time.time()
        train_seconds += time.perf_counter() - start
        summary["epochs"] = epoch + 1
        if rank == 0:
            with torch.no_grad():
                accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
            summary["test_accuracy"] = accuracy
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss.item():.4f}, "
                  f"test accuracy {100 * accuracy:.2f}%", flush=True)
    summary["samples_per_sec"] = trained * world / max(train_seconds, 1e-9)
    summary["final_loss"] = loss.item() if loss is not None else 0.0
    summary["wall_seconds"] = seconds_since_process_start()
    if rank == 0 and args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
