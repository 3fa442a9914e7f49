"""The input-pipeline bottleneck: a GPU that waits for data trains no faster, however many GPUs you add.

Every sample goes through a per-sample transform (decode, crop, augment) on the CPU before the device sees
it. With ``num_workers=0`` the training loop does that work itself, serially, and the device idles; with
``W`` DataLoader worker processes the transforms run in parallel with training. A simple model of the
loop (:func:`modelled_samples_per_s`): the data side delivers ``W / t_transform`` samples per second, the
device consumes ``1 / t_compute``, and the loop runs at the slower of the two. :func:`measure` times the
real loop and splits each step into *waiting for data* and *computing*; :func:`sweep` does it for several
``num_workers``. Taught in ``notebooks/03_naive_multi_gpu.ipynb``.

The transform's cost is configurable (:class:`SlowTransform`): ``kind="sleep"`` waits like reading and
decoding from disk does (scales with workers past the core count); ``kind="spin"`` burns CPU like a heavy
augmentation does (scales only up to the number of free cores).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from course.arguments import check_count

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from course.timing import Estimate


class SlowTransform:
    """A random one-pixel shift (a real augmentation) that also costs ``cost_s`` seconds per sample.

    Args:
        cost_s: seconds each sample takes, >= 0.
        kind: ``"sleep"`` (I/O-like wait) or ``"spin"`` (CPU-bound busy loop).
    """

    def __init__(self, cost_s: float = 0.002, kind: str = "sleep") -> None:
        if cost_s < 0:
            raise ValueError(f"cost_s must be >= 0 seconds, got {cost_s}.")
        if kind not in ("sleep", "spin"):
            raise ValueError(f"kind must be 'sleep' or 'spin', got {kind!r}.")
        self.cost_s, self.kind = cost_s, kind

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        """``(C, H, W)`` -> ``(C, H, W)``, shifted by up to one pixel each way."""
        end = time.perf_counter() + self.cost_s
        if self.kind == "sleep":
            time.sleep(self.cost_s)
        while time.perf_counter() < end:  # spin; also tops up a sleep that woke early
            pass
        dy, dx = torch.randint(-1, 2, (2,)).tolist()
        return torch.roll(image, shifts=(dy, dx), dims=(-2, -1))


class TransformedDataset(Dataset):
    """``(image, label)`` pairs of ``dataset`` with ``transform`` applied to each image as it is read."""

    def __init__(self, dataset: Dataset, transform: SlowTransform) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = self.dataset[index]
        return self.transform(image), label


@dataclass(frozen=True)
class Measurement:
    """One timed training loop.

    Attributes:
        num_workers: DataLoader worker processes. samples_per_s: training throughput.
        wait_fraction: share of the loop's time spent waiting for the next batch (the device idles).
        steps: batches timed (the first, which includes starting the workers, is not).
    """

    num_workers: int
    samples_per_s: float
    wait_fraction: float
    steps: int


def measure(dataset: Dataset, model: nn.Module, batch_size: int, num_workers: int, steps: int = 10,
            device: torch.device | str = "cpu", pin_memory: bool = False, prefetch_factor: int = 2) -> Measurement:
    """Train ``model`` (SGD) on ``steps`` batches of ``dataset`` and time waiting for data vs computing.

    Args:
        dataset: yields ``(image, label)``, e.g. a :class:`TransformedDataset`. batch_size: per device.
        num_workers: DataLoader worker processes; 0 = the loop transforms every sample itself.
        steps: batches to time. pin_memory: page-locked host batches (faster copies to a GPU; no effect on CPU).
        prefetch_factor: batches each worker prepares ahead (only with workers).

    Raises:
        ValueError: fewer than ``(steps + 1) x batch_size`` samples, or negative ``num_workers``.
    """
    num_workers = check_count("num_workers", num_workers, minimum=0, unit="number of loader processes")
    if len(dataset) < (steps + 1) * batch_size:
        raise ValueError(f"{steps} timed steps (+1 warm-up) of batch size {batch_size} need "
                         f"{(steps + 1) * batch_size} samples, the dataset has {len(dataset)}: use fewer steps.")
    device = torch.device(device)
    with warnings.catch_warnings():
        # torch warns about more workers than cores; waiting (I/O-like) workers are exactly the case it allows.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                            pin_memory=pin_memory and device.type == "cuda", drop_last=True,
                            prefetch_factor=prefetch_factor if num_workers else None)
        batches = iter(loader)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    waited = 0.0
    next(batches)  # worker start-up is paid once per run, not per step: leave it out
    start = time.perf_counter()
    for _ in range(steps):
        tic = time.perf_counter()
        images, labels = next(batches)
        waited += time.perf_counter() - tic
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(images.to(device, non_blocking=True)), labels.to(device)).backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    del batches  # stops the workers now
    return Measurement(num_workers, steps * batch_size / elapsed, waited / elapsed, steps)


def data_seconds_per_sample(dataset: Dataset, batch_size: int, steps: int = 3) -> float:
    """Seconds the loop spends per sample to read, transform and collate ``steps`` batches itself (no workers).

    What the model's ``transform_s`` should be: the transform's nominal cost plus indexing, collating and timer
    overshoot.
    """
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=0)
    batches = iter(loader)
    start = time.perf_counter()
    for _ in range(steps):
        next(batches)
    return (time.perf_counter() - start) / (steps * batch_size)


def sweep(dataset: Dataset, model: nn.Module, batch_size: int, num_workers: Sequence[int] = (0, 1, 2, 4),
          steps: int = 10, device: torch.device | str = "cpu") -> list[Measurement]:
    """:func:`measure` for each number of workers, in order."""
    return [measure(dataset, model, batch_size, w, steps, device) for w in num_workers]


def modelled_samples_per_s(transform_s: float, compute_s: float, num_workers: int, cores: int | None = None,
                           kind: str = "sleep") -> float:
    """Throughput of the loop in the simple model: ``min(data rate, device rate)`` with workers, serial without.

    Args:
        transform_s: seconds to transform one sample. compute_s: device seconds per sample (training step / batch).
        num_workers: 0 = serial: ``1 / (transform_s + compute_s)``. Otherwise ``min(W' / transform_s,
            1 / compute_s)``, where ``W' = W`` for ``"sleep"`` transforms and ``min(W, cores)`` for ``"spin"``.
        cores: CPU cores free for workers (only used for ``"spin"``).
    """
    if num_workers < 0 or transform_s < 0 or compute_s <= 0:
        raise ValueError(f"need num_workers >= 0, transform_s >= 0, compute_s > 0; got {num_workers}, "
                         f"{transform_s}, {compute_s}.")
    if num_workers == 0:
        return 1.0 / (transform_s + compute_s)
    parallel = num_workers if kind == "sleep" else min(num_workers, cores or num_workers)
    data_rate = parallel / transform_s if transform_s > 0 else float("inf")
    return min(data_rate, 1.0 / compute_s)


def workers_needed(transform_s: float, compute_s: float) -> int:
    """The fewest workers that keep the device busy in the model: ``ceil(transform_s / compute_s)``."""
    if compute_s <= 0:
        raise ValueError(f"compute_s must be > 0, got {compute_s}.")
    return max(1, -int(-transform_s // compute_s))


def plot_sweep(measured: Sequence[Measurement], modelled: Sequence[float] | None = None,
               axes: Sequence[Axes] | None = None, rates: Sequence[Estimate] | None = None) -> Sequence[Axes]:
    """Samples/s (measured, and modelled if given) and the fraction of time waiting for data, against workers.

    Args:
        measured: one sweep (:func:`sweep`); its waiting fractions are the bars.
        modelled: :func:`modelled_samples_per_s` per worker count, drawn dashed.
        rates: the samples/s of several sweeps summarized (:func:`course.timing.summarize`), one per worker count:
            drawn as medians with their intervals instead of ``measured``'s own rates, so the plot shows the
            numbers a notebook prints beside it (notebook 03).
    """
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 3.4))
    workers = [m.num_workers for m in measured]
    if rates is None:
        axes[0].plot(workers, [m.samples_per_s for m in measured], "o-", label="measured")
    else:
        if len(rates) != len(measured):
            raise ValueError(f"expected one rate per worker count ({len(measured)}), got {len(rates)}: summarize "
                             "each worker count's samples/s over the runs")
        low = [r.median - r.low for r in rates]
        high = [r.high - r.median for r in rates]
        axes[0].errorbar(workers, [r.median for r in rates], yerr=[low, high], fmt="o-", capsize=3,
                         label=f"measured: median of {min(r.repeats for r in rates)} runs, 95% interval")
    if modelled is not None:
        axes[0].plot(workers, modelled, "k--", label="model: min(data rate, device rate); serial at 0 workers")
    axes[0].set_ylabel("samples / s")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(fontsize=9, loc="upper left", bbox_to_anchor=(0, -0.2), frameon=False)  # below: clear of the data
    axes[1].bar([str(w) for w in workers], [100 * m.wait_fraction for m in measured])
    axes[1].set_ylabel("% of time waiting for data" + ("" if rates is None else " (one run)"))
    for ax in axes:
        ax.set_xlabel("DataLoader num_workers")
    axes[0].set_xticks(workers)
    return axes
