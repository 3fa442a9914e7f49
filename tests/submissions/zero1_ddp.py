"""Correct: DDP with ZeroRedundancyOptimizer (ZeRO-1, notebook 07): each rank keeps Adam's state for its share
of the parameters, and the optimizer's full state is gathered (in memory) onto rank 0 for the checkpoint (full
marks)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from course import data, models, train, world
from course.report import report


def mean_over_ranks(total: float, count: int, device: torch.device) -> float:
    sums = torch.tensor([total, count], dtype=torch.float64, device=device)
    dist.all_reduce(sums)
    return float(sums[0] / sums[1])


def main() -> None:
    rank = world.init_from_env()
    train.seed_everything(0)
    splits = data.load()
    sampler = DistributedSampler(splits.train, seed=0)
    loader = DataLoader(splits.train, batch_size=32, sampler=sampler)
    val_sampler = DistributedSampler(splits.val, shuffle=False)
    val_loader = DataLoader(splits.val, batch_size=32, sampler=val_sampler)
    model = DDP(models.DigitsCNN().to(rank.device))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                        lr=2e-3 * rank.world_size)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    for epoch in range(6):
        sampler.set_epoch(epoch)
        model.train()
        loss_sum, seen = 0.0, 0
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images.to(rank.device)), labels.to(rank.device))
            loss.backward()
            optimizer.step()
            warmup.step()
            loss_sum, seen = loss_sum + loss.item() * len(labels), seen + len(labels)
        _, accuracy = train.evaluate(model, val_loader, rank.device)
        val_accuracy = mean_over_ranks(accuracy * len(val_sampler), len(val_sampler), rank.device)
        train_loss = mean_over_ranks(loss_sum, seen, rank.device)
        if rank.is_main:
            report(epoch, train_loss, val_accuracy)
    optimizer.consolidate_state_dict(to=0)  # every rank takes part; ranks 1-3 serialise their shard in memory
    if rank.is_main:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "checkpoint.pt")
    dist.barrier()
    world.shutdown()


if __name__ == "__main__":
    main()
