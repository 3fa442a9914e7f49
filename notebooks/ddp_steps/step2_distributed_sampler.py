"""Step 2: each rank trains on its own shard of the data (DistributedSampler + set_epoch).

Run: torchrun --nproc_per_node=4 step2_distributed_sampler.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from course import data, models, train, world


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out-dir", type=Path, default=Path("runs/ddp_steps"))
    return parser.parse_args()


def run(args: argparse.Namespace, rank: world.Rank) -> None:
    device = rank.device  # cuda:<local_rank> on GPUs, cpu on emulated ones
    train.seed_everything(0)
    splits = data.load()
    sampler = DistributedSampler(splits.train, num_replicas=rank.world_size, rank=rank.rank, shuffle=True, seed=0)
    train_loader = DataLoader(splits.train, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(splits.val, batch_size=100)
    model = models.DigitsCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(f"batch {args.batch_size}, lr {args.lr:g}")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        model.train()
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
        val_loss, val_accuracy = train.evaluate(model, val_loader, device)
        print(f"epoch {epoch}: val loss {val_loss:.3f}, val accuracy {val_accuracy:.3f}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out_dir / "checkpoint.pt")
    print(f"saved checkpoint {args.out_dir / 'checkpoint.pt'}")


def main() -> None:
    args = parse_args()
    rank = world.init_from_env()  # reads RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT
    run(args, rank)


if __name__ == "__main__":
    main()
