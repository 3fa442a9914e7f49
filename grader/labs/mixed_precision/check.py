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
* ``unscale_then_clip``: after every step before the overflow the parameters equal the reference's
  (clipping the scaled gradients, or not clipping, is named from what it matches);
* ``skips_overflow``: the step with inf gradients leaves the parameters as they were (none becomes nan);
* ``updates_scale``: the scale after each step equals ``GradScaler.get_scale()``'s (halved after the overflow,
  doubled after ``growth_interval`` clean steps).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from grader.labs.core import Check, Finding, Lab, load_entry

#: Not to be used by the student: torch's scaler is the reference.
SHORTCUTS = ("torch.amp:GradScaler", "torch.amp.grad_scaler:GradScaler", "torch.cuda.amp:GradScaler")
#: Largest |parameter difference| accepted (powers-of-two scales make the same steps equal to the last bit).
TOLERANCE = 1e-6
LR, BATCH_SIZE, INIT_SCALE, MAX_NORM = 1e-2, 16, 2.0**16, 0.5

CHECKS = (
    Check("autocast", "the forward runs under bf16 autocast", 1),
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


def train(config: dict, step_fn: object, scaler: object, dtypes: list[torch.dtype] | None = None
          ) -> tuple[list[torch.Tensor], list[float]]:
    """Parameters and scale after each step (the first entry: before any), the overflow at ``overflow_at``."""
    model = _model(config["seed"])
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    now = [False]
    _overflow_hook(model, now)
    if dtypes is not None:
        model[0].register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    trajectory, scales = [_flat(model)], [float(scaler.get_scale())]
    for step in range(1, config["steps"] + 1):
        now[0] = step == config["overflow_at"]
        step_fn(model, optimizer, scaler, *_batch(step, config["seed"]))
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
    ours, scales = train(config, lambda *args: train_step(*args, MAX_NORM), scaler, dtypes)
    autocast = Finding("autocast", dtypes[:1] == [torch.bfloat16], "" if dtypes[:1] == [torch.bfloat16] else
                       f"the first linear layer's output is {dtypes[0] if dtypes else 'never computed'}: run the "
                       "forward (model and loss) inside torch.autocast(\"cpu\", dtype=torch.bfloat16)")
    return [autocast, judge_clip(ours, config), judge_skip(ours, config), judge_scale(scales, config, ours)]


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
