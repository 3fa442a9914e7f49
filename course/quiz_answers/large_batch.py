"""Notebook 02's questions: the noise scale's trend in training, and the linear rule's rate."""

from __future__ import annotations

from typing import Any

import torch

from course.optimization import batch_sweep, lr_scaling, noise_scale

#: The next section's linear regression: its optimum and its label noise.
W_STAR = (1.0, -2.0, 0.5, 0.0)
LABEL_NOISE = 0.5


def noise_scale_trend() -> dict[str, Any]:
    """Whether B_simple grows or shrinks as the loss comes down (linear regression, closed form)."""
    w_star = torch.tensor(W_STAR, dtype=torch.float64)
    b_far, b_near = (noise_scale.linear_regression_noise_scale(f * w_star, w_star, LABEL_NOISE).b_simple
                     for f in (0.0, 0.9))
    trend = "it grows" if b_near > b_far else "it shrinks" if b_near < b_far else "it stays the same"
    return dict(
        prompt=("As training brings the loss down, what happens to the gradient noise scale B_simple = tr(Sigma) / "
                "|G|^2, the batch size beyond which extra samples are wasted?"),
        answer=trend, choices=("it grows", "it shrinks", "it stays the same"),
        explanation=(f"{trend}: for linear regression towards w* = ({', '.join(f'{v:g}' for v in W_STAR)}) with "
                     f"label noise {LABEL_NOISE:g}, B_simple is {b_far:.1f} at w = 0 and {b_near:.1f} at w = 0.9 w* "
                     "(the closed form below). The true gradient |G| shrinks towards the optimum while the "
                     "per-sample noise tr(Sigma) levels off at D sigma^2, so later in training a bigger batch stays "
                     "useful."))


def linear_lr() -> dict[str, Any]:
    """The sweep's peak rate at its largest batch under the linear rule."""
    sweep = batch_sweep.SweepConfig()
    big = max(sweep.global_batch_sizes)
    sqrt = lr_scaling.scaled_lr(sweep.base_lr, sweep.base_batch_size, big, "sqrt")
    return dict(
        prompt=(f"The sweep tunes its rate, {sweep.base_lr:g}, at global batch {sweep.base_batch_size}. Under the "
                f"linear rule, what peak rate does its run at global batch {big} use?"),
        answer=lr_scaling.scaled_lr(sweep.base_lr, sweep.base_batch_size, big, "linear"), rel_tol=0.01,
        explanation=(f"The rate times the batch ratio: {sweep.base_lr:g} x {big} / {sweep.base_batch_size}. The "
                     f"square-root rule would give {sqrt:.3g}; warmup, below, reaches such rates gradually."))
