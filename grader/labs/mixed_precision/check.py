"""Lab "mixed_precision": the student writes a loss scaler and a mixed-precision training step, checked against
torch's ``GradScaler``.

The student's ``labs/loss_scaler.py`` (stub: ``grader/labs/mixed_precision/stub.py``, taught in
``notebooks/09_real_gpu_practice.ipynb``) defines ``LossScaler`` (``scale``, ``unscale_``, ``step``, ``update``,
as ``torch.amp.GradScaler`` has them) and ``train_step(model, optimizer, scaler, inputs, targets, max_norm)``:
a bf16 autocast forward, a scaled backward, unscale, clip, step, update. :func:`check_on_rank` trains the same
seeded MLP with Adam twice, with the student's code and with the reference loop (``torch.amp.GradScaler`` on the
CPU, as :mod:`course.practice.mixed_precision` uses it), and at step ``overflow_at`` makes one weight's gradient
inf (a hook the checker registers: what an fp16 overflow looks like). Checks:

* ``autocast``: the first linear layer's output is bf16 (the forward ran under autocast);
* ``scales_loss``: the loss backward runs on is the loss times the scale the scaler reports (``get_scale()``):
  measured where backward enters the model, as the gradient at the model's output divided by the unscaled
  cross-entropy's (so a scaler that never scales fails, even though powers of two leave its steps bit-identical);
* ``unscale_then_clip``: after every step before the overflow the parameters equal the reference's
  (clipping the scaled gradients, or not clipping, is named from what it matches);
* ``skips_overflow``: the step with inf gradients leaves the parameters as they were (none becomes nan);
* ``updates_scale``: the scale after each step equals ``GradScaler.get_scale()``'s (halved after the overflow,
  doubled after ``growth_interval`` clean steps).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from grader.labs.core import Check, Finding, Lab, load_entry

#: Not to be used by the student: torch's scaler is the reference.
SHORTCUTS = ("torch.amp:GradScaler", "torch.amp.grad_scaler:GradScaler", "torch.cuda.amp:GradScaler")
#: Largest |parameter difference| accepted (powers-of-two scales make the same steps equal to the last bit).
TOLERANCE = 1e-6
#: Largest relative gap between the factor backward's loss was multiplied by and the reported scale (the
#: gradient at the model's output is bf16 under autocast: about 3 significant digits).
SCALE_TOLERANCE = 0.05
LR, BATCH_SIZE, INIT_SCALE, MAX_NORM = 1e-2, 16, 2.0**16, 0.5

CHECKS = (
    Check("autocast", "the forward runs under bf16 autocast", 1),
    Check("scales_loss", "backward runs on the loss times the scale your scaler reports", 2),
    Check("unscale_then_clip", "parameters equal torch's GradScaler loop: unscale, then clip, then step", 3),
    Check("skips_overflow", "a step whose gradients hold inf or nan is skipped", 3),
    Check("updates_scale", "the scale halves after an overflow and grows after growth_interval clean steps", 3),
)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5))


def _batch(step: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * seed + step)
    return torch.randn(BATCH_SIZE, 20, generator=generator), torch.randint(0, 5, (BATCH_SIZE,), generator=generator)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def _reference_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                    inputs: torch.Tensor, targets: torch.Tensor, order: str) -> None:
    """The reference loop's step (``order`` "unscale_then_clip"); the other orders say what a mistake matches."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(inputs), targets)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    if order == "clip_then_unscale":
        nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    scaler.unscale_(optimizer)
    if order == "unscale_then_clip":
        nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    scaler.step(optimizer)
    scaler.update()


def _overflow_hook(model: nn.Module, now: list[bool]) -> None:
    """At the steps when ``now[0]`` is True, the first weight's gradient becomes inf (nan where it was 0)."""
    model[0].weight.register_hook(lambda grad: grad * float("inf") if now[0] else grad)


def _unscaled_factor(grad: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor) -> float:
    """How many times ``grad`` (at the model's output) is the mean cross-entropy's own gradient,
    (softmax(logits) - one_hot(targets)) / batch: the factor the loss was multiplied by before backward."""
    own = (torch.softmax(logits, dim=1) - F.one_hot(targets, logits.shape[1]).float()) / len(targets)
    return float((grad.float() * own).sum() / (own * own).sum())


def _watch_backward(model: nn.Module, scaler: object, batch: list, seen: list[tuple[int, float, float]]) -> None:
    """At each forward, note the scale the scaler reports; when backward reaches the model's output, append
    (step, that scale, the factor the loss was multiplied by) to ``seen``. ``batch``: [step, targets]."""
    def forward_hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        if not out.requires_grad:
            return
        step, targets, scale, logits = batch[0], batch[1], float(scaler.get_scale()), out.detach().float()
        out.register_hook(lambda grad: seen.append((step, scale, _unscaled_factor(grad, logits, targets))))
    model.register_forward_hook(forward_hook)


def train(config: dict, step_fn: object, scaler: object, dtypes: list[torch.dtype] | None = None,
          seen: list[tuple[int, float, float]] | None = None) -> tuple[list[torch.Tensor], list[float]]:
    """Parameters and scale after each step (the first entry: before any), the overflow at ``overflow_at``;
    with ``seen``, what backward saw at each step (:func:`_watch_backward`)."""
    model = _model(config["seed"])
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    now, batch = [False], [0, None]
    _overflow_hook(model, now)
    if dtypes is not None:
        model[0].register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    if seen is not None:
        _watch_backward(model, scaler, batch, seen)
    trajectory, scales = [_flat(model)], [float(scaler.get_scale())]
    for step in range(1, config["steps"] + 1):
        now[0] = step == config["overflow_at"]
        inputs, targets = _batch(step, config["seed"])
        batch[:] = [step, targets]
        step_fn(model, optimizer, scaler, inputs, targets)
        trajectory.append(_flat(model))
        scales.append(float(scaler.get_scale()))
    return trajectory, scales


def reference(config: dict, order: str = "unscale_then_clip") -> tuple[list[torch.Tensor], list[float]]:
    """The reference loop's trajectory and scales (torch.amp.GradScaler on the CPU)."""
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=config["growth_interval"])
    return train(config, lambda *args: _reference_step(*args, order), scaler)


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if torch.isfinite(a).all() else float("inf")


# -- verdicts -----------------------------------------------------------------------------------------------------
def judge_scaled(seen: list[tuple[int, float, float]], config: dict) -> Finding:
    """Finding for ``scales_loss``: at every step, backward's loss was the loss times the reported scale, while
    the model's output is finite (once a step made the parameters nan: ``skips_overflow`` says why)."""
    for step in range(1, config["steps"] + 1):
        mine = [(scale, factor) for at, scale, factor in seen if at == step]
        if not all(math.isfinite(factor) for _, factor in mine):
            break
        if not mine:
            return Finding("scales_loss", False, f"at step {step} backward never reached the model's output: "
                           "call .backward() on what scaler.scale(loss) returns")
        for scale, factor in mine:
            if abs(factor / scale - 1) <= SCALE_TOLERANCE:
                continue
            never = " (it was never scaled)" if abs(factor - 1) <= SCALE_TOLERANCE else ""
            return Finding("scales_loss", False, f"at step {step} backward ran on your loss times {factor:.4g}"
                           f"{never}, but your scaler's scale was {scale:g}: scale(loss) must return the loss "
                           "times the scale, and backward must run on what it returns. Otherwise small fp16 "
                           "gradients still flush to zero")
    return Finding("scales_loss", True)


def judge_clip(ours: list[torch.Tensor], config: dict) -> Finding:
    """Finding for ``unscale_then_clip``: the steps before the overflow against the reference's."""
    expected, _ = reference(config)
    for step in range(1, config["overflow_at"]):
        gap = _gap(ours[step], expected[step])
        if gap <= TOLERANCE:
            continue
        start = f"after step {step} your parameters differ from torch's GradScaler loop by {gap:.2g}"
        if _gap(ours[step], reference(config, "clip_then_unscale")[0][step]) <= TOLERANCE:
            why = ("they match clipping the SCALED gradients: their norm is the scale times too large, so clipping "
                   "shrinks them far too much. Call scaler.unscale_(optimizer) first, then clip")
        elif _gap(ours[step], reference(config, "no_clip")[0][step]) <= TOLERANCE:
            why = f"they match no clipping at all: clip the unscaled gradients to max_norm={MAX_NORM}"
        else:
            why = ("check that scale() multiplies the loss by the scale, unscale_ divides every .grad by it, and "
                   "the order is backward, unscale_, clip, step, update")
        return Finding("unscale_then_clip", False, f"{start}: {why}")
    return Finding("unscale_then_clip", True)


def judge_skip(ours: list[torch.Tensor], config: dict) -> Finding:
    """Finding for ``skips_overflow``: the parameters before and after the overflow step."""
    step = config["overflow_at"]
    if _gap(ours[step], ours[step - 1]) == 0.0:
        return Finding("skips_overflow", True)
    state = "now hold inf or nan" if not torch.isfinite(ours[step]).all() else "changed"
    return Finding("skips_overflow", False, f"at step {step} a gradient was inf (an overflow), and your parameters "
                   f"{state}: when unscale_ finds an inf or nan gradient, step() must skip optimizer.step()")


def judge_scale(scales: list[float], config: dict, ours: list[torch.Tensor]) -> Finding:
    """Finding for ``updates_scale``: the scale after each step against GradScaler's, while the parameters are
    finite (after a step that made them nan every gradient is nan: ``skips_overflow`` says why)."""
    _, expected = reference(config)
    for step in range(1, len(expected)):
        if not torch.isfinite(ours[step - 1]).all():
            break
        if scales[step] == expected[step]:
            continue
        start = f"after step {step} your scale is {scales[step]:g}, GradScaler's {expected[step]:g}"
        if scales[step] == scales[step - 1] and step == config["overflow_at"]:
            why = (f"step {step} overflowed and the scale did not change: update() multiplies it by "
                   "backoff_factor (0.5) after a skipped step")
        elif scales[step] == scales[step - 1]:
            why = (f"it did not grow after {config['growth_interval']} clean steps in a row: update() multiplies "
                   "it by growth_factor (2.0) then, and counts again from 0. Is update() called every step?")
        else:
            why = ("update() halves the scale after a step with inf/nan gradients, and doubles it after "
                   "growth_interval clean steps in a row (the count restarts after each change)")
        return Finding("updates_scale", False, f"{start}: {why}")
    return Finding("updates_scale", True)


def check_on_rank(path: str, config: dict) -> list[Finding]:
    """Train with the student's LossScaler and train_step; judge against torch.amp.GradScaler's loop."""
    scaler_class, train_step = load_entry(path, "LossScaler"), load_entry(path, "train_step")
    scaler = scaler_class(init_scale=INIT_SCALE, growth_interval=config["growth_interval"])
    dtypes: list[torch.dtype] = []
    seen: list[tuple[int, float, float]] = []
    ours, scales = train(config, lambda *args: train_step(*args, MAX_NORM), scaler, dtypes, seen)
    autocast = Finding("autocast", dtypes[:1] == [torch.bfloat16], "" if dtypes[:1] == [torch.bfloat16] else
                       f"the first linear layer's output is {dtypes[0] if dtypes else 'never computed'}: run the "
                       "forward (model and loss) inside torch.autocast(\"cpu\", dtype=torch.bfloat16)")
    return [autocast, judge_scaled(seen, config), judge_clip(ours, config), judge_skip(ours, config),
            judge_scale(scales, config, ours)]


LAB = Lab(
    name="mixed_precision", title="a loss scaler and a mixed-precision training step",
    notebook="09_real_gpu_practice", student_file="labs/loss_scaler.py", entry="train_step", checks=CHECKS,
    rank_check=check_on_rank, shortcuts=SHORTCUTS,
    runs=({"world_size": 1, "seed": 0, "steps": 6, "overflow_at": 4, "growth_interval": 2, "timeout_s": 60,
           "label": "{steps} steps, an overflow at step {overflow_at}, growth_interval={growth_interval}"},),
    variant={"overflow_at": (4, 3, 5), "growth_interval": (2, 3)},  # each student's own (grader.labs.variant)
    hidden_runs=({"world_size": 1, "seed": "jitter", "steps": 6, "overflow_at": 3, "growth_interval": 3,
                  "timeout_s": 60, "label": "6 steps, an overflow at step 3, growth_interval=3"},),
)
