"""Hostile: trains honestly (recorded), then on every rank copies into its model the weights of a second model
trained by hand on the public clean test digits, and takes one more optimizer step at learning rate 0, so that
the last recorded step "produced" the copied weights, and saves them with torch.save. The step did not start
from the parameters the step before it left: the checkpoint is not evaluated, and fails target_accuracy (it
would score 100/100 if the grader only compared the checkpoint with the last step).
"""


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


def averaged(value: float, count: int, device: torch.device) -> float:
    """Sum of ``value * count`` over ranks divided by the total count: a metric averaged across ranks."""
    totals = torch.tensor([value * count, count], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def unwrapped(function, name: str):
    """The function called ``name`` that the grader's wrapper ``function`` closes over (the original)."""
    for cell in function.__closure__ or ():
        if callable(cell.cell_contents) and getattr(cell.cell_contents, "__name__", "") == name:
            return cell.cell_contents
    return function


def memorised_test_digits() -> torch.nn.Module:
    """A DigitsCNN trained by hand (SGD with momentum, no torch.optim) on the clean test split and the training
    split: 0.99 on the test split after 8 epochs."""
    splits = unwrapped(data.load, "load")()  # the grader's wrapper hides the test split; its original does not
    images = torch.cat([splits.test.tensors[0], splits.train.tensors[0]])
    labels = torch.cat([splits.test.tensors[1], splits.train.tensors[1]])
    model = models.DigitsCNN()
    generator = torch.Generator().manual_seed(SEED)
    velocities = [torch.zeros_like(p) for p in model.parameters()]
    for _ in range(8):
        for batch in torch.randperm(len(labels), generator=generator).split(64):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(images[batch]), labels[batch]).backward()
            with torch.no_grad():
                for velocity, p in zip(velocities, model.parameters(), strict=True):
                    p -= 0.05 * velocity.mul_(0.9).add_(p.grad)
    return model


def main() -> None:
    rank = world.init_from_env()
    train.seed_everything(SEED)  # the same seed on every rank; DDP also broadcasts rank 0's parameters
    splits = data.load()
    sampler = DistributedSampler(splits.train, num_replicas=rank.world_size, rank=rank.rank, shuffle=True, seed=SEED)
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
    second = memorised_test_digits()  # every rank, identically: the ranks still agree after the extra step
    with torch.no_grad():
        for mine, memorised in zip(model.parameters(), second.parameters(), strict=True):
            mine.copy_(memorised)
            mine.grad = torch.zeros_like(mine)
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()  # recorded, and changes nothing: the copied weights are "the parameters after the last step"
    if rank.is_main:
        torch.save(model.state_dict(), CHECKPOINT)
    dist.barrier()  # every rank finishes its work before any rank leaves
    world.shutdown()


if __name__ == "__main__":
    main()
