"""Training at many global batch sizes: where the learning-rate rules stop working.

:func:`sweep` trains over global batch sizes x rules x warmup (:mod:`course.optimization.lr_scaling`) and reports
steps- and
epochs-to-target: perfect scaling first (doubling the batch halves the steps, :func:`scaling_efficiency`), then
diminishing returns past the critical batch size. :func:`same_epochs` and :func:`same_train_accuracy` measure
the large-batch generalization gap, and ``SweepConfig(optimizer="lars")`` trains with
:class:`course.optimization.lars.LARS`.
Plotted by :mod:`course.optimization.batch_plots`. Taught in ``notebooks/02_large_batch.ipynb``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from course import models
from course.arguments import check_batch, check_count, check_model_fits_data
from course.optimization.lars import LARS
from course.optimization.lr_scaling import RULES, scaled_lr, warmup_scheduler


@dataclass(frozen=True)
class SweepConfig:
    """What :func:`sweep` trains. Defaults: softmax regression on the digits, a fraction of a second per run,
    with a small base rate and a target near the model's best accuracy, so that steps-to-target is long enough
    (hundreds of steps at the base batch) to halve a few times before the rate stops helping."""

    global_batch_sizes: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512, 1024)  # global batch sizes
    rules: tuple[str, ...] = tuple(RULES)
    warmup_steps: tuple[int, ...] = (0, 10)  # each rule is run with each of these warmups
    base_lr: float = 0.01  # a rate tuned at base_batch_size
    base_batch_size: int = 8
    optimizer: str = "sgd"  # "sgd" (with momentum) or "lars"
    momentum: float = 0.9
    trust_coefficient: float = 0.001  # LARS only (eta; 0.001 as in You et al.)
    max_steps: int = 1000  # step budget per run (the base batch needs about 800 at the defaults)
    target_accuracy: float = 0.955  # accuracy that counts as "trained" (softmax regression tops out near 0.96)
    target_split: str = "val"  # whose accuracy must reach the target: "val" or "train"
    stop_at_target: bool = True  # False: always train max_steps (to compare final accuracies)
    diverged_loss: float = 1e4  # a training loss above this (or not finite) counts as diverged; training stops
    model: str = "linear"  # course.models.build name
    seed: int = 0

    def __post_init__(self) -> None:
        if self.target_split not in ("val", "train"):
            raise ValueError(f"target_split must be 'val' or 'train', got {self.target_split!r}.")
        check_count("max_steps", self.max_steps)
        if not self.global_batch_sizes:
            raise ValueError("global_batch_sizes is empty: give at least one global batch size, e.g. (16, 32, 64).")
        for global_batch_size in (*self.global_batch_sizes, self.base_batch_size):
            check_count("each batch size", global_batch_size, unit="number of samples")
        for warmup in self.warmup_steps:
            check_count("warmup_steps", warmup, minimum=0)
        unknown = [rule for rule in self.rules if rule not in RULES]
        if unknown:
            raise ValueError(f"unknown rules {unknown}; choose from {', '.join(RULES)}.")


@dataclass(frozen=True)
class RunResult:
    """One training run of the sweep.

    Attributes:
        global_batch_size: global batch size. rule, warmup_steps, lr: the rule, warmup and the peak rate it gave.
        steps_to_target, epochs_to_target: first step (and epoch, = steps * global_batch_size / N) at which the
            accuracy on ``config.target_split`` (validation by default) reached the target; None if it never did.
        diverged: the training loss blew up; training stopped there.
        train_accuracy, val_accuracy, train_loss, val_loss: at the end of training.
        losses: the training loss (on each step's batch) at every step.
    """

    global_batch_size: int
    rule: str
    warmup_steps: int
    lr: float
    steps_to_target: int | None
    epochs_to_target: float | None
    diverged: bool
    train_accuracy: float
    val_accuracy: float
    train_loss: float
    val_loss: float
    losses: list[float]

    @property
    def generalization_gap(self) -> float:
        """Training accuracy minus validation accuracy at the end of training."""
        return self.train_accuracy - self.val_accuracy


def _accuracy(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(inputs).argmax(dim=1) == targets).float().mean())


def _accuracy_and_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        logits = model(inputs)
        return float((logits.argmax(dim=1) == targets).float().mean()), float(F.cross_entropy(logits, targets))


def _optimizer(model: nn.Module, lr: float, config: SweepConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=config.momentum)
    if config.optimizer == "lars":
        return LARS(model.parameters(), lr=lr, momentum=config.momentum, trust_coefficient=config.trust_coefficient)
    raise ValueError(f"unknown optimizer {config.optimizer!r}; choose 'sgd' or 'lars'.")


def _batches(n: int, global_batch_size: int, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Indices of ``steps`` full batches: each epoch a fresh shuffle, the remainder dropped."""
    per_epoch = n // global_batch_size
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(n, generator=generator)
        yield order[(step % per_epoch) * global_batch_size:(step % per_epoch + 1) * global_batch_size]


def train_run(train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor],
              global_batch_size: int, rule: str, warmup_steps: int, config: SweepConfig = SweepConfig()) -> RunResult:
    """Train one model at ``global_batch_size`` with a scaled rate and a linear warmup.

    Each epoch is a fresh shuffle cut into ``N // global_batch_size`` full batches (the remainder is dropped, so
    every step sees exactly ``global_batch_size`` samples). The accuracy on ``config.target_split`` (validation by
    default) is checked after every step until it reaches the target; training stops there
    (``config.stop_at_target``), at ``config.max_steps``, or when the loss blows up.

    Args:
        train, val: ``(inputs, targets)`` tensors, on the device to train on.
        global_batch_size: global batch size, 1..N.
        warmup_steps: length of the linear warmup, in steps.

    Raises:
        ValueError: ``global_batch_size`` 0 or larger than the training set, a negative warmup, a bad rule, rate or
            optimizer, or data the model cannot take (sample shape, labels beyond its outputs).
    """
    n = check_batch(*train)
    check_batch(*val)
    global_batch_size = check_count("global_batch_size", global_batch_size, unit="number of training samples",
                                    maximum=n)
    warmup_steps = check_count("warmup_steps", warmup_steps, minimum=0)
    lr = scaled_lr(config.base_lr, config.base_batch_size, global_batch_size, rule)
    torch.manual_seed(config.seed)
    model = models.build(config.model, tuple(train[0].shape[1:])).to(train[0].device)
    if train[0].shape[1:] != val[0].shape[1:]:
        raise ValueError(f"training samples have shape {tuple(train[0].shape[1:])} but validation samples "
                         f"{tuple(val[0].shape[1:])}: expected the same shape; split both from one dataset.")
    check_model_fits_data(model, F.cross_entropy, *train)
    check_model_fits_data(model, F.cross_entropy, *val)
    optimizer = _optimizer(model, lr, config)
    scheduler = warmup_scheduler(optimizer, warmup_steps)
    losses: list[float] = []
    probe = {"val": val, "train": train}[config.target_split]
    steps_to_target, diverged = None, False
    for batch in _batches(n, global_batch_size, config.max_steps, torch.Generator().manual_seed(config.seed)):
        batch = batch.to(train[0].device)
        loss = F.cross_entropy(model(train[0][batch]), train[1][batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]) or losses[-1] > config.diverged_loss:
            diverged = True
            break
        if steps_to_target is None and _accuracy(model, *probe) >= config.target_accuracy:
            steps_to_target = len(losses)
            if config.stop_at_target:
                break
    train_acc, train_loss = _accuracy_and_loss(model, *train)
    val_acc, val_loss = _accuracy_and_loss(model, *val)
    epochs = None if steps_to_target is None else steps_to_target * global_batch_size / n
    return RunResult(global_batch_size, rule, warmup_steps, lr, steps_to_target, epochs, diverged,
                     train_acc, val_acc, train_loss, val_loss, losses)


def sweep(train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor],
          config: SweepConfig = SweepConfig()) -> list[RunResult]:
    """:func:`train_run` for every global batch size x rule x warmup in ``config``, in that nesting order."""
    return [train_run(train, val, global_batch_size, rule, warmup, config)
            for global_batch_size in config.global_batch_sizes for rule in config.rules
            for warmup in config.warmup_steps]


def same_epochs(train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor],
                global_batch_sizes: Iterable[int], epochs: int, rule: str = "sqrt", warmup_steps: int = 10,
                config: SweepConfig = SweepConfig()) -> list[RunResult]:
    """Train at each global batch size for the same number of ``epochs`` (so a bigger batch takes fewer steps)
    and keep the final accuracies: the setting in which the large-batch generalization gap is measured.

    Raises:
        ValueError: ``epochs`` not a positive integer, or any error of :func:`train_run`.
    """
    epochs = check_count("epochs", epochs)
    n = check_batch(*train)
    return [train_run(train, val, global_batch_size, rule, warmup_steps,
                      replace(config, max_steps=epochs * max(1, n // global_batch_size), stop_at_target=False))
            for global_batch_size in global_batch_sizes]


def same_train_accuracy(train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor],
                        global_batch_sizes: Iterable[int], train_accuracy: float, rule: str = "sqrt",
                        warmup_steps: int = 10,
                        config: SweepConfig = SweepConfig()) -> list[RunResult]:
    """Train at each global batch size until the *training* accuracy reaches ``train_accuracy`` (at most
    ``config.max_steps`` steps), and keep the final accuracies: validation accuracies compared at equal fit, so
    a difference is a generalization gap and not underfitting. A run that missed has ``steps_to_target`` None."""
    config = replace(config, target_accuracy=train_accuracy, target_split="train", stop_at_target=True)
    return [train_run(train, val, global_batch_size, rule, warmup_steps, config)
            for global_batch_size in global_batch_sizes]


def scaling_efficiency(results: Iterable[RunResult], rule: str, warmup_steps: int) -> dict[int, float]:
    """For each global batch size that reached the target: steps saved relative to perfect scaling.

    ``efficiency(B) = steps(B0) * B0 / (steps(B) * B)`` with B0 the smallest batch size that reached the
    target: 1 means doubling the batch halved the steps (perfect scaling), 0.5 means half of the extra
    samples were wasted. Batch sizes that never reached the target are left out.
    """
    runs = sorted((r for r in results if r.rule == rule and r.warmup_steps == warmup_steps
                   and r.steps_to_target is not None), key=lambda r: r.global_batch_size)
    if not runs:
        return {}
    samples = runs[0].steps_to_target * runs[0].global_batch_size
    return {r.global_batch_size: samples / (r.steps_to_target * r.global_batch_size) for r in runs}


def describe_rule(results: Iterable[RunResult], rule: str, warmup_steps: int, max_steps: int) -> str:
    """In words chosen by the numbers: do bigger global batches cut the steps to target under ``rule``?

    Says which batch sizes reached the target and in how many steps, which missed it within ``max_steps``,
    and whether the steps fell (by at least a quarter from the smallest batch to the best one).
    """
    runs = sorted((r for r in results if r.rule == rule and r.warmup_steps == warmup_steps),
                  key=lambda r: r.global_batch_size)
    if not runs:
        raise ValueError(f"no runs with rule {rule!r} and warmup_steps {warmup_steps} among the results.")
    reached = [r for r in runs if r.steps_to_target is not None]
    missed = [r.global_batch_size for r in runs if r.steps_to_target is None]
    text = f"{rule} rule: " + (", ".join(f"batch {r.global_batch_size}: {r.steps_to_target} steps" for r in reached)
                               or "no batch size reached the target")
    if missed:
        text += f"; missed the target within {max_steps} steps at batch {', '.join(map(str, missed))}"
    if len(reached) >= 2 and min(r.steps_to_target for r in reached[1:]) <= 0.75 * reached[0].steps_to_target:
        return text + ": bigger batches cut the steps"
    return text + ": bigger batches do not cut the steps"
