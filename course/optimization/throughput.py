"""How many samples per second one device trains at, against batch size: the saturation curve.

A small batch leaves the device idle between tiny kernels (launch and Python overhead per step); a bigger
batch fills it, and samples/s rises until the device is busy. Past that point a bigger batch takes
proportionally longer per step and samples/s stays flat: one device cannot go faster by "just using a
bigger batch". More samples per second from there on needs more devices, each at its own saturating batch:
data parallelism. Taught in ``notebooks/01_gd_vs_sgd.ipynb``.

    result = sweep(DigitsCNN(), (1, 8, 8), 10, batch_sizes=(1, 4, 16, 64, 256), device=device)
    result.samples_per_s, result.saturation_batch_size()
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from course.arguments import check_count, check_model_fits_data
from course.timing import Estimate, summarize

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclass(frozen=True)
class Sweep:
    """Measured training throughput, one entry per batch size.

    Attributes:
        batch_sizes: ``(S,)`` per-device batch sizes, ascending.
        seconds_per_step: ``(S,)`` seconds of one forward + backward pass (the median of the timed steps).
        samples_per_s: ``(S,)`` ``batch_size / seconds_per_step``.
        device: where it was measured, e.g. ``cpu`` or ``cuda:0``.
        steps: per batch size, the :class:`course.timing.Estimate` of seconds per step (median, 95% interval,
            repeats); empty for a sweep built by hand.
    """

    batch_sizes: np.ndarray
    seconds_per_step: np.ndarray
    samples_per_s: np.ndarray
    device: str
    steps: tuple[Estimate, ...] = ()

    def saturation_batch_size(self, fraction: float = 0.9) -> int:
        """The smallest batch size measured at ``fraction`` of the best samples/s or more."""
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}.")
        reached = self.samples_per_s >= fraction * self.samples_per_s.max()
        return int(self.batch_sizes[np.argmax(reached)])


def _check_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    sizes = list(batch_sizes)
    if not sizes:
        raise ValueError("batch_sizes is empty: give at least one batch size, e.g. (8, 32, 128).")
    return sorted(check_count("each of batch_sizes", b, unit="number of samples") for b in sizes)


def _check_input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(input_shape) if isinstance(input_shape, Sequence) else None
    if not shape or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
        raise ValueError(f"input_shape must be the shape of one sample, a non-empty tuple of positive integers "
                         f"such as (1, 8, 8), got {input_shape!r}.")
    return tuple(int(d) for d in shape)


def step_seconds(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, batch_size: int,
                 device: torch.device | str, min_seconds: float = 0.15, min_steps: int = 5) -> list[float]:
    """Wall times of repeated training forward + backward passes (cross-entropy, no optimizer step).

    Random inputs cost the same compute as real ones. One warm-up step is not timed. Returns every timed
    step: :func:`course.timing.summarize` gives their median and its interval (the median, not the minimum:
    it is what a training loop on this machine, shared with other processes, actually gets).

    Args:
        model: on ``device``. input_shape: one sample, e.g. ``(1, 8, 8)``.
        batch_size: samples per pass (per device). min_seconds, min_steps: time at least this long and
            this many steps, whichever is more.
    """
    device = torch.device(device)
    x = torch.rand(batch_size, *input_shape, device=device)
    y = torch.randint(0, num_classes, (batch_size,), device=device)
    model.train()

    def one_step() -> None:
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # time the kernels, not their asynchronous launch

    one_step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_steps or time.perf_counter() - start < min_seconds:
        tic = time.perf_counter()
        one_step()
        times.append(time.perf_counter() - tic)
    return times


def seconds_per_step(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, batch_size: int,
                     device: torch.device | str, min_seconds: float = 0.15, min_steps: int = 5) -> float:
    """The median of :func:`step_seconds`: seconds of one training forward + backward pass."""
    return float(np.median(step_seconds(model, input_shape, num_classes, batch_size, device, min_seconds,
                                        min_steps)))


def sweep(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, batch_sizes: Sequence[int],
          device: torch.device | str, min_seconds: float = 0.15) -> Sweep:
    """Measure :func:`seconds_per_step` at each batch size; samples/s is what to plot.

    Args:
        model: moved to ``device``; its gradients are overwritten (parameters are not changed).
        batch_sizes: per-device batch sizes to try. min_seconds: time spent per batch size.

    Raises:
        ValueError: empty batch sizes, or one that is not a positive integer; an ``input_shape`` the model
            cannot take, or ``num_classes`` not in 1..(the model's outputs).
    """
    sizes = _check_batch_sizes(batch_sizes)
    input_shape = _check_input_shape(input_shape)
    num_classes = check_count("num_classes", num_classes)
    model.to(device)
    # the largest label, so that a num_classes above the model's outputs is caught here, not mid-sweep
    check_model_fits_data(model, nn.functional.cross_entropy, torch.rand(1, *input_shape, device=device),
                          torch.full((1,), num_classes - 1, device=device))
    steps = tuple(summarize(step_seconds(model, input_shape, num_classes, b, device, min_seconds)) for b in sizes)
    seconds, batch = np.array([t.median for t in steps]), np.array(sizes)
    return Sweep(batch, seconds, batch / seconds, str(device), steps)


def plot_sweep(result: Sweep, axes: Sequence[Axes] | None = None) -> Sequence[Axes]:
    """Samples/s and milliseconds per step against batch size (log axes), side by side.

    Returns:
        The two matplotlib axes.
    """
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    saturation = result.saturation_batch_size()
    axes[0].plot(result.batch_sizes, result.samples_per_s, "o-")
    axes[0].axvline(saturation, color="grey", ls="--", label=f"90% of peak from batch {saturation}")
    axes[0].set_ylabel("samples / s")
    axes[0].legend()
    axes[1].plot(result.batch_sizes, 1e3 * result.seconds_per_step, "o-")
    if result.steps:  # the 95% interval of each median
        axes[1].fill_between(result.batch_sizes, [1e3 * t.low for t in result.steps],
                             [1e3 * t.high for t in result.steps], alpha=0.3, label="95% interval")
        axes[1].legend()
    axes[1].set_ylabel("ms per step (median)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"batch size (measured on {result.device})")
    return axes
