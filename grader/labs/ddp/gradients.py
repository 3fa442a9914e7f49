"""The DDP lab's rounding bounds and first divergence: which parameter's averaged gradient went wrong, at which step.

Every rank knows its own gradients before synchronization (the check's hooks copy them) and what the student's
``finish_gradient_synchronization`` left in each ``.grad``. The exact average of the ranks' own gradients is
computed here in float64 over the checker's own collectives; the student's may differ from it by the rounding
of an allreduce of ``world_size`` float32 partial sums and of the division
(:func:`course.numerics.bounds.reduction_bound`). The first gradient beyond that, in the order backward makes
them, step by step, is where the synchronization went wrong. The same bounds, carried through the SGD
updates, say how far the parameters may drift from torch DDP's (to first order: a rounding difference in the
parameters changes the next gradients by a second-order amount).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course.numerics import bounds
from course.numerics.divergence import GRADIENT, Divergence, Recorder, first_divergence
from course.runtime.recorder import ORIGINAL


def _averaged(local: dict[str, torch.Tensor], device: torch.device) -> tuple[dict, dict]:
    """name -> the exact average over the ranks of their own gradients (float64), and the sum of magnitudes."""
    names = list(local)
    flat = torch.cat([local[name].double().reshape(-1) for name in names]).to(device)
    summed, magnitudes = flat.clone(), flat.abs()
    ORIGINAL["all_reduce"](summed)
    ORIGINAL["all_reduce"](magnitudes)
    mean, size, offset = {}, {}, 0
    for name in names:
        n = local[name].numel()
        mean[name] = summed[offset:offset + n].view_as(local[name]).cpu() / dist.get_world_size()
        size[name] = magnitudes[offset:offset + n].view_as(local[name]).cpu()
        offset += n
    return mean, size


def allowed(mean: torch.Tensor, magnitudes: torch.Tensor, world_size: int, dtype: torch.dtype) -> torch.Tensor:
    """How far a correctly averaged gradient may be from the exact ``mean``: the allreduce's rounding on the
    ranks' gradient magnitudes, divided by ``world_size``, plus the division's own rounding."""
    reduced = bounds.reduction_bound(magnitudes, world_size, dtype) / world_size
    return reduced + bounds.cast_bound(mean.abs() + reduced, dtype)


def judge(local: list[dict[str, torch.Tensor]], synced: list[dict[str, torch.Tensor]], rank: int,
          world_size: int, device: torch.device) -> tuple[Divergence | None, list[dict[str, torch.Tensor]]]:
    """The first synchronized gradient (steps 1, 2, ...; parameters in backward's order) beyond rounding, and
    each step's allowed error per parameter. Every rank must call it (it sums over the ranks)."""
    mine, exact, limits = Recorder(rank), Recorder(rank), []
    for step, (own, got) in enumerate(zip(local, synced, strict=True), start=1):
        mean, size = _averaged(own, device)
        limit = {name: allowed(mean[name], size[name], world_size, own[name].dtype) for name in own}
        limits.append(limit)
        mine.step = exact.step = step
        for name in own:
            mine.add(name, GRADIENT, got.get(name))
            exact.add(name, GRADIENT, mean[name])
    names = [name for name in (local[0] if local else {})]
    lookup = {(step, name): limits[step - 1][name] for step in range(1, len(limits) + 1) for name in names}
    return first_divergence(mine.records, exact.records, lambda r, _: lookup[(r.step, r.name)]), limits


def trajectory_bounds(limits: list[dict[str, torch.Tensor]], trajectory: list[torch.Tensor], lr: float,
                      order: list[str]) -> list[torch.Tensor]:
    """For each entry of the flat parameter ``trajectory``, how far torch DDP's may be: both sides' gradient
    rounding times ``lr``, plus both sides' rounding of each update, summed over the steps so far."""
    running = torch.zeros_like(trajectory[0], dtype=torch.float64)
    out = [running.clone()]
    for step, limit in enumerate(limits, start=1):
        gradient = torch.cat([limit[name].reshape(-1) for name in order])
        moved = (trajectory[step].double() - trajectory[step - 1].double()).abs()
        update = bounds.cast_bound(trajectory[step].double().abs() + moved, trajectory[step].dtype)
        running = running + 2 * lr * gradient + 2 * update
        out.append(running.clone())
    return out
