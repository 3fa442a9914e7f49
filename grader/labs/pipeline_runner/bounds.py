"""The rounding bound of the pipeline labs: how far a stage's gradients may be from the unsplit model's.

A pipeline runs the same model on ``m`` micro-batches and lets each parameter's gradient accumulate over them. The
unsplit model runs the whole batch at once. Every token's own term of a gradient is the same arithmetic in both runs.
What changes is how the ``N`` terms are added, and the loss's scale:

* **the sum over the tokens.** The unsplit model adds all ``N`` terms in one sum, ``gamma~_N`` on the sum of their
  magnitudes. A pipeline adds ``N / m`` terms per micro-batch (``gamma~_{N/m}``), then the ``m`` partial gradients
  in the order the backwards ran (:func:`course.numerics.bounds.reduction_bound`: ``u + gamma_{m-1}``). The terms'
  magnitudes come from the unsplit run (:func:`course.model_parallel.loss_bound.gradient_sums`).
* **the loss's scale.** Each micro-batch's mean loss is divided by ``m``: its gradient is scaled by ``1/m`` and
  ``m/N``, each rounded once. The unsplit model scales by ``1/N``, rounded once. That is ``SCALE_ROUNDINGS u`` of
  each gradient's size, at most.

Both runs are within their own bound of the exact gradient, so they differ by at most the sum. Left out, as in
:mod:`course.model_parallel.loss_bound`: the backward's own rounding of each token's activation gradients.
Used by :mod:`grader.labs.pipeline_runner.check` and :mod:`grader.labs.one_f_one_b.check`; the property test:
``tests/grader/labs/test_pipeline_bounds.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from course.model_parallel import loss_bound, transformer
from course.numerics import bounds
from course.numerics.divergence import GRADIENT, Divergence, Record, first_divergence

#: roundings of the loss's scale: 1/m and m/N on the pipeline's side, 1/N on the unsplit model's
SCALE_ROUNDINGS = 3


def gradient_bounds(model: transformer.Transformer, inputs: torch.Tensor, targets: torch.Tensor,
                    micro_batches: int) -> dict[str, torch.Tensor]:
    """Run the unsplit ``model`` on the whole batch (its gradients left in ``.grad``: the reference) and return,
    for each parameter name, the largest |pipeline's gradient - reference's| rounding allows, element by element
    (float64, on the CPU), for a pipeline of ``micro_batches`` equal micro-batches.

    Raises:
        ValueError: when the batch does not cut into ``micro_batches`` equal micro-batches.
    """
    if micro_batches < 1 or inputs.shape[0] % micro_batches:
        raise ValueError(f"expected a batch of sequences that cuts into {micro_batches} equal micro-batches, got "
                         f"{inputs.shape[0]} sequences: pick a batch size divisible by the number of micro-batches")
    sums = loss_bound.gradient_sums(model, inputs, targets)
    tokens = inputs.numel()
    split = loss_bound.gradient_bound(sums, tokens, micro_batches)
    whole = loss_bound.gradient_bound(sums, tokens, 1)
    scale = SCALE_ROUNDINGS * bounds.unit_roundoff(loss_bound.FLOAT)
    return {name: (split[name] + whole[name] + scale * total).cpu() for name, total in sums.items()}


def first_beyond(stage: nn.Module, reference: dict[str, nn.Parameter], limits: dict[str, torch.Tensor], rank: int
                 ) -> Divergence | None:
    """The first of the stage's gradients, in the order backward makes them (its last parameter first), beyond
    rounding of the unsplit model's (``reference``: name -> parameter), or None when every one is within."""
    names = [name for name, _ in stage.named_parameters()][::-1]
    params = dict(stage.named_parameters())
    mine = [Record(name, GRADIENT, 0, rank, _cpu(params[name].grad)) for name in names]
    theirs = [Record(name, GRADIENT, 0, rank, _cpu(reference[name].grad)) for name in names]
    return first_divergence(mine, theirs, lambda record, _: limits[record.name])


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().cpu()
