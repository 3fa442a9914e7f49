"""Learning rates for large batches: the scaling rules and warmup.

A k-times bigger global batch averages k times more per-sample gradients, so its gradient is less noisy and
a bigger step is safe. The rules: keep the rate (``none``), scale it by k (``linear``, Goyal et al. 2017,
"Accurate, Large Minibatch SGD") or by sqrt(k) (``sqrt``, the variance-preserving choice). Early in
training a large rate diverges, so it is reached by a linear warmup. LARS (You et al. 2017, "Large Batch
Training of Convolutional Networks", in :mod:`course.optimization.lars`) gives each layer its own rate from the ratio
of its
weight norm to its gradient norm. Where the rules stop working is measured by :mod:`course.optimization.batch_sweep`.
Taught in
``notebooks/02_large_batch.ipynb``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from course import exercise
from course.arguments import check_count, check_lr

#: The scaling rules, by their one name (the grader's ``lr_scaled`` check names them so too): rule -> ``k -> factor``
#: for a ``k`` times bigger global batch.
RULES: dict[str, Callable[[float], float]] = {"none": lambda k: 1.0, "linear": lambda k: k, "sqrt": math.sqrt}


def scaled_lr(base_lr: float, base_batch_size: int, global_batch_size: int, rule: str = "linear") -> float:
    """The learning rate for ``global_batch_size``, given one that works at ``base_batch_size``.

    ``none``: ``base_lr``; ``linear``: ``base_lr * k``; ``sqrt``: ``base_lr * sqrt(k)``, with
    ``k = global_batch_size / base_batch_size``.

    Raises:
        ValueError: negative ``base_lr``, a batch size that is not a positive integer, or an unknown rule.
    """
    base_lr = check_lr(base_lr)
    global_batch_size = check_count("global_batch_size", global_batch_size, unit="number of samples")
    k = global_batch_size / check_count("base_batch_size", base_batch_size, unit="number of samples")
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; choose one of {', '.join(RULES)}.")
    return base_lr * RULES[rule](k)


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Fraction of the full rate used at ``step`` (0-based): ``min(1, (step + 1) / warmup_steps)``; 1 without warmup.

    Raises:
        ValueError: negative ``step`` or ``warmup_steps``.
    """
    step = check_count("step", step, minimum=0)
    warmup_steps = check_count("warmup_steps", warmup_steps, minimum=0)
    return 1.0 if warmup_steps == 0 else min(1.0, (step + 1) / warmup_steps)


def lr_at(step: int, base_lr: float, base_batch_size: int, global_batch_size: int, rule: str = "linear",
          warmup_steps: int = 0) -> float:
    """The learning rate at ``step``: the scaled rate of :func:`scaled_lr`, ramped up linearly over ``warmup_steps``."""
    return scaled_lr(base_lr, base_batch_size, global_batch_size, rule) * warmup_factor(step, warmup_steps)


def warmup_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler that multiplies each group's rate by :func:`warmup_factor`; call ``.step()`` after each
    ``optimizer.step()``."""
    warmup_steps = check_count("warmup_steps", warmup_steps, minimum=0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_factor(step, warmup_steps))


@exercise.checker
def check_warmup_exercise(fn: Callable[[int, float, int, int, int], float]) -> bool:
    """Exercise checker: is the student's ``fn(step, base_lr, base_batch_size, global_batch_size,
    warmup_steps)`` the linear scaling rule with linear warmup (:func:`lr_at`)? Prints feedback on the first
    case that differs (a stub or an error gets :func:`course.exercise.checker`'s feedback); returns True if all
    agree."""
    cases = [(step, base_lr, base_b, b, warm) for step in (0, 1, 4, 9, 10, 50) for base_lr in (0.1, 0.05)
             for base_b, b in ((32, 32), (32, 256), (64, 512)) for warm in (0, 10)]
    for step, base_lr, base_b, b, warm in cases:
        expected = lr_at(step, base_lr, base_b, b, "linear", warm)
        got = fn(step, base_lr, base_b, b, warm)
        if not isinstance(got, (int, float)) or not math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12):
            call = (f"fn(step={step}, base_lr={base_lr}, base_batch_size={base_b}, global_batch_size={b}, "
                    f"warmup_steps={warm})")
            raise AssertionError(f"{call} returned {got!r}, expected {expected!r}. Hint: the full rate is "
                                 "base_lr * global_batch_size / base_batch_size, reached after warmup_steps steps.")
    print(f"Correct on all {len(cases)} cases.")
    return True
