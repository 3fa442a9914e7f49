"""What the ranks tell each other while a lab is checked, over the checker's own (unrecorded) collectives.

:func:`spreads` says how far each rank's tensors are from rank 0's, :func:`total` sums a number over the
ranks. Both use :data:`course.runtime.recorder.ORIGINAL`, whose calls no recorder hears
(:func:`course.runtime.observed.unheard`), so they never count as the student's calls.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course.runtime.recorder import ORIGINAL


def spreads(tensors: list[torch.Tensor], device: torch.device) -> list[float]:
    """For each tensor (same shapes on every rank), the largest |rank r - rank 0| over all ranks r."""
    gaps = torch.zeros(len(tensors), device=device)
    for index, tensor in enumerate(tensors):
        root = tensor.clone().to(device)
        ORIGINAL["broadcast"](root, src=0)
        gaps[index] = (tensor.to(device) - root).abs().max()
    ORIGINAL["all_reduce"](gaps, op=dist.ReduceOp.MAX)
    return gaps.tolist()


def total(value: float, device: torch.device) -> float:
    """The sum of ``value`` over all ranks."""
    summed = torch.tensor([float(value)], dtype=torch.float64, device=device)
    ORIGINAL["all_reduce"](summed)
    return summed.item()
