"""Your 4-GPU version of train_1gpu.py: fill in the TODOs (notebook 06 walks you through them).

Run it: `torchrun --nproc_per_node=4 train_4gpu.py`. Check it: `grader check train_4gpu.py`.
torch.compile is allowed and not needed: the grader runs it without compiling (TORCH_COMPILE_DISABLE=1), so your
grade is the same with it or without it.
"""

import torch
from torch.utils.data import DataLoader

from course import data, models, train, world
from course.report import report

EPOCHS = 6              # the epoch budget: keep it
BATCH_SIZE = 32         # samples per step ON EACH RANK (the global batch is BATCH_SIZE * world_size)
BASE_LR = 2e-3          # the starter's learning rate, for 32 samples per step
SEED = 0
CHECKPOINT = "checkpoint.pt"


def main() -> None:
    # TODO 1: join the process group from torchrun's environment (course.world.init_from_env()), which
    #         also picks the device by local rank: nccl + cuda:<local_rank> on GPUs, gloo + cpu here.
    device = world.device_for(0)
    train.seed_everything(SEED)
    splits = data.load()
    # TODO 2: give each rank its own shard: DistributedSampler(splits.train, ...) instead of shuffle=True.
    train_loader = DataLoader(splits.train, batch_size=BATCH_SIZE, shuffle=True)
    val_loader = DataLoader(splits.val, batch_size=BATCH_SIZE)
    model = models.DigitsCNN().to(device)
    # TODO 3: wrap the model in DistributedDataParallel: equal parameters at the start, averaged gradients.
    # TODO 4: scale the learning rate for the global batch, and warm it up over the first steps.
    optimizer = torch.optim.Adam(model.parameters(), lr=BASE_LR)
    for epoch in range(EPOCHS):
        # TODO 5: sampler.set_epoch(epoch), so every epoch is shuffled anew.
        train_loss = train.train_epoch(model, train_loader, optimizer, device)
        _, val_accuracy = train.evaluate(model, val_loader, device)
        # TODO 6: make train_loss and val_accuracy global: give each rank its own shard of the validation set,
        #         then sum (loss x samples, correct, samples) over the ranks with dist.all_reduce and divide once:
        #         reduce sums and counts, not per-rank means (notebook 05, step 6).
        # TODO 7: report on rank 0 only.
        report(epoch, train_loss, val_accuracy)
    # TODO 8: save the checkpoint on rank 0 only (the model's state_dict, not the DDP wrapper's).
    torch.save(model.state_dict(), CHECKPOINT)
    # TODO 9: leave the process group cleanly (course.world.shutdown()).


if __name__ == "__main__":
    main()
