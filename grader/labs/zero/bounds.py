"""The rounding bound of the zero and fsdp labs: how far a correct run's parameters may be from DDP + Adam's.

Both runs start from the same parameters and see the same batches; each rounds in its own way. At each step:

1. **Each rank's gradient.** The MLP's forward, loss and backward on the rank's batch are carried through
   :mod:`course.numerics.propagate`. The student's run starts from parameters known to within the drift so far;
   the reference's from its own, exactly. Both local gradients lie within their bound of the exact one.
2. **The average over the ranks.** Each run adds ``world_size`` partial gradients in its own order (DDP's
   allreduce, the student's reduce-scatter) and divides: :func:`course.numerics.bounds.reduction_bound` on the
   ranks' gradient magnitudes, for both runs.
3. **Adam's step.** :class:`course.numerics.adam.Drift` carries the gradients' bound through the moments and the
   division by ``sqrt(v) + eps``, and adds the updates' own rounding.

Every bound is element by element, in the order of ``model.parameters()``, so a check can name the first parameter
beyond it. Taught in notebook 07; the property test is ``tests/numerics/test_adam.py``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from course.numerics import bounds
from course.numerics import propagate as p
from course.numerics.adam import Drift
from course.numerics.bounds import Verdict, verdict
from course.numerics.divergence import PARAMETERS, Divergence, Record, first_divergence

#: max |tanh''(z)| = 4 / (3 sqrt 3), at z = artanh(1 / sqrt 3): the slope of tanh's derivative
TANH_CURVATURE = 4 / (3 * math.sqrt(3))


def _relu_slope(z: p.Tracked) -> p.Tracked:
    """ReLU's derivative, 0 or 1; unknown (error 1) where rounding may have moved ``z`` across 0."""
    return p.Tracked((z.value > 0).double(), (z.value.abs() <= z.err).double(), z.dtype)


def _tanh_slope(z: p.Tracked) -> p.Tracked:
    return p.elementwise(z, lambda x: 1 - torch.tanh(x) ** 2, TANH_CURVATURE, ulps=4)


#: activation -> (the function carried forward, its derivative carried backward)
ACTIVATIONS = {nn.ReLU: (lambda z: p.elementwise(z, torch.relu, 1.0, ulps=0), _relu_slope),
               nn.Tanh: (lambda z: p.elementwise(z, torch.tanh, 1.0), _tanh_slope)}


def _cross_entropy_gradient(logits: p.Tracked, labels: torch.Tensor) -> p.Tracked:
    """d mean cross-entropy / d logits = (softmax - one-hot) / batch. Logits within ``e`` of exact move each
    probability by at most ``prob (exp(2 max e) - 1)``. torch's log-softmax, exp and subtraction round a few times,
    relative to the logits' size (``u (4 max|z| + 2 classes + 6)`` of each probability)."""
    z, (batch, classes) = logits.value, logits.value.shape
    prob = torch.softmax(z, dim=-1)
    value = (prob - nn.functional.one_hot(labels, classes).double()) / batch
    moved = prob * torch.expm1(2 * logits.err.amax(-1, keepdim=True))
    rounded = prob * bounds.unit_roundoff(logits.dtype) * (4 * z.abs().amax(-1, keepdim=True) + 2 * classes + 6)
    err = (moved + rounded) / batch
    return p.Tracked(value, err + 2 * bounds.cast_bound(value.abs() + err, logits.dtype), logits.dtype)


def _mse_gradient(out: p.Tracked, target: torch.Tensor) -> p.Tracked:
    """d mean((out - target)^2) / d out = 2 (out - target) / batch: a subtraction, a product and a division."""
    value = 2 * (out.value - target[:, None]) / out.value.shape[0]
    err = 2 * out.err / out.value.shape[0]
    return p.Tracked(value, err + 3 * bounds.cast_bound(value.abs() + err, out.dtype), out.dtype)


def loss_gradient(out: p.Tracked, labels: torch.Tensor, classes: int) -> p.Tracked:
    """The labs' loss (``grader.labs.zero.check._loss``): cross-entropy, or for one output the squared error
    against ``label / classes``."""
    if out.value.shape[1] == 1:
        return _mse_gradient(out, (labels.to(torch.float32) / classes).double())
    return _cross_entropy_gradient(out, labels)


def local_gradients(model: nn.Sequential, params: dict[str, p.Tracked], images: torch.Tensor,
                    labels: torch.Tensor, classes: int) -> dict[str, p.Tracked]:
    """Every parameter's gradient on one rank's batch, with its bound: ``model`` gives the layers (Linear, ReLU,
    Tanh, and parameter-free layers before the first Linear), ``params`` their values as known (name -> Tracked).

    Raises:
        ValueError: for a layer this bound does not know.
    """
    x: torch.Tensor | p.Tracked = images.to(next(iter(params.values())).dtype)
    done: list[tuple[str, object]] = []  # (name, the Linear's input or the activation's pre-activation)
    for name, module in model.named_children():
        if isinstance(module, nn.Linear):
            x = p.leaf(x, params[f"{name}.weight"].dtype) if torch.is_tensor(x) else x
            done.append((name, x))
            x = p.add(p.matmul(x, p.transpose(params[f"{name}.weight"])), params[f"{name}.bias"])
        elif type(module) in ACTIVATIONS and not torch.is_tensor(x):
            done.append((name, x))
            x = ACTIVATIONS[type(module)][0](x)
        elif torch.is_tensor(x):
            x = module(x)  # before the first Linear: reshapes and slices of the input, exact
        else:
            raise ValueError(f"expected Linear, ReLU or Tanh layers after the first Linear, got {module}: "
                             "add its rounding to grader.labs.zero.bounds")
    upstream, found = loss_gradient(x, labels, classes), {}
    for index, (name, saved) in reversed(list(enumerate(done))):
        module = getattr(model, name)
        if not isinstance(module, nn.Linear):
            upstream = p.multiply(upstream, ACTIVATIONS[type(module)][1](saved))
            continue
        found[f"{name}.weight"] = p.matmul(p.transpose(upstream), saved)
        found[f"{name}.bias"] = p.total(upstream, (0,))
        if index:
            upstream = p.matmul(upstream, params[f"{name}.weight"])
    return found


def _flat(tracked: dict[str, p.Tracked], names: list[str], what: str) -> torch.Tensor:
    return torch.cat([getattr(tracked[name], what).reshape(-1) for name in names])


def averaged_gradient(model: nn.Sequential, known: dict[str, p.Tracked], images: torch.Tensor, labels: torch.Tensor,
                      world_size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact average over ``world_size`` ranks (each a consecutive slice of the global batch) of their gradients
    at the reference's parameters, and the bound on |student's - reference's| averaged gradient (flat, float64).
    ``known``: the parameters, with the drift bound as their error (the student's side)."""
    names = [name for name, _ in model.named_parameters()]
    exact = {name: p.Tracked(t.value, torch.zeros_like(t.err), t.dtype) for name, t in known.items()}
    rows, total, magnitude, local = images.shape[0] // world_size, 0, 0, 0
    for rank in range(world_size):
        mine = slice(rank * rows, (rank + 1) * rows)
        student = local_gradients(model, known, images[mine], labels[mine], classes)
        reference = local_gradients(model, exact, images[mine], labels[mine], classes)
        gradient, err = _flat(reference, names, "value"), _flat(student, names, "err")
        total, magnitude = total + gradient, magnitude + gradient.abs() + err
        local = local + err + _flat(reference, names, "err")
    dtype = next(iter(known.values())).dtype
    mean, local = total / world_size, local / world_size
    reduced = bounds.reduction_bound(magnitude, world_size, dtype) / world_size
    return mean, local + 2 * (reduced + bounds.cast_bound(mean.abs() + local + reduced, dtype))


def _unflat(flat: torch.Tensor, err: torch.Tensor, model: nn.Module, dtype: torch.dtype) -> dict[str, p.Tracked]:
    known, offset = {}, 0
    for name, param in model.named_parameters():
        n = param.numel()
        known[name] = p.Tracked(flat[offset:offset + n].double().view_as(param),
                                err[offset:offset + n].view_as(param), dtype)
        offset += n
    return known


def trajectory_bounds(model: nn.Sequential, trajectory: list[torch.Tensor], batches: list[tuple[torch.Tensor, ...]],
                      world_size: int, adam: dict, classes: int) -> list[torch.Tensor]:
    """For the reference's flat parameters before and after each step (``trajectory``, in ``parameters()`` order)
    on the global ``batches`` (images, labels), how far a correct run's may be: one flat bound per entry (0 before
    the first step: building the optimizer changes nothing). ``adam``: ``lr``, ``betas``, ``eps``."""
    dtype = trajectory[0].dtype
    drift = Drift(adam["lr"], adam["betas"], adam["eps"], dtype)
    found = [torch.zeros_like(trajectory[0], dtype=torch.float64)]
    for step, (images, labels) in enumerate(batches[:len(trajectory) - 1], start=1):
        known = _unflat(trajectory[step - 1], found[-1], model, dtype)
        mean, bound = averaged_gradient(model, known, images, labels, world_size, classes)
        found.append(drift.step(mean, bound, trajectory[step]).clone())
    return found


def _records(flat: torch.Tensor, model: nn.Module, step: int, rank: int) -> list[Record]:
    found, offset = [], 0
    for name, param in model.named_parameters():
        found.append(Record(name, PARAMETERS, step, rank, flat[offset:offset + param.numel()].view_as(param)))
        offset += param.numel()
    return found


def unnamed(flat: torch.Tensor) -> nn.Module:
    """A stand-in whose one parameter, ``flat``, names a flat vector whose layers are not known."""
    holder = nn.Module()
    holder.flat = nn.Parameter(torch.zeros_like(flat))
    return holder


def first_beyond(ours: list[torch.Tensor], reference: list[torch.Tensor], limits: list[torch.Tensor],
                 model: nn.Module, rank: int) -> tuple[int, Divergence | None, Verdict]:
    """The first step whose parameters are beyond rounding, with the first parameter (in ``parameters()`` order)
    that diverges there; ``(len(reference), None, closest)`` when none is, ``closest`` the verdict that came
    nearest its bound (for the passing message)."""
    closest = Verdict(True, 0.0, 0.0)
    for step in range(len(reference)):
        judged = verdict(ours[step], reference[step], limits[step])
        if not judged.within:
            bound_of = {record.name: record.tensor for record in _records(limits[step], model, step, rank)}
            found = first_divergence(_records(ours[step], model, step, rank), _records(reference[step], model, step,
                                     rank), lambda r, _, limit=bound_of: limit[r.name])
            return step, found, judged
        closest = max(closest, judged, key=lambda v: v.ratio)
    return len(reference), None, closest
