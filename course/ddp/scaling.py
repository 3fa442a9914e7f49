"""Scaling: step time measured on 1, 2, 4 emulated ranks here, honestly, and modelled for real GPUs.

**Measured** (``notebooks/05_ddp.ipynb``): :func:`course.ddp.calibration.measure` times every step of DDP training on
sub-groups of 1, 2 and 4 ranks; :func:`course.timing.summarize` keeps the median with a 95% bootstrap interval, and
:func:`speedup_verdict` flags a speedup above what this machine's cores allow as noise, not a result (4 ranks
on 2 cores can at best run 2x). :mod:`course.ddp.calibration` fits a model of these ranks from 1 and 2 ranks and
predicts the held-out ones, with its error; :func:`plot_measured` draws both.

**Modelled** for real GPUs: :mod:`course.perf.model` (validated against published figures in
:mod:`course.perf.published`); :func:`plot_modelled_scaling` and :func:`plot_modelled_timeline` draw it.
"""

from __future__ import annotations

import numpy as np

from course import timing
from course.ddp.calibration import Calibration
from course.perf.model import KINDS, StepTime
from course.timing import Estimate


def speedup_verdict(one: Estimate, many: Estimate, world_size: int, cores: int) -> tuple[float, str]:
    """Weak-scaling speedup of ``world_size`` ranks over 1 (``world_size`` x the 1-rank step / this step, from
    :func:`course.timing.summarize` of each), and what it means on ``cores`` cores
    (:func:`course.timing.speedup_verdict`: above min(n, c) it is noise, not a result)."""
    speedup = Estimate(world_size * one.median / many.median, world_size * one.low / many.high,
                       world_size * one.high / many.low, min(one.repeats, many.repeats))
    return speedup.median, timing.speedup_verdict(speedup, world_size, cores)


def speedup_against_limit(one: Estimate, many: Estimate, world_size: int, cores: int) -> str:
    """The weak-scaling speedup of ``world_size`` ranks over 1 beside the most ``cores`` cores allow
    (``min(world_size, cores)``), with no faster/slower verdict: near 1x the interval's side of 1 changes from run
    to run on shared cores, so only a speedup beyond what the cores allow is called out (as noise)."""
    speedup = Estimate(world_size * one.median / many.median, world_size * one.low / many.high,
                       world_size * one.high / many.low, min(one.repeats, many.repeats))
    limit = timing.max_speedup(world_size, cores)
    text = f"speedup {speedup.format_ratio()}, of at most {limit:g}x that {world_size} ranks on {cores} core(s) allow"
    return text + (": above that, so noise (a slow baseline), not a result" if speedup.median > limit else "")


def plot_measured(timings: dict[tuple[int, int], Estimate], calibration: Calibration | None = None) -> object:
    """Measured ms per step (median, 95% interval) against ranks, one line per batch size; dashed: the
    calibration's prediction (:mod:`course.ddp.calibration`); dotted: the yardstick, the best these cores allow
    (the 1-rank step times max(1, ranks / cores): flat, as on real GPUs, until the ranks outnumber the cores)."""
    import matplotlib.pyplot as plt

    cores = timing.usable_cores()
    figure, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, batch in enumerate(sorted({b for _, b in timings})):
        sizes = sorted(n for n, b in timings if b == batch)
        med = np.array([timings[n, batch].median for n in sizes]) * 1e3
        err = np.array([[med[j] - timings[n, batch].low * 1e3, timings[n, batch].high * 1e3 - med[j]]
                        for j, n in enumerate(sizes)]).T
        ax.errorbar(sizes, med, yerr=err, fmt="o-", color=f"C{i}", capsize=3, label=f"measured, batch {batch}/rank")
        if 1 in sizes:
            ax.plot(sizes, [med[0] * max(1.0, n / cores) for n in sizes], ":", color=f"C{i}",
                    label=f"best {cores} core(s) allow, batch {batch}")
        if calibration:
            ax.plot(sizes, [calibration.predict(n, batch) * 1e3 for n in sizes], "--", color=f"C{i}",
                    label=f"calibration, batch {batch}")
    ax.set(xlabel="emulated ranks (CPU processes)", ylabel="ms per step", xticks=sorted({n for n, _ in timings}),
           ylim=(0, None), title=f"measured here, on {cores} core(s); dotted: the best they allow")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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


def describe_modelled_step(label: str, curve: dict[int, dict], world_size: int) -> str:
    """A modelled step on ``world_size`` GPUs, term by term, beside the 1-GPU step its efficiency divides by.

    The efficiency is (1-GPU step) / (``world_size``-GPU step) at the same per-GPU batch. A fixed per-step cost
    (the optimizer and the framework's overhead) is paid on 1 GPU too, so it can dwarf compute and communication:
    the words say so when it does.
    """
    step, one = curve[world_size]["step"], curve[1]["step"]
    us = 1e6
    text = (f"modelled, {label} on {world_size} GPUs: step {step.step_s * us:,.0f} µs = compute "
            f"{step.compute_s * us:,.0f} + allreduce not hidden behind backward {step.exposed_comm_s * us:,.0f} "
            f"(of {step.comm_s * us:,.0f}) + optimizer and framework overhead {step.update_s * us:,.0f}; on 1 GPU "
            f"{one.step_s * us:,.0f} µs; scaling efficiency {curve[world_size]['efficiency']:.0%}")
    if step.update_s > step.compute_s + step.exposed_comm_s:
        text += (". The fixed overhead, paid on 1 GPU too, is most of the step: it hides how much the allreduce "
                 "adds to the compute")
    return text + "."
