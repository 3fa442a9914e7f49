"""Full-batch gradient descent and minibatch SGD, with every update recorded.

Gradient descent takes one step per epoch along the gradient of the loss over the whole training set.
Minibatch SGD cuts each epoch into random batches of ``batch_size`` samples and steps once per batch: more,
noisier steps for the same compute. With ``batch_size`` equal to the dataset size the two are the same
algorithm, and here they give bit-identical parameters. Data parallelism on k GPUs is SGD whose global
batch is k times the per-rank batch, which is why this comparison opens the course.
Taught in ``notebooks/01_gd_vs_sgd.ipynb``.

    traj = sgd(model, loss_fn, x, y, lr=0.1, epochs=5, batch_size=16)
    traj.updates, traj.epochs, traj.wall_time, traj.loss, traj.params   # one row per recorded update
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from course.arguments import check_count, check_model_fits_data

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Trajectory:
    """What an optimizer run went through, one row per recorded update (row 0: before any update).

    Attributes:
        batch_size: samples per update (the dataset size for full-batch gradient descent).
        n: training samples in the dataset.
        updates: ``(R,)`` int, how many updates had been made at each record.
        samples: ``(R,)`` int, how many samples had been processed (updates x batch, the last batch of an
            epoch may be smaller).
        wall_time: ``(R,)`` seconds spent training up to each record, excluding the time spent recording.
        loss: ``(R,)`` loss over the whole training set ``(x, y)`` at each record.
        params: ``(R, P)`` all parameters flattened (``parameters_to_vector`` order) at each record, or
            ``None`` when the run was told not to keep them.
    """

    batch_size: int
    n: int
    updates: np.ndarray
    samples: np.ndarray
    wall_time: np.ndarray
    loss: np.ndarray
    params: np.ndarray | None

    @property
    def epochs(self) -> np.ndarray:
        """``(R,)`` float: passes over the training set at each record."""
        return self.samples / self.n

    @property
    def label(self) -> str:
        """A legend label: ``batch 16`` or ``full batch (N=64)``."""
        return f"full batch (N={self.n})" if self.batch_size == self.n else f"batch {self.batch_size}"


def check_problem(x: torch.Tensor, y: torch.Tensor, lr: float, epochs: int,
                  batch_size: int | None = None) -> None:
    """Raise a ``ValueError`` that says expected vs got for anything :func:`sgd` cannot run on.

    Args:
        x: ``(N, ...)`` inputs. y: ``(N, ...)`` targets. batch_size: ``None`` for full batch.
    """
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValueError(f"x and y must be torch tensors, got {type(x).__name__} and {type(y).__name__}.")
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y) or len(x) == 0:
        raise ValueError(
            f"x and y must hold the same number N >= 1 of samples along dim 0: expected x (N, ...) and "
            f"y (N, ...), got x {tuple(x.shape)} and y {tuple(y.shape)}."
        )
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 or not math.isfinite(lr):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}.")
    check_count("epochs", epochs)
    at_most = f"number of samples (at most {len(x)})"
    if batch_size is not None and check_count("batch_size", batch_size, unit=at_most) > len(x):
        raise ValueError(
            f"batch_size must be an integer from 1 to the number of samples ({len(x)}), got {batch_size!r}. "
            f"Use batch_size={len(x)} (or gradient_descent) for full batch."
        )


def minibatches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """One epoch: a random partition of ``range(n)`` into batches of ``batch_size`` (the last may be smaller).

    Indices within a batch are sorted: a batch is a set, and sorting makes ``batch_size=n`` the whole
    dataset in its original order, so SGD with a full batch reproduces gradient descent bit for bit.

    Yields:
        ``(batch_size,)`` int64 index tensors on the CPU.
    """
    order = torch.randperm(n, generator=generator)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size].sort().values


def step(model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, lr: float) -> torch.Tensor:
    """One plain gradient step ``p <- p - lr * grad_p loss(model(x), y)`` on every trainable parameter.

    Args:
        x, y: a batch, on the model's device. loss_fn: a mean over the batch (e.g. ``mse_loss``).

    Returns:
        The batch loss before the step (a 0-dim tensor, detached).
    """
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(p.grad, alpha=lr)
    return loss.detach()


@torch.no_grad()
def full_loss(model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor) -> float:
    """The loss over the whole dataset ``(x, y)``: the objective both optimizers minimise.

    Raises:
        ValueError: real-valued targets ``y`` whose shape differs from the model's output, which a loss
            such as ``mse_loss`` would silently broadcast into an ``(N, N)`` loss with the wrong gradient.
    """
    output = model(x)
    if y.is_floating_point() and output.shape != y.shape:
        shape = ", ".join(map(str, output.shape))
        raise ValueError(
            f"the model outputs {tuple(output.shape)} but y is {tuple(y.shape)}: expected targets of the "
            f"output's shape (for a neuron, y of shape (N, 1)); y.reshape({shape}) fixes it."
        )
    return float(loss_fn(output, y))


class Recorder:
    """Records loss (and parameters) every ``record_every`` updates; times training, not recording."""

    def __init__(self, model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int, record_every: int, record_params: bool, total_updates: int) -> None:
        record_every = check_count("record_every", record_every)
        self.model, self.loss_fn, self.x, self.y = model, loss_fn, x, y
        self.batch_size, self.record_every, self.total_updates = batch_size, record_every, total_updates
        self.record_params = record_params
        self.rows: list[tuple[int, int, float, float]] = []
        self.params: list[np.ndarray] = []
        self.train_seconds = 0.0
        self._record(0, 0)
        self._tic = time.perf_counter()

    def after_update(self, update: int, samples: int) -> None:
        """Call after every update; records when ``update`` is a multiple of ``record_every`` or the last."""
        if update % self.record_every and update != self.total_updates:
            return
        if self.x.device.type == "cuda":
            torch.cuda.synchronize(self.x.device)  # kernels run asynchronously: wait before reading the clock
        self.train_seconds += time.perf_counter() - self._tic
        self._record(update, samples)
        self._tic = time.perf_counter()

    def _record(self, update: int, samples: int) -> None:
        loss = full_loss(self.model, self.loss_fn, self.x, self.y)
        self.rows.append((update, samples, self.train_seconds, loss))
        if self.record_params:
            vector = nn.utils.parameters_to_vector(self.model.parameters())
            self.params.append(vector.detach().cpu().double().numpy())

    def trajectory(self) -> Trajectory:
        updates, samples, seconds, loss = (np.array(column) for column in zip(*self.rows, strict=True))
        params = np.stack(self.params) if self.record_params else None
        return Trajectory(self.batch_size, len(self.x), updates.astype(int), samples.astype(int),
                          seconds, loss, params)


def gradient_descent(model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, *, lr: float,
                     epochs: int, record_every: int = 1, record_params: bool = True) -> Trajectory:
    """Full-batch gradient descent: one step per epoch along the gradient of the loss over all of ``(x, y)``.

    Args:
        model: trained in place; its parameters and ``x``, ``y`` on one device.
        loss_fn: ``loss_fn(model(x), y)``, a mean over samples.
        x: ``(N, ...)`` inputs. y: ``(N, ...)`` targets.
        lr: learning rate, > 0. epochs: number of updates (one per epoch), >= 1.
        record_every: record every this many updates (the last is always recorded).
        record_params: keep a copy of all parameters at each record (leave off for big models).

    Returns:
        The :class:`Trajectory`, ``epochs + 1`` rows when ``record_every=1``.

    Raises:
        ValueError: mismatched ``x``/``y``, a model that does not fit them, ``lr <= 0``, ``epochs < 1``
            (message says expected vs got).
    """
    check_problem(x, y, lr, epochs)
    check_model_fits_data(model, loss_fn, x, y)
    epochs = int(epochs)
    recorder = Recorder(model, loss_fn, x, y, len(x), record_every, record_params, total_updates=epochs)
    for epoch in range(1, epochs + 1):
        step(model, loss_fn, x, y, lr)
        recorder.after_update(epoch, epoch * len(x))
    return recorder.trajectory()


def sgd(model: nn.Module, loss_fn: LossFn, x: torch.Tensor, y: torch.Tensor, *, lr: float, epochs: int,
        batch_size: int, seed: int = 0, record_every: int = 1, record_params: bool = True) -> Trajectory:
    """Minibatch SGD: each epoch, shuffle, cut into batches of ``batch_size``, step once per batch.

    Same arguments as :func:`gradient_descent`, plus:

    Args:
        batch_size: samples per update, 1..N; the last batch of an epoch may be smaller. ``N`` is
            gradient descent.
        seed: fixes the shuffling, so a run can be repeated exactly.

    Returns:
        The :class:`Trajectory`, ``epochs * ceil(N / batch_size) + 1`` rows when ``record_every=1``.

    Raises:
        ValueError: ``batch_size`` outside 1..N, mismatched ``x``/``y``, a model that does not fit them (wrong
            sample shape, labels beyond its outputs), ``lr <= 0``, ``epochs < 1``.
    """
    check_problem(x, y, lr, epochs, batch_size)
    check_model_fits_data(model, loss_fn, x, y)
    epochs, batch_size = int(epochs), int(batch_size)
    generator = torch.Generator().manual_seed(seed)
    total_updates = epochs * math.ceil(len(x) / batch_size)
    recorder = Recorder(model, loss_fn, x, y, batch_size, record_every, record_params, total_updates)
    update, samples = 0, 0
    for _ in range(epochs):
        for index in minibatches(len(x), batch_size, generator):
            index = index.to(x.device)
            step(model, loss_fn, x[index], y[index], lr)
            update, samples = update + 1, samples + len(index)
            recorder.after_update(update, samples)
    return recorder.trajectory()


def plot_loss_curves(trajectories: Sequence[Trajectory], optimum: float | None = None,
                     axes: Sequence[Axes] | None = None) -> Sequence[Axes]:
    """Loss against epochs, against updates and against wall time, one line per trajectory (3 panels).

    Args:
        optimum: if given, plot ``loss - optimum`` on a log scale (the gap to the best possible loss).
        axes: three matplotlib axes to draw on; a new figure when ``None``.

    Returns:
        The three axes.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(14, 3.8), sharey=True)
    for traj in trajectories:
        gap = traj.loss if optimum is None else np.maximum(traj.loss - optimum, 1e-16)
        for ax, xs in zip(axes, (traj.epochs, traj.updates, traj.wall_time), strict=True):
            ax.plot(xs, gap, label=traj.label, lw=1.2)
    for ax, name in zip(axes, ("epochs", "updates", "wall time (s, training only)"), strict=True):
        ax.set_xlabel(name)
        if name == "updates":
            ax.set_xscale("symlog", linthresh=1)
    axes[0].set_ylabel("loss" if optimum is None else "loss - optimal loss")
    if optimum is not None:
        axes[0].set_yscale("log")
    axes[0].legend()
    return axes
