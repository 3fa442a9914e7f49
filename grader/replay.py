"""The single-process reference: what one device training on the union of the ranks' batches computes.

Data parallelism on 4 ranks is supposed to be plain SGD on the union batch (notebook 02). The grader takes
the parameters rank 0 held before a step and the indices every rank fetched for it, recomputes the
gradient of the mean loss on that union batch in one process, and compares it with the gradient rank 0's
optimizer actually applied. Summed gradients come out ``world_size`` times too large; missing
synchronisation comes out different altogether.
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
    """

    step: int
    relative_error: float
    scale: float


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
    return Comparison(step, float((applied - reference).norm()) / norm,
                      float(applied @ reference) / norm ** 2)
