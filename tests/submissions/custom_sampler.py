"""Correct: a sampler of the script's own (a strided shard of a per-epoch permutation) instead of
DistributedSampler. Full marks: what a rank trained on is read from what its model consumed."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from course import data, models, train, world
from course.report import report

EPOCHS = 6              # the epoch budget, unchanged
BATCH_SIZE = 32         # samples per step on each rank: the global batch is BATCH_SIZE * world_size
BASE_LR = 2e-3          # the single-device learning rate, for BATCH_SIZE samples per step
WARMUP_STEPS = 10       # ramp the scaled learning rate up over the first steps
SEED = 0
CHECKPOINT = "checkpoint.pt"


class StridedShardSampler(torch.utils.data.Sampler):
    """This rank's every world_size-th index of a permutation drawn anew each epoch (the same on every rank)."""

    def __init__(self, size: int, rank: int, world_size: int, seed: int) -> None:
        self.size, self.rank, self.world_size, self.seed, self.epoch = size, rank, world_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return iter(order[self.rank::self.world_size].tolist())

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.world_size))


def averaged(value: float, count: int, device: torch.device) -> float:
    """Sum of ``value * count`` over ranks divided by the total count: a metric averaged across ranks."""
    totals = torch.tensor([value * count, count], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def main() -> None:
    rank = world.init_from_env()
    train.seed_everything(SEED)  # the same seed on every rank; DDP also broadcasts rank 0's parameters
    splits = data.load()
    sampler = StridedShardSampler(len(splits.train), rank.rank, rank.world_size, SEED)
    train_loader = DataLoader(splits.train, batch_size=BATCH_SIZE, sampler=sampler)
    val_sampler = DistributedSampler(splits.val, num_replicas=rank.world_size, rank=rank.rank, shuffle=False)
    val_loader = DataLoader(splits.val, batch_size=BATCH_SIZE, sampler=val_sampler)
    model = models.DigitsCNN().to(rank.device)
    ddp_model = DDP(model, device_ids=[rank.device] if rank.device.type == "cuda" else None)
    lr = BASE_LR * rank.world_size  # linear scaling: 4x the batch, 4x the learning rate
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=lr)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS))
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        ddp_model.train()
        loss_sum, count = 0.0, 0
        for images, labels in train_loader:
            images, labels = images.to(rank.device), labels.to(rank.device)
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(ddp_model(images), labels)
            loss.backward()  # DDP averages the gradients across ranks here
            optimizer.step()
            warmup.step()
            loss_sum += loss.item() * len(labels)
            count += len(labels)
        train_loss = averaged(loss_sum / count, count, rank.device)
        _, local_accuracy = train.evaluate(ddp_model, val_loader, rank.device)
        val_accuracy = averaged(local_accuracy, len(val_sampler), rank.device)
        if rank.is_main:
            report(epoch, train_loss, val_accuracy)
    if rank.is_main:
        torch.save(model.state_dict(), CHECKPOINT)
    dist.barrier()  # every rank finishes its work before any rank leaves
    world.shutdown()


if __name__ == "__main__":
    main()
