"""Overlap of gradient communication with backward: measured on the ranks step by step, modelled for GPUs.

The :class:`course.ddp.distributed_optimizer.DistributedOptimizer` records, per step, when backward started and
ended, when each gradient became final and when each bucket's allreduce ran. :func:`record_steps` keeps
every step after a warm-up, :func:`summarize` turns them into medians with intervals: how much of the
communication ran while backward was still computing, and how long the whole step (backward plus the wait
for the last bucket) took.

Emulated ranks share the CPU cores, so an allreduce running "during" backward competes with it for a core:
measured overlap here says *when* things ran, not that they ran in parallel as on a GPU (its copy engines and
NVLink work while its cores compute). :func:`modelled_timeline` gives the GPU picture in closed form:
gradients become final evenly over backward, in backward order; a bucket is sent when its last gradient is
final and the previous bucket is done; each allreduce costs the ring's ``a·α + b·N·β``
(:mod:`course.collectives.cost_model`). Taught in ``notebooks/04b_distributed_optimizer.ipynb``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from course import data, world
from course.arguments import check_count
from course.collectives import cost_model
from course.ddp import buckets
from course.ddp.distributed_optimizer import DistributedOptimizer
from course.models import DigitsCNN
from course.timing import SPEEDUP_MARGIN, Estimate, ratio, summarize

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: A timeline: ``{"backward_end": s, "grads": [s, ...], "allreduces": [(start, end), ...], "step_end": s}``,
#: seconds since backward started.
Timeline = dict[str, Any]


def record_steps(bucket_sizes: Sequence[int], batch_size: int = 64, steps: int = 8, warmup_steps: int = 2
                 ) -> dict[int, list[Timeline]]:
    """Rank function: ``steps`` timed training steps of DigitsCNN per bucket size, after ``warmup_steps``.

    ``step_end`` is when ``optimizer.step()`` returned: backward, plus waiting for the last bucket, plus the
    update.

    Returns:
        ``{bucket_bytes: [timeline, ...]}``, one timeline per timed step (this rank's clock).
    """
    me = world.current()
    images, labels = data.load().train.tensors
    rows = slice(me.rank * batch_size, (me.rank + 1) * batch_size)
    images, labels = images[rows].to(me.device), labels[rows].to(me.device)
    recorded: dict[int, list[Timeline]] = {}
    for bucket_bytes in bucket_sizes:
        torch.manual_seed(0)
        model = DigitsCNN().to(me.device)
        optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model.named_parameters(),
                                         bucket_bytes=bucket_bytes, record_events=True)
        recorded[bucket_bytes] = []
        for step in range(warmup_steps + steps):
            optimizer.events.clear()
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            start = time.perf_counter()
            loss.backward()
            backward_end = time.perf_counter() - start
            optimizer.step()
            step_end = time.perf_counter() - start
            optimizer.zero_grad()
            if step >= warmup_steps:
                recorded[bucket_bytes].append({
                    "backward_end": backward_end, "step_end": step_end,
                    "grads": [e.start - start for e in optimizer.events if e.kind == "grad"],
                    "allreduces": [(e.start - start, e.end - start) for e in optimizer.events
                                   if e.kind == "allreduce"]})
        optimizer.close()
    return recorded


def overlapped_fraction(timeline: Timeline) -> float:
    """Share of the communication time that ran while gradients were still being computed (0: none).

    Backward's computing ends when its last gradient became final (``max(grads)``); ``backward()`` itself
    returns a little later, and an allreduce running in that gap overlaps no computation.
    """
    total = sum(end - start for start, end in timeline["allreduces"])
    computing_end = max(timeline["grads"]) if timeline.get("grads") else timeline["backward_end"]
    hidden = sum(max(0.0, min(end, computing_end) - start) for start, end in timeline["allreduces"])
    return hidden / total if total > 0 else 0.0


@dataclass(frozen=True)
class OverlapSummary:
    """Medians over the timed steps of one bucket size (``step``, ``backward`` in seconds)."""

    bucket_bytes: int
    allreduces: int
    overlapped: Estimate
    backward: Estimate
    step: Estimate
    step_samples: tuple[float, ...]


def summarize_steps(recorded: dict[int, list[Timeline]]) -> list[OverlapSummary]:
    """One :class:`OverlapSummary` per bucket size, from :func:`record_steps`."""
    return [OverlapSummary(bucket_bytes, len(steps[0]["allreduces"]),
                           summarize([overlapped_fraction(t) for t in steps]),
                           summarize([t["backward_end"] for t in steps]), summarize([t["step_end"] for t in steps]),
                           tuple(t["step_end"] for t in steps))
            for bucket_bytes, steps in recorded.items()]


def describe(small: OverlapSummary, big: OverlapSummary) -> str:
    """What the measurement says about small buckets against big ones, in words chosen by the numbers."""
    speed = ratio(big.step_samples, small.step_samples)
    kib = f"{small.bucket_bytes / 1024:g} KiB buckets"
    if speed.low > SPEEDUP_MARGIN or speed.high < 1 / SPEEDUP_MARGIN:  # the band of timing.speedup_verdict
        verdict = (f"the step is {'faster' if speed.median > 1 else 'SLOWER'} with {kib} in this run "
                   f"(big/small step time {speed.format_ratio()})")
    else:
        verdict = (f"the step times cannot be told apart in this run (big/small step time {speed.format_ratio()}, "
                   f"its interval reaches into {1 / SPEEDUP_MARGIN:.2f}-{SPEEDUP_MARGIN:.2f}x, "
                   "where load on shared cores moves it)")
    more = small.overlapped.median > big.overlapped.median
    return (f"measured here: {kib} overlapped {small.overlapped.median:.0%} of their communication with backward, "
            f"one big bucket {big.overlapped.median:.0%} ({'more' if more else 'no more'} overlap with small "
            f"buckets); {verdict}")


def median_step(steps: Sequence[Timeline]) -> Timeline:
    """The timed step whose ``step_end`` is the median one: a representative timeline to draw."""
    return sorted(steps, key=lambda t: t["step_end"])[(len(steps) - 1) // 2]


def modelled_timeline(grad_bytes: Sequence[int], backward_s: float, bucket_bytes: int, world_size: int,
                      link: cost_model.AlphaBeta, update_s: float = 0.0) -> Timeline:
    """The GPU picture in closed form (assumed inputs, not a measurement), in :func:`record_steps`' format.

    Args:
        grad_bytes: bytes of each gradient in **backward order** (last layer first). Gradient ``i`` becomes
            final at ``backward_s·(i+1)/len(grad_bytes)``.
        backward_s: the backward pass's duration. bucket_bytes: as in :func:`course.ddp.buckets.assign_buckets`.
        world_size, link: the ring allreduce's ranks and link (α, β). update_s: the optimizer's update.
    """
    count = check_count("number of gradients", len(grad_bytes))
    if backward_s <= 0:
        raise ValueError(f"backward_s must be a positive number of seconds, got {backward_s!r}.")
    ready = [backward_s * (i + 1) / count for i in range(count)]
    allreduces, free = [], 0.0
    for bucket in buckets.assign_buckets(list(grad_bytes), bucket_bytes):
        start = max(ready[bucket[-1]], free)
        free = start + float(cost_model.predict("ring", sum(grad_bytes[i] for i in bucket), world_size, link))
        allreduces.append((start, free))
    return {"backward_end": backward_s, "grads": ready, "allreduces": allreduces,
            "step_end": max(backward_s, free) + update_s}


def plot(rows: dict[str, Timeline]) -> Figure:
    """One row per labelled timeline: backward (grey, a tick per final gradient), each bucket's allreduce
    (colours), and the end of the step (a black bar). Each row has its own time axis: label it with what
    it is (measured or modelled)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 1, figsize=(10, 0.4 + 1.1 * len(rows)), squeeze=False)
    for ax, (label, t) in zip(axes[:, 0], rows.items(), strict=True):
        scale = 1e3
        ax.broken_barh([(0, t["backward_end"] * scale)], (1.1, 0.8), color="0.75")
        ax.vlines([g * scale for g in t["grads"]], 1.1, 1.9, color="k", linewidth=0.8)
        ax.broken_barh([(a * scale, (b - a) * scale) for a, b in t["allreduces"]], (0.1, 0.8),
                       facecolors=[f"C{i % 10}" for i in range(len(t["allreduces"]))])
        ax.axvline(t["step_end"] * scale, color="k", linewidth=2)
        ax.set(yticks=[0.5, 1.5], yticklabels=["allreduce", "backward"], xlim=(0, None))
        ax.set_title(label, fontsize=9, loc="left")
    for ax in axes[:, 0]:
        ax.set_xlabel("ms since backward() started", fontsize=8)
    fig.tight_layout()
    return fig
