"""LARS, the large-batch optimizer: each layer's step scaled by the ratio of its weight norm to its gradient norm.

You et al. 2017, "Large Batch Training of Convolutional Networks". At a large global batch the linear rule
asks for a rate that some layers cannot take (their gradient is large next to their weights) while others
could take more; LARS's trust ratio gives each parameter tensor its own. Compared with SGD under the
learning-rate rules of :mod:`course.optimization.lr_scaling` in ``notebooks/02_large_batch.ipynb``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from course.arguments import check_lr


def trust_ratio(weight_norm: float, grad_norm: float, trust_coefficient: float, weight_decay: float,
                eps: float = 1e-9) -> float:
    """LARS's layer-wise factor ``eta |w| / (|g| + wd |w| + eps)``; 1 when either norm is 0 (nothing to compare)."""
    if weight_norm == 0 or grad_norm == 0:
        return 1.0
    return trust_coefficient * weight_norm / (grad_norm + weight_decay * weight_norm + eps)


class LARS(torch.optim.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al. 2017): SGD with momentum where each parameter tensor's step
    is scaled by its trust ratio, so no layer moves by more than about ``trust_coefficient`` of its own norm
    per unit of ``lr``.

    Per tensor ``w`` with gradient ``g``::

        d = g + weight_decay * w
        v <- momentum * v + lr * trust_ratio(|w|, |g|) * d
        w <- w - v

    Args:
        params: parameters or parameter groups; a group with ``trust_coefficient=None`` is plain SGD (often
            used for biases).
        lr: the global rate (LARS typically takes a much larger one than SGD).
        momentum, weight_decay: as in SGD.
        trust_coefficient: eta, how far (relative to ``|w|``) a tensor may move per step at ``lr = 1``.
    """

    def __init__(self, params: Iterable, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 trust_coefficient: float | None = 0.001, eps: float = 1e-9) -> None:
        check_lr(lr)
        if not 0 <= momentum < 1 or weight_decay < 0 or (trust_coefficient is not None and trust_coefficient <= 0):
            raise ValueError(f"need 0 <= momentum < 1, weight_decay >= 0, trust_coefficient > 0 or None; got "
                             f"{momentum}, {weight_decay}, {trust_coefficient}.")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                                      trust_coefficient=trust_coefficient, eps=eps))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                update = param.grad.add(param, alpha=group["weight_decay"])
                ratio = 1.0
                if group["trust_coefficient"] is not None:
                    ratio = trust_ratio(float(param.norm()), float(param.grad.norm()), group["trust_coefficient"],
                                        group["weight_decay"], group["eps"])
                state = self.state[param]
                velocity = state.setdefault("velocity", torch.zeros_like(param))
                velocity.mul_(group["momentum"]).add_(update, alpha=group["lr"] * ratio)
                param.sub_(velocity)
        return loss
