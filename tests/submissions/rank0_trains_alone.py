"""Broken: ranks 1-3 join the process group and wait in shutdown's barrier; rank 0 trains alone, as the starter.

The run ends cleanly, but ranks 1-3 took no optimizer step: no credit for disjoint shards, reshuffling, equal
parameters, the single-process match (the union batch would be rank 0's alone) or a scaled learning rate.
Fails ran_to_the_end, disjoint_shards, reshuffled, equal_parameters, matches_single_process and lr_scaled.
"""

import torch
from torch.utils.data import DataLoader

from course import data, models, train, world
from course.report import report

EPOCHS = 6              # the epoch budget, unchanged
BATCH_SIZE = 32         # samples per step: rank 0 trains alone, as the single-device starter does
LR = 2e-3
SEED = 0
CHECKPOINT = "checkpoint.pt"


def main() -> None:
    rank = world.init_from_env()
    if not rank.is_main:
        world.shutdown()  # waits in a barrier until rank 0 has trained
        return
    train.seed_everything(SEED)
    splits = data.load()
    train_loader = DataLoader(splits.train, batch_size=BATCH_SIZE, shuffle=True)
    val_loader = DataLoader(splits.val, batch_size=BATCH_SIZE)
    model = models.DigitsCNN().to(rank.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for epoch in range(EPOCHS):
        train_loss = train.train_epoch(model, train_loader, optimizer, rank.device)
        _, val_accuracy = train.evaluate(model, val_loader, rank.device)
        report(epoch, train_loss, val_accuracy)
    torch.save(model.state_dict(), CHECKPOINT)
    world.shutdown()


if __name__ == "__main__":
    main()
