"""A DDP pitfall as a runnable contrast: evaluating on rank 0 only vs reducing the metric's sums.

Each rank evaluates its own shard of the validation set. Printing rank 0's accuracy reports a number measured on
1/N of the data; averaging the ranks' accuracies is also wrong when shards differ in size. The right way
all-reduces the *sums* (correct answers, samples) and divides once: exactly the single-device accuracy on the whole
set. (Calling a collective inside ``if rank == 0:`` is the other half of this pitfall: it hangs, see
:mod:`course.practice.drills`.) Taught in ``notebooks/09_real_gpu_practice.ipynb``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from course import data, models, world


@dataclass(frozen=True)
class Accuracies:
    """One rank's view of the validation accuracy, computed the wrong way and the right way."""

    rank_only: float  # this rank's shard alone: what `if rank == 0: print(accuracy)` reports
    mean_of_ranks: float  # the ranks' accuracies averaged (wrong when shards differ in size)
    reduced: float  # all-reduced correct / all-reduced samples: the whole set's accuracy
    samples: int  # samples in this rank's shard


def counts(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[correct, samples]`` of ``model`` on ``inputs`` (B, C, H, W) and ``targets`` (B,), as float64."""
    with torch.no_grad():
        correct = (model(inputs).argmax(dim=1) == targets).sum()
    return torch.tensor([float(correct), float(len(targets))], dtype=torch.float64)


def shard(num_samples: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous shard of ``num_samples`` (the first ranks get one more when it does not divide)."""
    size, extra = divmod(num_samples, world_size)
    start = rank * size + min(rank, extra)
    return slice(start, start + size + (rank < extra))


def evaluate(train_steps: int = 20, num_samples: int = 299, seed: int = 0) -> Accuracies:
    """Train the digits MLP briefly (same on every rank), then evaluate this rank's shard three ways.

    Args:
        num_samples: validation samples used (299 of 300: uneven shards on 2 ranks).
    """
    rank = world.current()
    model = _trained(train_steps, seed)
    inputs, targets = data.load("digits").val.tensors
    mine = shard(num_samples, rank.rank, rank.world_size)
    local = counts(model, inputs[mine], targets[mine])
    # nccl reduces only tensors on the rank's GPU
    totals = local.to(rank.device, copy=True)  # a copy: local stays this rank's own counts
    accuracies = torch.tensor([local[0] / local[1]], dtype=torch.float64, device=rank.device)
    dist.all_reduce(totals)
    dist.all_reduce(accuracies)
    return Accuracies(float(local[0] / local[1]), float(accuracies) / rank.world_size, float(totals[0] / totals[1]),
                      int(local[1]))


def _trained(steps: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = models.build("mlp")
    inputs, targets = data.load("digits").train.tensors
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    return model.eval()


def single_device_accuracy(train_steps: int = 20, num_samples: int = 299, seed: int = 0) -> float:
    """The reference: the same model's accuracy on the whole ``num_samples`` on one device."""
    inputs, targets = data.load("digits").val.tensors
    correct, samples = counts(_trained(train_steps, seed), inputs[:num_samples], targets[:num_samples])
    return float(correct / samples)
