"""Scaling: step time measured on 1, 2, 4 ranks here, and predicted for real GPUs with a simple model.

The model, taught in ``notebooks/05_ddp.ipynb``: one data-parallel step costs

    compute = 3 x FLOPs per sample x per-rank batch size / (peak FLOP/s x efficiency)
    comm    = 2 (n - 1) alpha + 2 (n - 1) / n x gradient bytes / link bandwidth     (ring, course.cost_model)
    step    = compute + comm,  or  max(compute, comm) when communication overlaps backward perfectly

:func:`record_timeline` and :func:`plot_timeline` show, inside one step, how much of the allreduce hides behind
backward (``notebooks/04b_distributed_optimizer.ipynb``). Every GPU number in :class:`GpuAssumptions` is an
*assumption* to be replaced by your hardware's; nothing here is measured on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import cost_model, data, world
from course.distributed_optimizer import DistributedOptimizer
from course.models import DigitsCNN


@dataclass(frozen=True)
class GpuAssumptions:
    """What the performance model assumes about a real GPU and its links (assumed, not measured)."""

    name: str = "assumed GPU"
    peak_flops: float = 100e12      # dense 16-bit FLOP/s of one GPU, the order of an A100-class card
    efficiency: float = 0.3         # fraction of peak a training step reaches (a small CNN reaches less)
    link_bandwidth: float = 100e9   # bytes/s each GPU sends and receives in the allreduce (NVLink-class)
    latency_s: float = 10e-6        # alpha: fixed cost of one message between two GPUs, seconds


@dataclass(frozen=True)
class Prediction:
    """Modelled time of one data-parallel step on ``world_size`` GPUs, in seconds, and what it buys."""

    world_size: int
    compute_s: float
    comm_s: float
    step_s: float

    @property
    def comm_fraction(self) -> float:
        return self.comm_s / self.step_s if self.step_s else 0.0


def predict_step(world_size: int, batch_size: int, flops_per_sample: float, gradient_bytes: float,
                 gpu: GpuAssumptions = GpuAssumptions(), overlap: bool = False) -> Prediction:
    """Model one step of data parallelism with a per-rank ``batch_size`` (weak scaling).

    Args:
        flops_per_sample: forward FLOPs of one sample (``course.models.flops_per_sample``); a training step
            costs 3x (forward, backward for activations and for weights).
        gradient_bytes: bytes each rank allreduces per step (``course.models.gradient_bytes``).
        overlap: True if communication hides entirely behind backward (the best case of bucketing).
    """
    if world_size < 1 or batch_size < 1:
        raise ValueError(f"world_size and batch_size must be >= 1, got {world_size} and {batch_size}.")
    compute = 3 * flops_per_sample * batch_size / (gpu.peak_flops * gpu.efficiency)
    link = cost_model.AlphaBeta(alpha_s=gpu.latency_s, beta_s_per_byte=1.0 / gpu.link_bandwidth)
    comm = float(cost_model.predict("ring", gradient_bytes, world_size, link))
    step = max(compute, comm) if overlap else compute + comm
    return Prediction(world_size, compute, comm, step)


def speedup(step_s: dict[int, float]) -> dict[int, float]:
    """Weak-scaling speedup: throughput on n ranks over throughput on 1 (ideal: n).

    Args:
        step_s: seconds per step by world size, with the same per-rank batch; must contain 1.
    """
    if 1 not in step_s:
        raise ValueError(f"speedup needs the 1-rank time as its baseline; got world sizes {sorted(step_s)}.")
    return {n: n * step_s[1] / seconds for n, seconds in step_s.items()}


def measure_step_times(world_sizes: tuple[int, ...] = (1, 2, 4), batch_size: int = 32, steps: int = 5,
                       warmup_steps: int = 2) -> dict[int, float]:
    """Rank function: median seconds per DDP training step on the first n ranks, for each n in ``world_sizes``.

    Launch it on ``max(world_sizes)`` ranks: the first n ranks form a subgroup and train DigitsCNN with DDP
    (per-rank ``batch_size``, weak scaling) while the others wait, so one launch measures every size.

    Returns:
        ``{n: seconds per step}`` on rank 0; ``{}`` on the other ranks.
    """
    me = world.current()
    if max(world_sizes) > me.world_size:
        raise ValueError(f"launch on at least {max(world_sizes)} ranks to measure {world_sizes}; got {me.world_size}.")
    images, labels = data.load().train.tensors
    images, labels = images[:batch_size].to(me.device), labels[:batch_size].to(me.device)
    times: dict[int, float] = {}
    for n in world_sizes:
        group = dist.new_group(list(range(n)))  # every rank must call new_group, members or not
        if me.rank < n:
            torch.manual_seed(0)
            device_ids = [me.device.index] if me.device.type == "cuda" else None
            model = DistributedDataParallel(DigitsCNN().to(me.device), device_ids=device_ids, process_group=group)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            samples = []
            for step in range(warmup_steps + steps):
                start = time.perf_counter()
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(images), labels).backward()
                optimizer.step()
                if me.device.type == "cuda":
                    torch.cuda.synchronize()
                if step >= warmup_steps:
                    samples.append(time.perf_counter() - start)
            times[n] = sorted(samples)[len(samples) // 2]
        dist.barrier()
    return times if me.is_main else {}


def plot_scaling(measured: dict[int, float], predicted: dict[int, Prediction], title_model: str = "") -> object:
    """Two panels: speedup measured on emulated GPUs, and step time modelled for real ones (compute vs comm)."""
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    sizes = sorted(measured)
    left.plot(sizes, sizes, "k--", label="ideal")
    left.plot(sizes, [speedup(measured)[n] for n in sizes], "o-", label="measured (emulated GPUs)")
    left.set(xlabel="ranks", ylabel="speedup (weak scaling)", xticks=sizes, title="measured here")
    left.legend()
    sizes = sorted(predicted)
    compute = [predicted[n].compute_s * 1e6 for n in sizes]
    comm = [predicted[n].comm_s * 1e6 for n in sizes]
    right.bar([str(n) for n in sizes], compute, label="compute")
    right.bar([str(n) for n in sizes], comm, bottom=compute, label="allreduce")
    right.set(xlabel="GPUs", ylabel="µs per step", title=f"modelled for real GPUs {title_model}".strip())
    right.legend()
    figure.tight_layout()
    return figure


def record_timeline(bucket_sizes: Sequence[int], batch_size: int = 64, steps: int = 3) -> dict[int, dict]:
    """Rank function: one training step's backward and allreduce times, for each bucket size.

    Trains DigitsCNN with a :class:`DistributedOptimizer` for ``steps`` steps per bucket size and keeps the
    last step (the first ones warm up). Times are seconds since that step's ``backward()`` started.

    Returns:
        ``{bucket_bytes: {"backward_end": s, "grads": [s, ...], "allreduces": [(start, end), ...]}}``.
    """
    me = world.current()
    images, labels = data.load().train.tensors
    rows = slice(me.rank * batch_size, (me.rank + 1) * batch_size)
    images, labels = images[rows].to(me.device), labels[rows].to(me.device)
    timelines = {}
    for bucket_bytes in bucket_sizes:
        torch.manual_seed(0)
        model = DigitsCNN().to(me.device)
        optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                         bucket_bytes=bucket_bytes, record_events=True)
        for _ in range(steps):
            optimizer.events.clear()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            start = time.perf_counter()
            loss.backward()
            backward_end = time.perf_counter() - start
            optimizer.step()
            optimizer.zero_grad()
        optimizer.close()
        timelines[bucket_bytes] = {
            "backward_end": backward_end,
            "grads": [e.start - start for e in optimizer.events if e.kind == "grad"],
            "allreduces": [(e.start - start, e.end - start) for e in optimizer.events if e.kind == "allreduce"],
        }
    return timelines


def plot_timeline(timelines: dict[int, dict]) -> object:
    """One row per bucket size: backward (grey, with a tick per finished gradient) and each bucket's allreduce."""
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(10, 1.2 + 0.9 * len(timelines)))
    for row, (bucket_bytes, timeline) in enumerate(timelines.items()):
        y = 2 * row
        ax.broken_barh([(0, timeline["backward_end"] * 1e3)], (y + 0.55, 0.8), color="0.75")
        ax.vlines([t * 1e3 for t in timeline["grads"]], y + 0.55, y + 1.35, color="k", linewidth=0.8)
        ax.broken_barh([(a * 1e3, (b - a) * 1e3) for a, b in timeline["allreduces"]], (y - 0.35, 0.8),
                       facecolors=[f"C{i % 10}" for i in range(len(timeline["allreduces"]))])
        ax.text(0, y + 1.45, f"{bucket_bytes / 1024:g} KiB buckets: backward (grey), allreduce per bucket (colour)",
                fontsize=8)
    ax.set(xlabel="ms since backward() started", yticks=[])
    figure.tight_layout()
    return figure
