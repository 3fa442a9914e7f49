"""Stale gradients: what the asynchronous parameter server does to convergence, measured in one process.

The asynchronous server of :mod:`course.naive.parameter_server` applies each gradient as it arrives, so a gradient
was computed on parameters that are already some updates old: with W workers of equal speed, about W-1.
:func:`train_with_staleness` replays that deterministically in one process, each gradient computed on the
parameters of ``staleness`` updates ago, so curves for several staleness values compare cleanly, free of the
timing of real ranks. Taught in ``notebooks/03_naive_multi_gpu.ipynb``.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from course.arguments import check_count
from course.naive.parameter_server import apply_gradient, worker_gradient

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def train_with_staleness(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], lr: float,
                         staleness: int, eval_data: tuple[torch.Tensor, torch.Tensor], eval_every: int = 10
                         ) -> list[tuple[int, float]]:
    """SGD where each gradient is computed on the parameters of ``staleness`` updates ago (async SGD's model).

    Staleness 0 is plain SGD; W asynchronous workers of equal speed make each gradient about W-1 updates stale.

    Args:
        model: trained in place. batches: ``(inputs, targets)`` per update. lr: SGD learning rate.
        staleness: updates between reading the parameters and applying the gradient, >= 0.
        eval_data: ``(inputs, targets)`` on which the loss is measured every ``eval_every`` updates.

    Returns:
        ``[(update, loss on eval_data), ...]``, from update 0.

    Raises:
        ValueError: negative staleness.
    """
    staleness = check_count("staleness", staleness, minimum=0, unit="number of updates")
    reader = copy.deepcopy(model)  # holds the stale parameters the gradient is computed on
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    history = collections.deque([parameters_to_vector(model.parameters()).detach().clone()], maxlen=staleness + 1)
    curve = [(0, _loss(model, eval_data))]
    for step, (x, y) in enumerate(batches, start=1):
        vector_to_parameters(history[0], reader.parameters())
        grad, _ = worker_gradient(reader, x, y)
        apply_gradient(model, optimizer, grad)
        history.append(parameters_to_vector(model.parameters()).detach().clone())
        if step % eval_every == 0:
            curve.append((step, _loss(model, eval_data)))
    return curve


@torch.no_grad()
def _loss(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    x, y = data
    device = next(model.parameters()).device
    return nn.functional.cross_entropy(model(x.to(device)), y.to(device)).item()


def plot_curves(curves: dict[str, list[tuple[int, float]]], ax: Axes | None = None) -> Axes:
    """Validation loss against updates, one line per label (e.g. per staleness)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.4))
    for label, curve in curves.items():
        steps, losses = zip(*curve, strict=True)
        ax.plot(steps, losses, label=label)
    ax.set_xlabel("updates applied")
    ax.set_ylabel("validation loss")
    ax.legend()
    return ax
