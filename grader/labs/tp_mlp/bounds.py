"""The rounding bounds of the tensor-parallel MLP lab: how far each of its tensors may be from the unsplit MLP's.

The unsplit MLP ``y = fc2(gelu(fc1(x)))`` and its gradients are carried through :mod:`course.numerics.propagate`
twice: once whole (the one-process reference), once as ``world_size`` ranks compute it (fc2's and the input
gradient's inner dimension split over the ranks, then summed by an all_reduce in the run's dtype). A tensor may
differ from the reference by at most the sum of the two bounds.
"""

from __future__ import annotations

import math

import torch

from course.numerics import propagate as p


def _gelu(z: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(z)


def _gelu_slope(z: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1 + torch.erf(z / math.sqrt(2))) + z * torch.exp(-z * z / 2) / math.sqrt(2 * math.pi)


def tracked(fc1_weight: torch.Tensor, fc1_bias: torch.Tensor, fc2_weight: torch.Tensor, fc2_bias: torch.Tensor,
            x: torch.Tensor, upstream: torch.Tensor, dtype: torch.dtype, parts: int) -> dict[str, p.Tracked]:
    """The MLP's output ``y`` and the gradients ``x, w1, b1, w2, b2`` with their bounds, computed by ``parts``
    ranks (1: the unsplit reference)."""
    x_, w1, b1, w2, b2, dy = (p.leaf(t, dtype) for t in (x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, upstream))
    z = p.add(p.matmul(x_, p.transpose(w1)), b1)  # (B, S, d_ff): each rank computes its own columns whole
    h = p.elementwise(z, _gelu, p.GELU_SLOPE)
    y = p.add(p.matmul(h, p.transpose(w2), parts=parts), b2)  # fc2's inner d_ff split over the ranks
    dy_rows, h_rows = p.flatten(dy, 0, 1), p.flatten(h, 0, 1)  # (B*S, d), (B*S, d_ff)
    dh = p.matmul(dy, w2)  # (B, S, d_ff)
    dz = p.multiply(dh, p.elementwise(z, _gelu_slope, p.GELU_CURVATURE))
    dz_rows = p.flatten(dz, 0, 1)
    return {"y": y, "x": p.matmul(dz, w1, parts=parts), "b2": p.total(dy, (0, 1)),
            "w2": p.matmul(p.transpose(dy_rows), h_rows), "b1": p.total(dz, (0, 1)),
            "w1": p.matmul(p.transpose(dz_rows), p.flatten(x_, 0, 1))}


def comparison_bounds(tensors: tuple[torch.Tensor, ...], dtype: torch.dtype, world_size: int
                      ) -> dict[str, torch.Tensor]:
    """name -> the largest |student - reference| rounding allows, element by element (unsplit shapes)."""
    student, reference = tracked(*tensors, dtype, world_size), tracked(*tensors, dtype, 1)
    return {name: p.comparison_bound(student[name], reference[name]) for name in student}
