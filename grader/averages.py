"""Is a checkpoint an average of the weights rank 0's recorded training produced (EMA, SWA)? Said in words.

An honest script may save an average of its weights rather than the last ones: an exponential moving average
(EMA, ``torch.optim.swa_utils.AveragedModel`` with ``get_ema_multi_avg_fn``, or by hand) or a plain mean over
the last steps or epochs (SWA). Such a checkpoint matches no single recorded step bit for bit, but it is the
student's model. The probes record a fingerprint of rank 0's parameters before the first step and after every
step (:mod:`grader.inrank.fingerprints`: random projections, linear in the parameters), so the grader finds the
average whose fingerprint equals the checkpoint's, among these families:

* EMA with decay ``beta`` (fitted), updated after every step, started from the initial weights or the first
  step's: ``ema = beta * ema + (1 - beta) * weights``;
* the mean of the weights after every step from step ``s`` to the last, or at the end of every epoch from epoch
  ``e`` to the last (SWA's usual schedules).

Only a match within :data:`TOLERANCE` counts, on all the projections at once. :func:`grader.evidence.judge_checkpoint`
asks this only of a checkpoint whose run changed the model through recorded optimizer steps alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Largest relative distance between the checkpoint's projections and an average's (float32 rounding in the
#: student's averaging is about 1e-7).
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Trajectory:
    """Rank 0's recorded weights, as fingerprint projections: before the first step, then after each step."""

    initial: torch.Tensor  # (dims,) float64
    after: torch.Tensor  # (steps, dims)
    epochs: tuple[int, ...]  # the epoch of each step


def _distance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    return float((predicted - target).norm() / target.norm().clamp_min(1e-12))


def ema(trajectory: Trajectory, beta: float, from_initial: bool) -> torch.Tensor:
    """The EMA's projections after the last step (linear: the projections of the averaged weights)."""
    weights = trajectory.after
    start, rest = (trajectory.initial, weights) if from_initial else (weights[0], weights[1:])
    count = len(rest)
    powers = beta ** torch.arange(count - 1, -1, -1, dtype=torch.float64)  # beta^(T-t) for t = 1..T
    return beta ** count * start + (1 - beta) * (powers[:, None] * rest).sum(dim=0)


def _fit_ema(trajectory: Trajectory, target: torch.Tensor, from_initial: bool) -> tuple[float, float]:
    """(distance, beta) of the best EMA decay: a grid over 1 - beta, then a ternary search around its best."""
    grid = torch.logspace(-5, -0.05, 200, dtype=torch.float64).tolist()
    costs = [_distance(ema(trajectory, 1 - gap, from_initial), target) for gap in grid]
    best = min(range(len(grid)), key=costs.__getitem__)
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    for _ in range(60):
        a, b = low + (high - low) / 3, high - (high - low) / 3
        if _distance(ema(trajectory, 1 - a, from_initial), target) < \
                _distance(ema(trajectory, 1 - b, from_initial), target):
            high = b
        else:
            low = a
    gap = (low + high) / 2
    return _distance(ema(trajectory, 1 - gap, from_initial), target), 1 - gap


def _means(trajectory: Trajectory) -> list[tuple[torch.Tensor, str]]:
    """Every suffix mean over steps and over epoch ends, each with its description."""
    after, epochs, count = trajectory.after, trajectory.epochs, len(trajectory.after)
    out = []
    suffix = after.flip(0).cumsum(0).flip(0)  # suffix[i] = sum of steps i..last
    for i in range(count - 1):
        out.append((suffix[i] / (count - i), f"the mean of rank 0's weights after steps {i + 1}-{count} (SWA)"))
    ends = [i for i in range(count) if i + 1 == count or epochs[i + 1] != epochs[i]]
    for k in range(len(ends) - 1):
        chosen = ends[k:]
        first, last = epochs[chosen[0]], epochs[chosen[-1]]
        out.append((after[chosen].mean(dim=0), f"the mean of rank 0's weights at the ends of epochs {first}-{last} "
                    "(SWA)"))
    return out


def explain(trajectory: Trajectory, target: torch.Tensor) -> str | None:
    """How the checkpoint (its projections ``target``) relates to the recorded weights, in words, or None
    when it is no average this module knows."""
    if len(trajectory.after) < 2 or not bool(target.norm() > 0):
        return None
    for from_initial in (True, False):
        distance, beta = _fit_ema(trajectory, target, from_initial)
        if distance <= TOLERANCE:
            start = "the initial weights" if from_initial else "the first step's"
            return (f"an exponential moving average (EMA, decay {beta:.4g}) of rank 0's weights after each "
                    f"optimizer step, started from {start}")
    for mean, words in _means(trajectory):
        if _distance(mean, target) <= TOLERANCE:
            return words
    return None
