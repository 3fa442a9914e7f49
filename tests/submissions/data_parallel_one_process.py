"""Broken: nn.DataParallel in each process, no process group; torchrun's 4 processes each train alone.

Each process takes steps of 128 samples (32 per "GPU" of DataParallel) at the linearly scaled rate; nothing is
averaged across processes. Fails ran_to_the_end, disjoint_shards, reshuffled, equal_parameters,
matches_single_process, lr_scaled and rank0_checkpoint_and_logs.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader

from course import data, models, train, world
from course.report import report

EPOCHS = 6              # the epoch budget, unchanged
GPUS = 4
BATCH_SIZE = 32 * GPUS  # DataParallel splits each batch across the GPUs of one process
LR = 2e-3 * GPUS        # linear scaling for 4x the batch
WARMUP_STEPS = 10
SEED = 0
CHECKPOINT = "checkpoint.pt"


def main() -> None:
    device = world.device_for(0)
    train.seed_everything(SEED)
    splits = data.load()
    train_loader = DataLoader(splits.train, batch_size=BATCH_SIZE, shuffle=True)
    val_loader = DataLoader(splits.val, batch_size=BATCH_SIZE)
    model = nn.DataParallel(models.DigitsCNN().to(device))  # one process; on CPUs it runs the module as is
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS))
    for epoch in range(EPOCHS):
        model.train()
        loss_sum, count = 0.0, 0
        for images, labels in train_loader:
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            warmup.step()
            loss_sum, count = loss_sum + loss.item() * len(labels), count + len(labels)
        _, val_accuracy = train.evaluate(model, val_loader, device)
        report(epoch, loss_sum / count, val_accuracy)
    torch.save(model.module.state_dict(), CHECKPOINT)


if __name__ == "__main__":
    main()
