"""The rounding bounds of the sequence-parallel lab: how far each tensor may be from the unsplit linear's.

The unsplit ``y = x @ weight.T + bias`` and its gradients are carried through :mod:`course.numerics.propagate`
twice: whole (the one-process reference), and as ``world_size`` ranks compute them (the input's gradient summed
from the ranks' partial products by a reduce-scatter in the run's dtype). A tensor may differ from the reference
by at most the sum of the two bounds.
"""

from __future__ import annotations

import torch

from course.numerics import propagate as p


def tracked(data: dict[str, torch.Tensor], dtype: torch.dtype, parts: int) -> dict[str, p.Tracked]:
    """Output ``y`` and gradients ``x, weight, bias`` (unsplit shapes) with their bounds, on ``parts`` ranks."""
    x, weight, bias, dy = (p.leaf(data[name], dtype) for name in ("x", "weight", "bias", "upstream"))
    dy_rows = p.flatten(dy, 0, 1)  # (B*S, d_ff)
    return {"y": p.add(p.matmul(x, p.transpose(weight)), bias), "x": p.matmul(dy, weight, parts=parts),
            "weight": p.matmul(p.transpose(dy_rows), p.flatten(x, 0, 1)), "bias": p.total(dy, (0, 1))}


def comparison_bounds(data: dict[str, torch.Tensor], dtype: torch.dtype, world_size: int
                      ) -> dict[str, torch.Tensor]:
    """name -> the largest |student - reference| rounding allows, element by element (unsplit shapes)."""
    student, reference = tracked(data, dtype, world_size), tracked(data, dtype, 1)
    return {name: p.comparison_bound(student[name], reference[name]) for name in student}
