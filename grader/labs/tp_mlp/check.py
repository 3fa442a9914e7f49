"""Lab (notebook 08): the student writes Megatron's *f* and *g* and the column-then-row-parallel MLP.

On every rank :func:`check_on_rank` builds the run's seeded ``fc1``, ``fc2``, input ``x`` and upstream gradient,
computes the unsplit MLP's output and gradients itself (torch, one process), then loads the student's file under a
:class:`~course.runtime.comm_log.CommLog`, builds ``ParallelMLP(fc1, fc2)``, runs forward and backward and records the
calls of each. :func:`cross_check` recomputes the unsplit output outside the ranks and compares every rank's.

Checks: the output equals the unsplit MLP's on every rank; the input's gradient too (*f*'s backward); this rank's
``w1, b1, w2, b2`` gradients equal its slices of the unsplit ones; exactly one ``all_reduce`` in forward and one in
backward, no other collective. "Equals" is within a bound derived from the arithmetic (:mod:`.bounds`: the run's
``dtype``, its world size, the magnitudes), and a failing check's message opens with the first tensor that
diverged (:mod:`grader.labs.divergence`), in the order they were computed.
"""

from __future__ import annotations

import copy
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

from course import world
from course.numerics.bounds import unit_roundoff, verdict
from course.numerics.divergence import FORWARD, GRADIENT, Recorder, first_divergence
from course.runtime.comm_log import COLLECTIVES, CommLog
from grader.labs.core import Check, Finding, Lab, RankFindings, load_entry
from grader.labs.divergence import earliest, named
from grader.labs.tp_mlp import bounds

CHECKS = (
    Check("outputs", "the output equals the unsplit MLP's on every rank", 3),
    Check("input_grad", "the input's gradient equals the unsplit MLP's (f's backward)", 2),
    Check("weight_grads", "each rank's w1, b1, w2, b2 gradients equal its slices of the unsplit gradients", 3),
    Check("collectives", "one all_reduce in forward and one in backward per MLP, no other collective", 2),
)
#: what each recorded tensor is, in the order forward and backward compute them
NAMES = {"y": "the row-parallel layer", "b2": "b2", "w2": "w2", "b1": "b1", "w1": "w1", "x": "the input x"}


def dtype_of(config: dict) -> torch.dtype:
    """The run's dtype (``config["dtype"]``, "float32" unless said)."""
    return getattr(torch, config.get("dtype", "float32"))


def problem(config: dict, device: torch.device | str = "cpu"
            ) -> tuple[nn.Linear, nn.Linear, torch.Tensor, torch.Tensor]:
    """The run's unsplit ``fc1``, ``fc2``, input ``x`` (B, S, d) and upstream gradient (B, S, d), from its seed, on
    ``device`` in the run's dtype (drawn on the CPU in float32, so the same on every device)."""
    torch.manual_seed(config["seed"])
    d, d_ff, batch_size, seq_len = config["d_model"], config["d_ff"], config["batch_size"], config["seq_len"]
    fc1, fc2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)
    x, upstream = torch.randn(batch_size, seq_len, d), torch.randn(batch_size, seq_len, d)
    dtype = dtype_of(config)
    return fc1.to(device, dtype), fc2.to(device, dtype), x.to(device, dtype), upstream.to(device, dtype)


def limits(config: dict, world_size: int) -> dict[str, torch.Tensor]:
    """name -> the largest |split - unsplit| rounding allows, element by element, for the run's tensors."""
    fc1, fc2, x, upstream = problem({**config, "dtype": "float32"})
    return bounds.comparison_bounds((fc1.weight.detach(), fc1.bias.detach(), fc2.weight.detach(),
                                     fc2.bias.detach(), x, upstream), dtype_of(config), world_size)


def reference(config: dict, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The unsplit MLP's output and gradients (input, fc1/fc2 weights and biases), in one process, on ``device``."""
    fc1, fc2, x, upstream = problem(config, device)
    x.requires_grad_()
    y = fc2(F.gelu(fc1(x)))
    y.backward(upstream)
    return {"y": y.detach(), "x": x.grad, "w1": fc1.weight.grad, "b1": fc1.bias.grad, "w2": fc2.weight.grad,
            "b2": fc2.bias.grad}


def _local(full: dict[str, torch.Tensor], rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """This rank's slices of the unsplit parameter gradients."""
    k = len(full["b1"]) // world_size
    rows = slice(rank * k, (rank + 1) * k)
    return {"w1": full["w1"][rows], "b1": full["b1"][rows], "w2": full["w2"][:, rows], "b2": full["b2"]}


def check_on_rank(path: str, config: dict) -> RankFindings:
    """On every rank: run the student's ParallelMLP forward and backward and compare with the unsplit MLP."""
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), world.current().device
    truth = reference(config, device)
    fc1, fc2, x, upstream = problem(config, device)
    with CommLog() as log:
        parallel_mlp = load_entry(path, "ParallelMLP")(copy.deepcopy(fc1), copy.deepcopy(fc2))
        x.requires_grad_()
        mark = log.mark()
        y = parallel_mlp(x)
        forward = log.since(mark)
        mark = log.mark()
        y.backward(upstream)
        backward = log.since(mark)
    whole = limits(config, world_size)
    bound = {**whole, **_local(whole, rank, world_size)}
    local = _local(truth, rank, world_size)
    found = [_close("outputs", f"rank {rank}'s output", y.detach(), truth["y"], bound["y"],
                    _output_hint(y.detach(), truth["y"], fc2.bias.detach(), world_size, bound["y"])),
             _close("input_grad", f"rank {rank}'s gradient of x", x.grad, truth["x"], bound["x"],
                    _input_hint(x.grad, truth))]
    found.append(_weight_grads(parallel_mlp, local, bound, rank))
    found.append(_collectives(rank, forward, backward))
    divergence = _first_divergence(rank, y, x.grad, dict(parallel_mlp.named_parameters()), truth, bound)
    return RankFindings(named(found, divergence), {"y": y.detach().cpu(), "divergence": divergence})


def _first_divergence(rank: int, y: torch.Tensor, x_grad: torch.Tensor | None, params: dict, truth: dict,
                      bound: dict):
    """The first of this rank's tensors (output, then the gradients as backward makes them) beyond rounding."""
    mine, theirs = Recorder(rank), Recorder(rank)
    world_size = dist.get_world_size()
    local = {**truth, **_local(truth, rank, world_size)}
    for name, phase in (("y", FORWARD), ("b2", GRADIENT), ("w2", GRADIENT), ("b1", GRADIENT), ("w1", GRADIENT),
                        ("x", GRADIENT)):
        got = y if name == "y" else x_grad if name == "x" else getattr(params.get(name), "grad", None)
        mine.add(NAMES[name], phase, got)
        theirs.add(NAMES[name], phase, local[name])
    names = {label: key for key, label in NAMES.items()}
    return first_divergence(mine.records, theirs.records, lambda record, _: bound[names[record.name]])


def _close(check: str, what: str, got: torch.Tensor | None, expected: torch.Tensor, bound: torch.Tensor,
           hint: str = "") -> Finding:
    if got is None:
        return Finding(check, False, f"{what} is None: nothing flowed back to it")
    if got.shape != expected.shape:
        return Finding(check, False, f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    judged = verdict(got, expected, bound)
    return Finding(check, judged.within, "" if judged.within else
                   f"{what} differs from the unsplit MLP's by up to {_worst(got, expected):.3g} (rounding allows "
                   f"{judged.bound:.2g} there){hint}")


def _worst(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.detach().double().cpu() - expected.detach().double().cpu()).abs().max())


def _input_hint(got: torch.Tensor | None, truth: dict) -> str:
    """Why the input's gradient is off, when the numbers say it (only this rank's share, or summed twice)."""
    if got is None or got.shape != truth["x"].shape:
        return ""
    ratio = float((got * truth["x"]).sum() / (truth["x"] * truth["x"]).sum())
    if ratio < 0.9:
        return (": it looks like this rank's share of the gradient only; f's backward must sum it over the ranks "
                "(all_reduce)")
    if ratio > 1.1:
        return f": it is about {ratio:.1f}x too large; only f's backward sums over the ranks, g's is the identity"
    return ""


def _output_hint(got: torch.Tensor, expected: torch.Tensor, bias: torch.Tensor, world_size: int,
                 bound: torch.Tensor) -> str:
    """Why the output is off, when the numbers say it: fc2's bias added on every rank before g's all_reduce."""
    if got.shape != expected.shape or world_size < 2:
        return ""
    extra = (world_size - 1) * bias.double().cpu().expand_as(got)
    slack = 4 * world_size * unit_roundoff(got.dtype) * bias.double().abs().cpu()  # the extra additions' rounding
    if verdict(got.double().cpu() - extra, expected, bound + slack).within:
        return (f": it is off by exactly (world_size - 1) = {world_size - 1} times fc2's bias, so every rank added "
                "b2 before g's all_reduce, which summed it world_size times. Add b2 once, after the all_reduce")
    return ""


def _weight_grads(module: nn.Module, expected: dict[str, torch.Tensor], bound: dict[str, torch.Tensor],
                  rank: int) -> Finding:
    params = dict(module.named_parameters())
    missing = [name for name in expected if name not in params]
    if missing:
        return Finding("weight_grads", False, f"rank {rank}'s ParallelMLP has no parameter(s) {missing}: keep "
                       "the shares as nn.Parameter s named w1, b1, w2, b2")
    for name, want in expected.items():
        found = _close("weight_grads", f"rank {rank}'s {name}.grad", params[name].grad, want, bound[name])
        if not found.passed:
            return found
    return Finding("weight_grads", True)


def _collectives(rank: int, forward: list, backward: list) -> Finding:
    for phase, calls in (("forward", forward), ("backward", backward)):
        counts = Counter(call.name for call in calls if call.name in COLLECTIVES)
        if counts != {"all_reduce": 1}:
            called = ", ".join(f"{name} x{n}" for name, n in counts.items()) or "no collective"
            return Finding("collectives", False, f"in {phase}, rank {rank} called {called}: the column-then-row "
                           f"MLP needs exactly one all_reduce in {phase} "
                           f"({'g, after fc2' if phase == 'forward' else 'f, on the gradient of x'}) and nothing else")
    return Finding("collectives", True)


def cross_check(config: dict, evidence: list[dict]) -> list[Finding]:
    """Outside the ranks: every rank's output against the unsplit MLP computed here."""
    truth, bias = reference(config)["y"], problem(config)[1].bias.detach()
    bound = limits(config, config["world_size"])["y"]
    for rank, seen in enumerate(evidence):
        found = _close("outputs", f"rank {rank}'s output (checked outside the ranks)", seen["y"], truth, bound,
                       _output_hint(seen["y"], truth, bias, config["world_size"], bound))
        if not found.passed:
            return named([found], earliest([e.get("divergence") for e in evidence]))
    return [Finding("outputs", True)]


def _run(world_size: int, seed: int | str, d_ff: int, label: str) -> dict:
    return {"world_size": world_size, "seed": seed, "d_model": 16, "d_ff": d_ff, "batch_size": 2, "seq_len": 4,
            "label": label, "timeout_s": 120.0}


LAB = Lab(
    name="tp_mlp",
    title="the tensor-parallel MLP: f, g, column- then row-parallel",
    notebook="08_tensor_pipeline",
    student_file="labs/tp_mlp.py",
    entry="ParallelMLP",
    checks=CHECKS,
    rank_check=check_on_rank,
    cross_check=cross_check,
    runs=(_run(4, 0, 64, "d_ff={d_ff}"),),  # one launch: a check takes well under 30 s here
    variant={"world_size": (4, 2), "d_ff": (64, 32, 96, 128)},  # each student's own (grader.labs.variant)
    uneven={"world_size": 2, "assumes": "4 ranks"},  # the self-check also runs this (grader.labs.core.Lab.uneven)
    hidden_runs=(_run(2, "jitter", 128, "d_ff=128"), _run(3, "jitter", 96, "d_ff=96")),
    shortcuts=tuple(f"course.model_parallel.tensor_parallel:{name}" for name in (
        "CopyToTensorParallel", "ReduceFromTensorParallel", "copy_to_tensor_parallel", "reduce_from_tensor_parallel",
        "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP")),
    hang_hint="Every rank must call each all_reduce: a rank that skips f or g leaves the others waiting in it.",
)

__all__ = ["LAB", "check_on_rank", "cross_check", "reference"]
