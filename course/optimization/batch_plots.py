"""Plots for ``notebooks/02_large_batch.ipynb``: thin matplotlib views over the results of
:mod:`course.optimization.noise_scale` and :mod:`course.optimization.batch_sweep` (which compute everything and are
tested alone)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib import ticker
from matplotlib.figure import Figure

from course.optimization.batch_sweep import RunResult
from course.optimization.noise_scale import TrackPoint


def noise_scale_during_training(points: Sequence[TrackPoint]) -> Figure:
    """Training loss and both B_simple estimates against the step."""
    steps = [p.step for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.plot(steps, [p.loss for p in points], marker="o")
    left.set(xlabel="SGD step", ylabel="training loss", title="the loss falls...")
    right.plot(steps, [p.per_sample.b_simple for p in points], marker="o", label="per-sample gradients")
    right.plot(steps, [p.two_batch.b_simple for p in points], marker="s", label="two-batch (free in data parallel)")
    right.set(xlabel="SGD step", ylabel="B_simple (samples)", yscale="log", title="...and the noise scale grows")
    right.legend()
    fig.tight_layout()
    return fig


def _by_batch(results: Sequence[RunResult], rule: str, warmup_steps: int) -> list[RunResult]:
    return sorted((r for r in results if r.rule == rule and r.warmup_steps == warmup_steps),
                  key=lambda r: r.global_batch_size)


def target_text(target_accuracy: float) -> str:
    """The target as the plot's axes and the notebook's printout both write it (``0.955`` -> ``"95.5%"``)."""
    return f"{target_accuracy:.1%}"


def steps_and_epochs_to_target(results: Sequence[RunResult], target_accuracy: float) -> Figure:
    """Steps- and epochs-to-target against global batch size, one line per rule x warmup; runs that never
    reached the target are left out. The dotted line is perfect scaling from the smallest batch.

    Raises:
        ValueError: no run reached the target (there is nothing to draw).
    """
    if not any(r.steps_to_target for r in results):
        raise ValueError(f"none of the {len(results)} runs reached {target_text(target_accuracy)} accuracy, so "
                         f"there are no steps-to-target to plot: raise SweepConfig.max_steps or lower target_accuracy.")
    fig, (steps_ax, epochs_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for rule in dict.fromkeys(r.rule for r in results):
        for warmup in sorted({r.warmup_steps for r in results}):
            runs = [r for r in _by_batch(results, rule, warmup) if r.steps_to_target is not None]
            style = dict(marker="o", linestyle="-" if warmup else "--", label=f"{rule}, warmup {warmup} steps")
            steps_ax.plot([r.global_batch_size for r in runs], [r.steps_to_target for r in runs], **style)
            epochs_ax.plot([r.global_batch_size for r in runs], [r.epochs_to_target for r in runs], **style)
    reference = min((r for r in results if r.steps_to_target), key=lambda r: (r.global_batch_size, r.steps_to_target))
    sizes = sorted({r.global_batch_size for r in results})
    steps_ax.plot(sizes, [reference.steps_to_target * reference.global_batch_size / b for b in sizes], "k:",
                  label="perfect scaling")
    for ax, label in ((steps_ax, "steps"), (epochs_ax, "epochs")):
        ax.set(xscale="log", yscale="log", xlabel="global batch size",
               ylabel=f"{label} to {target_text(target_accuracy)} val. accuracy")
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.yaxis.set_major_formatter(ticker.LogFormatter())  # plain 10, 20, 30: not 2 x 10^1 beside 10
        ax.yaxis.set_minor_formatter(ticker.LogFormatter(minor_thresholds=(2, 0.4)))
    handles, labels = steps_ax.get_legend_handles_labels()  # one legend for both panels, below them, legible
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.06 * ((len(labels) - 1) // 4), 1, 1))
    return fig


def warmup_losses(cold: RunResult, warm: RunResult, steps: int = 30) -> Figure:
    """The first ``steps`` training losses of the same run without and with warmup."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for run in (cold, warm):
        ax.plot(range(1, len(run.losses[:steps]) + 1), run.losses[:steps], marker=".",
                label=f"warmup {run.warmup_steps} steps")
    ax.set(yscale="log", xlabel="step", ylabel="training loss (batch)",
           title=f"global batch {cold.global_batch_size}, lr {cold.lr:g} ({cold.rule} rule)")
    ax.legend()
    fig.tight_layout()
    return fig


def accuracy_against_batch_size(runs: Sequence[RunResult], title: str) -> Figure:
    """Final training and validation accuracy against global batch size; ``title`` says how long each trained."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    sizes = [r.global_batch_size for r in runs]
    ax.plot(sizes, [r.train_accuracy for r in runs], marker="o", label="training")
    ax.plot(sizes, [r.val_accuracy for r in runs], marker="s", label="validation")
    for size, run in zip(sizes, runs, strict=True):  # the values, since the axis starts at 0
        ax.annotate(f"{run.val_accuracy:.3f}", (size, run.val_accuracy), textcoords="offset points", xytext=(0, -14),
                    ha="center", fontsize=8)
    ax.set(xscale="log", xlabel="global batch size", ylabel="accuracy (axis from 0)", title=title, ylim=(0, 1.05))
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.legend()
    fig.tight_layout()
    return fig


def optimizers_against_lr(results: dict[str, Sequence[RunResult]], max_steps: int) -> Figure:
    """Steps-to-target against the learning rate for each optimizer; a run that missed is drawn at the budget."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, runs in results.items():
        ax.plot([r.lr for r in runs], [r.steps_to_target or max_steps for r in runs], marker="o", label=name)
    ax.axhline(max_steps, color="grey", linestyle=":", label="budget (target not reached)")
    ax.set(xscale="log", xlabel="learning rate", ylabel="steps to target")
    ax.legend()
    fig.tight_layout()
    return fig

