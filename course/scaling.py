"""Scaling: step time measured on 1, 2, 4 emulated ranks here, honestly, and modelled for real GPUs.

**Measured** (``notebooks/05_ddp.ipynb``): :func:`measure_step_samples` times every step of DDP training on
sub-groups of 1, 2 and 4 ranks; :func:`course.timing.summarize` keeps the median with a 95% bootstrap interval, and
:func:`speedup_verdict` flags a speedup above what this machine's cores allow as noise, not a result (4 ranks
on 2 cores can at best run 2x). :func:`fit_calibration` fits a two-term model of these ranks from the 1- and
2-rank timings and predicts the held-out ones, with its error.

**Modelled** for real GPUs: :mod:`course.perf_model` (validated against published figures in
:mod:`course.perf_validation`); :func:`plot_modelled_scaling` and :func:`plot_modelled_timeline` draw it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import data, timing, world
from course.models import DigitsCNN
from course.perf_model import KINDS, StepTime
from course.timing import Estimate


def measure_step_samples(world_sizes: tuple[int, ...] = (1, 2, 4), batch_sizes: tuple[int, ...] = (32,),
                         rounds: int = 5, steps_per_round: int = 2, warmup_steps: int = 2
                         ) -> dict[tuple[int, int], list[float]]:
    """Rank function: seconds of every timed DDP training step on the first n ranks, per (n, per-rank batch).

    Launch it on ``max(world_sizes)`` ranks: the first n ranks form a subgroup and train DigitsCNN with DDP
    (weak scaling: the per-rank batch is fixed) while the others wait, so one launch measures every size.
    The configurations take turns, ``steps_per_round`` steps each per round, so a burst of load from elsewhere
    falls on several of them rather than on whichever ran then (a 1-rank baseline timed alone, first, can come
    out several times too slow and inflate every speedup).

    Returns:
        ``{(n, batch_size): [seconds per step, ...]}`` (``rounds x steps_per_round`` each) on rank 0; ``{}`` on
        the other ranks.
    """
    me = world.current()
    if max(world_sizes) > me.world_size:
        raise ValueError(f"launch on at least {max(world_sizes)} ranks to measure {world_sizes}; got {me.world_size}.")
    images, labels = data.load().train.tensors
    batches = {b: (images[:b].to(me.device), labels[:b].to(me.device)) for b in batch_sizes}
    groups = {n: dist.new_group(list(range(n))) for n in world_sizes}  # every rank must call new_group
    trainers = {n: _trainer(groups[n]) for n in world_sizes if me.rank < n}
    samples: dict[tuple[int, int], list[float]] = {(n, b): [] for n in world_sizes for b in batch_sizes}
    for round_ in range(rounds + 1):  # round 0 warms every configuration up, untimed
        for n in world_sizes:
            for b in batch_sizes:
                if me.rank < n:
                    times = _time_steps(*trainers[n], *batches[b], steps_per_round if round_ else warmup_steps)
                    samples[n, b] += times if round_ else []
                dist.barrier()
    return samples if me.is_main else {}


def _trainer(group: dist.ProcessGroup) -> tuple[nn.Module, torch.optim.Optimizer]:
    me = world.current()
    torch.manual_seed(0)
    device_ids = [me.device.index] if me.device.type == "cuda" else None
    model = DistributedDataParallel(DigitsCNN().to(me.device), device_ids=device_ids, process_group=group)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _time_steps(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels: torch.Tensor,
                steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        if images.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def speedup_verdict(one: Estimate, many: Estimate, world_size: int, cores: int) -> tuple[float, str]:
    """Weak-scaling speedup of ``world_size`` ranks over 1 (``world_size`` x the 1-rank step / this step, from
    :func:`course.timing.summarize` of each), and what it means on ``cores`` cores
    (:func:`course.timing.speedup_verdict`: above min(n, c) it is noise, not a result)."""
    speedup = Estimate(world_size * one.median / many.median, world_size * one.low / many.high,
                       world_size * one.high / many.low, min(one.repeats, many.repeats))
    return speedup.median, timing.speedup_verdict(speedup, world_size, cores)


@dataclass(frozen=True)
class Calibration:
    """Step time of n emulated ranks with per-rank batch B on c cores, fitted on this machine:

    ``(fixed_s + per_sample_s * B) * max(1, n / c) + per_peer_s * (n - 1)``: compute shares the cores, and the
    allreduce adds a cost per extra rank (gloo's ring is latency-bound at DigitsCNN's 360 KB of gradients).
    """

    fixed_s: float
    per_sample_s: float
    per_peer_s: float
    cores: int

    def predict(self, world_size: int, batch_size: int) -> float:
        share = max(1.0, world_size / self.cores)
        return (self.fixed_s + self.per_sample_s * batch_size) * share + self.per_peer_s * (world_size - 1)


def fit_calibration(timings: dict[tuple[int, int], Estimate], cores: int) -> Calibration:
    """Fit :class:`Calibration` from 1-rank timings at two or more batch sizes and 2-rank timings.

    Raises:
        ValueError: fewer than two 1-rank batch sizes, or no 2-rank timing.
    """
    ones = sorted((b, t.median) for (n, b), t in timings.items() if n == 1)
    twos = [(b, t.median) for (n, b), t in timings.items() if n == 2]
    if len(ones) < 2 or not twos:
        raise ValueError(f"need 1-rank timings at >= 2 batch sizes and a 2-rank timing; got {sorted(timings)}.")
    per_sample, fixed = np.polyfit([b for b, _ in ones], [t for _, t in ones], 1)
    partial = Calibration(float(fixed), float(per_sample), 0.0, cores)
    per_peer = float(np.mean([t - partial.predict(2, b) for b, t in twos]))
    return Calibration(float(fixed), float(per_sample), max(0.0, per_peer), cores)


def plot_measured(timings: dict[tuple[int, int], Estimate], calibration: Calibration | None = None) -> object:
    """Measured ms per step (median, 95% interval) against ranks, one line per batch size; dashed: calibration."""
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(5.5, 3.4))
    for i, batch in enumerate(sorted({b for _, b in timings})):
        sizes = sorted(n for n, b in timings if b == batch)
        med = np.array([timings[n, batch].median for n in sizes]) * 1e3
        err = np.array([[med[j] - timings[n, batch].low * 1e3, timings[n, batch].high * 1e3 - med[j]]
                        for j, n in enumerate(sizes)]).T
        ax.errorbar(sizes, med, yerr=err, fmt="o-", color=f"C{i}", capsize=3, label=f"measured, batch {batch}/rank")
        if calibration:
            ax.plot(sizes, [calibration.predict(n, batch) * 1e3 for n in sizes], "--", color=f"C{i}",
                    label=f"calibration, batch {batch}")
    ax.set(xlabel="emulated ranks (CPU processes)", ylabel="ms per step", xticks=sorted({n for n, _ in timings}),
           title=f"measured here, on {timing.usable_cores()} core(s)")
    ax.legend(fontsize=7)
    figure.tight_layout()
    return figure


def plot_modelled_scaling(curves: dict[str, dict[int, dict]]) -> object:
    """Modelled speedup and scaling efficiency against GPUs, one line per label (``perf_model.scaling_curve``)."""
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
    sizes = sorted({n for curve in curves.values() for n in curve})
    left.plot(sizes, sizes, "k--", label="ideal")
    for label, curve in curves.items():
        ns = sorted(curve)
        left.plot(ns, [curve[n]["speedup"] for n in ns], "o-", label=label)
        right.plot(ns, [curve[n]["efficiency"] for n in ns], "o-", label=label)
    left.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="speedup", title="modelled, not measured")
    right.set(xscale="log", xlabel="GPUs", ylabel="scaling efficiency", ylim=(0, 1.05), title="modelled")
    left.legend(fontsize=7)
    figure.tight_layout()
    return figure


def plot_modelled_timeline(steps: dict[str, StepTime], devices: int = 4) -> object:
    """One modelled step per label: a row per device, coloured by what it does (compute, communication, ...)."""
    import matplotlib.pyplot as plt

    colors = dict(zip(KINDS, ("tab:green", "tab:orange", "tab:purple", "0.85"), strict=True))
    figure, axes = plt.subplots(len(steps), 1, figsize=(10, 1.0 + 0.45 * devices * len(steps)), squeeze=False)
    for ax, (label, step) in zip(axes[:, 0], steps.items(), strict=True):
        for row, rank in enumerate(sorted(step.timeline)[:devices]):
            for kind in KINDS:  # communication after compute: it runs beside backward on its own stream
                spans = [(s.start_s * 1e3, (s.end_s - s.start_s) * 1e3) for s in step.timeline[rank] if s.kind == kind]
                if not spans:
                    continue
                height = 0.4 if kind == "communication" else 0.8
                ax.broken_barh(spans, (row - height / 2, height), color=colors[kind], label=kind)
        ax.set(yticks=range(min(devices, len(step.timeline))), yticklabels=[f"GPU {r}" for r in
               sorted(step.timeline)[:devices]], title=f"modelled: {label}", xlabel="ms")
        ax.invert_yaxis()
    legend = {label: handle for ax in axes[:, 0] for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    figure.legend(legend.values(), legend.keys(), loc="upper center", fontsize=7, ncol=4)
    figure.tight_layout(rect=(0, 0, 1, 0.95))  # room for the legend above the first panel
    return figure
