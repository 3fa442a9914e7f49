"""How far apart do two runs of the same script land? The single device's seed-to-seed spread, as a yardstick.

A converted script "matches" the single device when its accuracy lies where another run of the single device,
with another seed, could land. :func:`single_device_runs` trains what ``notebooks/ddp_steps/step0_single_device.py``
trains, in this process, once per seed (seed 0 is that script's run, bit for bit: ``tests/ddp/test_seed_band.py``),
and records the validation accuracy after chosen steps and after each epoch. :func:`band` turns one number per
seed into a 95% prediction interval for one more run; :func:`compare` and :func:`step_for_step` put a 4-rank run
beside it in words chosen by the numbers. Taught in ``notebooks/05_ddp.ipynb``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader

from course import data, models, train
from course.ddp import conversion_accuracy


@dataclass(frozen=True)
class SeedRun:
    """One single-device run: ``val_at`` maps a step count to the validation accuracy after that many steps."""

    seed: int
    val_at: dict[int, float]
    val_accuracies: tuple[float, ...]  # after each epoch, as step 0 prints them
    test_accuracy: float


@dataclass(frozen=True)
class Band:
    """A 95% prediction interval for one more run's value, from ``n`` runs (mean ± t·s·√(1 + 1/n)), within [0, 1]."""

    mean: float
    low: float
    high: float
    n: int

    def holds(self, value: float) -> bool:
        """True when ``value`` lies inside the interval."""
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.low:.3f}-{self.high:.3f} (mean {self.mean:.3f} over {self.n} seeds)"


def _accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Accuracy on a whole split at once: no DataLoader, so the random state the training draws from is untouched."""
    model.eval()
    with torch.no_grad():
        correct = (model(images).argmax(dim=1) == labels).sum().item()
    model.train()
    return correct / len(labels)


def single_device_run(seed: int, epochs: int, batch_size: int = 32, lr: float = 0.05,
                      at_steps: Iterable[int] = ()) -> SeedRun:
    """Step 0's training (SGD with momentum 0.9 on the digits CNN) with ``seed``; accuracies recorded on the way.

    Args:
        seed: what ``train.seed_everything`` gets (step 0 uses 0).
        epochs, batch_size, lr: step 0's ``--epochs``, ``--batch-size`` and ``--lr``.
        at_steps: step counts after which to record the validation accuracy as well.
    """
    train.seed_everything(seed)
    splits = data.load()
    train_loader = DataLoader(splits.train, batch_size=batch_size, shuffle=True)
    val_loader = DataLoader(splits.val, batch_size=100)  # as step 0 evaluates: its iterator draws a seed too
    model = models.DigitsCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    wanted, val_at, per_epoch, step = set(at_steps), {}, [], 0
    for _ in range(epochs):
        model.train()
        for images, labels in train_loader:
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(images), labels).backward()
            optimizer.step()
            step += 1
            if step in wanted:
                val_at[step] = _accuracy(model, *splits.val.tensors)
        per_epoch.append(train.evaluate(model, val_loader)[1])
    return SeedRun(seed, val_at, tuple(per_epoch), _accuracy(model, *splits.test.tensors))


def single_device_runs(seeds: Iterable[int], epochs: int, at_steps: Iterable[int] = (), **settings: float
                       ) -> list[SeedRun]:
    """:func:`single_device_run` for each of ``seeds``."""
    steps = tuple(at_steps)
    return [single_device_run(seed, epochs, at_steps=steps, **settings) for seed in seeds]


def band(values: Iterable[float]) -> Band:
    """The 95% prediction interval for one more run's accuracy, from the accuracies of several (at least 2).

    Raises:
        ValueError: fewer than 2 values: one run says nothing about the spread.
    """
    values = list(values)
    if len(values) < 2:
        raise ValueError(f"expected the values of at least 2 seeds, got {len(values)}: run more seeds")
    n, mean, spread = len(values), statistics.fmean(values), statistics.stdev(values)
    half = float(stats.t.ppf(0.975, n - 1)) * spread * math.sqrt(1 + 1 / n)
    return Band(mean, max(0.0, mean - half), min(1.0, mean + half), n)  # an accuracy: no interval beyond [0, 1]


def compare(label: str, value: float, yardstick: Band, what: str) -> str:
    """One sentence: ``label``'s ``value`` inside, above or below the single device's band for ``what``."""
    if yardstick.holds(value):
        verdict = "inside it: as close as two runs of the single device with different seeds"
    elif value > yardstick.high:
        verdict = "above it: better than another seed of the single device would likely be"
    else:
        verdict = "below it: further than the seed-to-seed noise explains"
    return f"{what}: {label} {value:.3f}; the single device's seeds {yardstick}; {verdict}."


def step_for_step(steps: int, value: float, yardstick: Band, total_steps: int) -> str:
    """One sentence: after ``steps`` steps, was the large-batch run behind the single device at the same steps?"""
    behind = value < yardstick.low
    return (f"Step for step: after its {steps} steps the 4-rank run had {value:.3f}; the single device after "
            f"{steps} steps had {yardstick}. "
            + ("So each large step did less than a small one: warmup and the raised rate cost accuracy early on."
               if behind else
               f"So its large steps did at least as much as small ones: it trails only because it stopped at "
               f"{steps} steps, where the single device went on to {total_steps}."))


def as_run(seed_run: SeedRun, label: str, batch_size: int = 32, lr: float = 0.05) -> conversion_accuracy.Run:
    """A seed's run as :mod:`course.ddp.conversion_accuracy` tabulates the step scripts' runs."""
    steps = conversion_accuracy.steps_per_epoch(len(data.load().train), batch_size)
    return conversion_accuracy.Run(label, 1, batch_size, lr, steps, seed_run.val_accuracies, seed_run.test_accuracy)
