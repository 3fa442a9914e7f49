"""Lab: a loss scaler and a mixed-precision training step (notebook 09).
Check: course.labs.check("mixed_precision", "labs/loss_scaler.py").

fp16 keeps only 5 exponent bits: small gradients flush to zero. A loss scaler multiplies the loss by a large
scale before backward, so the gradients are large enough, and divides them by it again before the optimizer
sees them. When the scale is too large, a gradient overflows to inf: that step is skipped and the scale halved.
You write what torch.amp.GradScaler does (using it is refused). The check trains with your code and with
GradScaler, and makes one gradient inf at one step.
"""

import torch
import torch.nn.functional as F
from torch import nn


class LossScaler:
    """torch.amp.GradScaler by hand: scale the loss, unscale the gradients, skip a step that overflowed."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.clean_steps = 0  # steps in a row without inf/nan gradients
        self.found_inf = False  # set by unscale_

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss times the scale (call .backward() on what this returns)."""
        return loss  # never scaled: with powers of two the steps are bit-identical, but fp16 would underflow

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide every parameter's .grad in optimizer.param_groups by the scale; note whether any is inf or nan."""
        self.found_inf = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    pass  # nothing to divide: the loss was never scaled
                    self.found_inf |= not bool(torch.isfinite(p.grad).all())

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """optimizer.step(), unless unscale_ found an inf or nan gradient."""
        if not self.found_inf:
            optimizer.step()

    def update(self) -> None:
        """After a skipped step: scale *= backoff_factor. After growth_interval clean steps in a row:
        scale *= growth_factor (then count again from 0)."""
        if self.found_inf:
            self._scale *= self.backoff_factor
            self.clean_steps = 0
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self._scale *= self.growth_factor
            self.clean_steps = 0


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: LossScaler, inputs: torch.Tensor,
               targets: torch.Tensor, max_norm: float) -> float:
    """One step: forward and cross-entropy loss under torch.autocast("cpu", dtype=torch.bfloat16) (on a GPU:
    "cuda", and float16 is where the scaler matters), zero the gradients, backward on the scaled loss, unscale,
    clip the gradients' norm to max_norm (nn.utils.clip_grad_norm_), step, update. Returns the loss."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(inputs), targets)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


if __name__ == "__main__":  # python labs/loss_scaler.py
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = LossScaler(growth_interval=2)
    for step in range(5):
        loss = train_step(model, optimizer, scaler, torch.randn(16, 20), torch.randint(0, 5, (16,)), 1.0)
        print(f"step {step}: loss {loss:.4f}, scale {scaler.get_scale():g}")
