"""What the ranks tell each other while a lab is checked, over the checker's own (unrecorded) collectives.

:func:`first_error` makes every rank report the same student error (the lowest rank's); :func:`spreads` says
how far each rank's tensors are from rank 0's. Both use :data:`course.labs.recorder.ORIGINAL`, so a recorder
installed meanwhile does not count them as the student's calls.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course.labs.recorder import ORIGINAL


def first_error(message: str | None) -> str | None:
    """The lowest rank's error message, on every rank; ``None`` when no rank had one."""
    messages: list[str | None] = [None] * dist.get_world_size()
    ORIGINAL["all_gather_object"](messages, message)
    return next((m for m in messages if m is not None), None)


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
