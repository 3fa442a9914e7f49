"""The single-process reference: what one device training on the union of the ranks' batches computes.

Data parallelism on 4 ranks is supposed to be plain SGD on the union batch (notebook 02). The grader takes
the parameters rank 0 held before a step and the indices every rank fetched for it, recomputes the
gradient of the mean loss on that union batch in one process, and compares it with the gradient rank 0's
optimizer actually applied. Summed gradients come out ``world_size`` times too large; missing
synchronisation comes out different altogether. A transformation applied the same way on every rank after the
averaging keeps the direction: clipping (``clip_grad_norm_``) shortens the gradient to one norm, a constant factor
scales it by that factor at every step (:func:`transformation` names which).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from course import data, models


@dataclass(frozen=True)
class Comparison:
    """How rank 0's applied gradient relates to the single-process union-batch gradient of one step.

    Attributes:
        step: optimizer step, counting from 1.
        relative_error: ``|g - g_ref| / |g_ref|``.
        scale: ``<g, g_ref> / |g_ref|^2``: 1 when averaged, ``world_size`` when summed.
        direction_error: ``|g - scale * g_ref| / |scale * g_ref|``: how far ``g`` points from ``g_ref``, whatever
            its length (0 when it is ``g_ref`` clipped or scaled).
        norm: ``|g|``, the applied gradient's length (clipping makes it the clipping norm).
    """

    step: int
    relative_error: float
    scale: float
    direction_error: float = float("nan")
    norm: float = float("nan")


def model_from_flat(flat: torch.Tensor, shapes: list[list[int]]) -> nn.Module:
    """A ``DigitsCNN`` whose parameters, in order, are ``flat`` cut to ``shapes``.

    Raises:
        ValueError: the shapes are not those of a DigitsCNN's parameters.
    """
    if not shapes or len(shapes[0]) != 4:
        raise ValueError("the optimizer's first parameter is not a conv weight: the model is not DigitsCNN")
    model = models.DigitsCNN(in_channels=shapes[0][1], width=shapes[0][0])
    params = list(model.parameters())
    if [list(p.shape) for p in params] != shapes or flat.numel() != sum(p.numel() for p in params):
        raise ValueError("the optimizer's parameters do not match course.models.DigitsCNN's, in order")
    with torch.no_grad():
        offset = 0
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    return model


def union_batch_gradient(flat_params: torch.Tensor, shapes: list[list[int]],
                         indices_by_rank: list[list[int]], train: torch.utils.data.TensorDataset | None = None
                         ) -> torch.Tensor:
    """The flat gradient of the average over ranks of each rank's mean cross-entropy, in one process.

    With equal per-rank batches this is the mean loss over the union batch: what DDP's averaged gradient is.

    Args:
        flat_params: parameters before the step, flat float32, in the optimizer's order.
        shapes: each parameter's shape.
        indices_by_rank: training-sample indices each rank fetched for the step.
        train: the training split (default ``course.data.load().train``).
    """
    model = model_from_flat(flat_params, shapes)
    images, labels = (train or data.load().train).tensors
    batches = [torch.tensor(idx, dtype=torch.long) for idx in indices_by_rank if idx]
    loss = sum(nn.functional.cross_entropy(model(images[b]), labels[b]) for b in batches) / len(batches)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


def compare(step: int, applied: torch.Tensor, reference: torch.Tensor) -> Comparison:
    """Relative error and scale of the ``applied`` gradient against the ``reference`` one."""
    applied, reference = applied.double(), reference.double()
    norm = float(reference.norm()) or 1e-30
    scale = float(applied @ reference) / norm ** 2
    direction = float((applied - scale * reference).norm()) / (abs(scale) * norm or 1e-30)
    return Comparison(step, float((applied - reference).norm()) / norm, scale, direction, float(applied.norm()))


@dataclass(frozen=True)
class Transformation:
    """What was done to the averaged gradient, the same way on every rank and at every step compared.

    Attributes:
        kind: ``"clipped"`` (shortened to one norm at the steps where it was longer) or ``"scaled"`` (multiplied
            by one factor at every step).
        value: the clipping norm, or the factor.
    """

    kind: str
    value: float


def transformation(comparisons: list[Comparison] | tuple[Comparison, ...], tolerance: float
                   ) -> Transformation | None:
    """The transformation that explains the comparisons off by more than ``tolerance``, or None.

    Every one of them must point the way the union-batch gradient does (``direction_error`` within
    ``tolerance``). Clipped: each is shorter (scale below 1) and all share one norm, which no step within
    ``tolerance`` exceeded. Scaled: every comparison has the same scale.
    """
    off = [c for c in comparisons if c.relative_error > tolerance]
    if not off or any(not c.direction_error <= tolerance for c in off):
        return None
    clip = max(c.norm for c in off)
    if all(c.scale < 1 and abs(c.norm / clip - 1) <= 1e-3 for c in off) and all(
            c.norm <= clip * (1 + 1e-3) for c in comparisons if c not in off):
        return Transformation("clipped", clip)
    factor = off[0].scale
    if len(off) == len(comparisons) and all(abs(c.scale / factor - 1) <= 0.01 for c in off):
        return Transformation("scaled", factor)
    return None
