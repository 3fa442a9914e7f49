"""Accuracy after a conversion: the single-device script and its DDP version, side by side, read from their runs.

Converting a script to DDP changes how it trains, not only where: with ``batch_size`` samples per rank, one
optimizer step averages ``world_size`` times as many samples, so an epoch has about ``world_size`` times fewer
steps. The linear scaling rule (Goyal et al. 2017, https://arxiv.org/abs/1706.02677) multiplies the learning rate
by the same factor, after a warmup, so that one large step does the work of the small ones it replaces; that
assumes the gradient changes little over those steps, which fails early in training. :func:`read_run` reads
what a run of a ``notebooks/ddp_steps`` script printed (batch, rate, per-epoch validation accuracy) and
evaluates its checkpoint on the test set; :func:`explain_gap` and :func:`conclusion` put the comparison in words
chosen by the numbers. Taught in ``notebooks/05_ddp.ipynb``.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from course import data, models, train
from course.ddp import scripts as ddp_scripts
from course.runtime import root_cause

_SETTINGS = re.compile(r"^(?:(\d+) rank\(s\), global )?batch (\d+), lr (\S+)$", re.MULTILINE)
_EPOCH = re.compile(r"^epoch (\d+): val loss \S+, val accuracy (\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Run:
    """One finished run of a step script, as it reported itself.

    Attributes:
        label: how the table names it.
        world_size: ranks (1 for the single-device script).
        global_batch_size: samples per optimizer step, over all ranks.
        lr: the peak learning rate the script printed (after any scaling rule).
        steps_per_epoch: optimizer steps in one epoch (:func:`steps_per_epoch`).
        val_accuracies: validation accuracy after each epoch, as printed.
        test_accuracy: the saved checkpoint's accuracy on the test set.
    """

    label: str
    world_size: int
    global_batch_size: int
    lr: float
    steps_per_epoch: int
    val_accuracies: tuple[float, ...]
    test_accuracy: float

    @property
    def steps(self) -> int:
        """Optimizer steps over the whole run."""
        return self.steps_per_epoch * len(self.val_accuracies)

    @property
    def val_accuracy(self) -> float:
        """Validation accuracy after the last epoch."""
        return self.val_accuracies[-1]


def steps_per_epoch(n_samples: int, global_batch_size: int, world_size: int = 1) -> int:
    """Optimizer steps per epoch: each rank's ``ceil(n_samples / world_size)`` samples (DistributedSampler pads)
    in batches of ``global_batch_size / world_size``, the last one partial (DataLoader keeps it).

    Raises:
        ValueError: a count below 1, or a global batch that does not split evenly over the ranks.
    """
    for name, value in (("n_samples", n_samples), ("global_batch_size", global_batch_size),
                        ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")
    if global_batch_size % world_size:
        raise ValueError(f"global_batch_size={global_batch_size} does not split over world_size={world_size} "
                         "ranks: give a multiple of world_size (the per-rank batch times world_size).")
    return math.ceil(math.ceil(n_samples / world_size) / (global_batch_size // world_size))


def run_single_device(script: str | Path, script_args: tuple[str, ...] = (),
                      timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    """Run a single-device ``script`` (``python script ...``) with the course importable; output captured.

    Raises:
        RuntimeError: it failed or timed out; the message ends with its output.
    """
    command = [sys.executable, str(script), *script_args]
    # One thread: the course CNN is too small to gain from more, and on shared cores they only contend.
    env = {**ddp_scripts.torchrun_environment(1), "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or b""  # bytes even with text=True
        output = output.decode(errors="replace") if isinstance(output, bytes) else output
        raise RuntimeError(f"{Path(script).name} did not finish in {timeout_s:g} s; last output:\n"
                           f"{output[-2000:]}") from None
    if done.returncode != 0:
        raise RuntimeError(f"{Path(script).name} failed; last output:\n"
                           f"{root_cause.explain(done.returncode, done.stdout, done.stderr, stdout_chars=1000)}")
    return done


def read_run(label: str, stdout: str, checkpoint: str | Path, splits: data.Splits | None = None) -> Run:
    """A :class:`Run` from what a step script printed and the checkpoint it saved.

    The script's settings line (``batch 32, lr 0.05`` or ``4 rank(s), global batch 128, lr 0.2``) gives the
    world size, global batch and rate; its ``epoch N: ... val accuracy A`` lines the accuracies; the checkpoint,
    loaded into a :class:`~course.models.DigitsCNN`, the test accuracy on ``splits`` (``data.load()`` by default).

    Raises:
        ValueError: the output has no settings line or no epoch lines (not a step script's output?).
    """
    settings = _SETTINGS.search(stdout)
    epochs = _EPOCH.findall(stdout)
    if settings is None or not epochs:
        raise ValueError("expected a step script's output: a line 'batch B, lr L' (or 'N rank(s), global batch B, "
                         f"lr L') and 'epoch N: val loss X, val accuracy A' lines; got:\n{stdout[-1000:]}")
    world_size, global_batch_size, lr = int(settings[1] or 1), int(settings[2]), float(settings[3])
    splits = splits or data.load()
    model = models.DigitsCNN()
    model.load_state_dict(torch.load(checkpoint))
    _, test_accuracy = train.evaluate(model, data.loader(splits.test, 100, shuffle=False))
    return Run(label, world_size, global_batch_size, lr,
               steps_per_epoch(len(splits.train), global_batch_size, world_size),
               tuple(float(accuracy) for _, accuracy in epochs), test_accuracy)


def format_table(runs: list[Run]) -> str:
    """The runs side by side: ranks, global batch, steps per epoch and in all, rate, final val and test accuracy."""
    if not runs:
        raise ValueError("format_table got no runs: pass at least one Run (from read_run).")
    width = max(len(run.label) for run in runs)
    lines = [f"{'run':<{width}}  ranks  global batch  steps/epoch  steps      lr  val acc  test acc"]
    lines += [f"{run.label:<{width}}  {run.world_size:>5}  {run.global_batch_size:>12}  {run.steps_per_epoch:>11}  "
              f"{run.steps:>5}  {run.lr:>6g}  {run.val_accuracy:>7.3f}  {run.test_accuracy:>8.3f}" for run in runs]
    return "\n".join(lines)


def tolerance(accuracy: float, n_samples: int) -> float:
    """Two standard errors of an accuracy measured on ``n_samples``: ``2 * sqrt(p * (1 - p) / n)``.

    Two runs whose accuracies differ by less cannot be told apart on a set of that size.
    """
    if not 0.0 <= accuracy <= 1.0 or isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"expected an accuracy in [0, 1] and n_samples >= 1, got {accuracy!r} and {n_samples!r}.")
    return 2 * math.sqrt(accuracy * (1 - accuracy) / n_samples)


def last_swing(run: Run) -> float:
    """How far ``run``'s validation accuracy moved in its last epoch (0 after a single epoch)."""
    accuracies = run.val_accuracies
    return abs(accuracies[-1] - accuracies[-2]) if len(accuracies) > 1 else 0.0


def margin(reference: Run, other: Run, accuracy: float, n_samples: int) -> float:
    """How close two runs' accuracies must be to count as the same: :func:`tolerance` of ``accuracy``
    (``reference``'s, on a set of ``n_samples``), the sampling noise of the set.

    A run whose accuracy still swings from epoch to epoch does not widen it: a swing says the run is unsettled,
    not that a gap is small (:func:`unsettled`). ``reference`` and ``other`` are kept for callers that name them.
    """
    return tolerance(accuracy, n_samples)


def unsettled(runs: list[Run], gap: float) -> str:
    """A caveat when some run's validation accuracy moved more than ``gap`` in its last epoch, else ``""``."""
    moving = [run for run in runs if last_swing(run) > abs(gap)]
    if not moving:
        return ""
    worst = max(moving, key=last_swing)
    return (f" (but '{worst.label}' moved by {last_swing(worst):.3f} in its last epoch, more than the gap: "
            f"more epochs could change this)")


def gap_verdict(reference: float, before: float, after: float, margin: float) -> str:
    """``"closes"``, ``"narrows"`` or ``"does not close here"``: what a fix did to the gap to ``reference``.

    The gap closes when the fixed run is within ``margin`` of the reference (or above it); it narrows when it
    is still further away but nearer than before the fix.
    """
    if reference - after <= margin:
        return "closes"
    if reference - after < reference - before:
        return "narrows"
    return "does not close here"


def explain_gap(single: Run, converted: Run, n_val: int) -> str:
    """In words chosen by the numbers: how far the converted run is from the single-device one, and its steps."""
    noise = margin(single, converted, single.val_accuracy, n_val)
    gap = single.val_accuracy - converted.val_accuracy
    where = (f"trails the single device by {gap:.3f}{unsettled([single, converted], gap)}" if gap > noise else
             f"matches the single device (within {noise:.3f}, two standard errors on {n_val} samples)")
    return (f"After {len(converted.val_accuracies)} epochs the {converted.world_size}-rank script {where} in "
            f"validation accuracy ({converted.val_accuracy:.3f} vs {single.val_accuracy:.3f}; test "
            f"{converted.test_accuracy:.3f} vs {single.test_accuracy:.3f}). Its global batch is "
            f"{converted.global_batch_size / single.global_batch_size:g}x the single device's, so an epoch is "
            f"{converted.steps_per_epoch} optimizer steps instead of {single.steps_per_epoch}: {converted.steps} "
            f"steps in all against {single.steps} ({single.steps / converted.steps:.1f}x fewer), each at a rate of "
            f"{converted.lr:g} instead of {single.lr:g}.")


def per_step(single: Run, converted: Run, n_val: int) -> str:
    """In words chosen by the numbers: was one large step worth more than one small step, and as much as the
    linear rule promises?

    Compares the converted run's final validation accuracy with the single device's after its first epoch with at
    least as many steps (step for step: higher accuracy in no more steps is more work per step), and after all of
    its steps (the rule's promise: each step at k times the rate does the work of k small ones).
    """
    counts = [single.steps_per_epoch * (epoch + 1) for epoch in range(len(single.val_accuracies))]
    epoch = next((e for e, count in enumerate(counts) if count >= converted.steps), len(counts) - 1)
    early = single.val_accuracies[epoch]
    more = "did more than" if converted.val_accuracy > early else "did not clearly do more than"
    k = converted.global_batch_size / single.global_batch_size
    kept = single.val_accuracy - converted.val_accuracy <= margin(single, converted, single.val_accuracy, n_val)
    return (f"Step for step, a batch of {converted.global_batch_size} {more} a batch of "
            f"{single.global_batch_size}: after {converted.steps} steps the {converted.world_size}-rank run had "
            f"{converted.val_accuracy:.3f}; the single device, after {counts[epoch]} steps, {early:.3f}. The linear "
            f"rule promises that each step at {k:g}x the rate does the work of {k:g} small ones, so that "
            f"{converted.steps} large steps reach what {single.steps} small ones did ({single.val_accuracy:.3f}): "
            f"here {'they did' if kept else 'they did not'}.")


def conclusion(single: Run, converted: Run, fixed: Run, n_val: int, n_test: int) -> str:
    """In words chosen by the numbers: does ``fixed`` close the gap between ``converted`` and ``single``?

    Judged on validation and on test accuracy separately: the same when within :func:`margin`.
    """
    parts = []
    for split, n, get in (("validation", n_val, lambda run: run.val_accuracy),
                          ("test", n_test, lambda run: run.test_accuracy)):
        noise = margin(single, fixed, get(single), n)
        verdict = gap_verdict(get(single), get(converted), get(fixed), noise)
        caveat = unsettled([single, fixed], get(single) - get(fixed)) if split == "validation" else ""
        parts.append(f"on {split} the gap {verdict} ({get(single):.3f} single device, {get(converted):.3f} before "
                     f"the fix, {get(fixed):.3f} after; the same within {noise:.3f}, two standard errors on "
                     f"{n} samples){caveat}")
    return f"With {fixed.steps} steps of a global batch of {fixed.global_batch_size}: " + "; ".join(parts) + "."
