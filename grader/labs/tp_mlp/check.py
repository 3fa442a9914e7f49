"""Lab (notebook 08): the student writes Megatron's *f* and *g* and the column-then-row-parallel MLP.

On every rank :func:`check_on_rank` builds the run's seeded ``fc1``, ``fc2``, input ``x`` and upstream gradient,
computes the unsplit MLP's output and gradients itself (torch, one process), then loads the student's file under a
:class:`~course.runtime.comm_log.CommLog`, builds ``ParallelMLP(fc1, fc2)``, runs forward and backward and records the
calls of each. :func:`cross_check` recomputes the unsplit output outside the ranks and compares every rank's.

Checks: the output equals the unsplit MLP's on every rank; the input's gradient too (*f*'s backward); this rank's
``w1, b1, w2, b2`` gradients equal its slices of the unsplit ones; exactly one ``all_reduce`` in forward and one in
backward, no other collective.
"""

from __future__ import annotations

import copy
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F  # noqa: N812

from course import world
from course.runtime.comm_log import COLLECTIVES, CommLog
from grader.labs.core import Check, Finding, Lab, RankFindings, load_entry

CHECKS = (
    Check("outputs", "the output equals the unsplit MLP's on every rank", 3),
    Check("input_grad", "the input's gradient equals the unsplit MLP's (f's backward)", 2),
    Check("weight_grads", "each rank's w1, b1, w2, b2 gradients equal its slices of the unsplit gradients", 3),
    Check("collectives", "one all_reduce in forward and one in backward per MLP, no other collective", 2),
)
TOLERANCE = 1e-5


def problem(config: dict, device: torch.device | str = "cpu"
            ) -> tuple[nn.Linear, nn.Linear, torch.Tensor, torch.Tensor]:
    """The run's unsplit ``fc1``, ``fc2``, input ``x`` (B, S, d) and upstream gradient (B, S, d), from its seed, on
    ``device`` (drawn on the CPU, so the same on every device)."""
    torch.manual_seed(config["seed"])
    d, d_ff, batch_size, seq_len = config["d_model"], config["d_ff"], config["batch_size"], config["seq_len"]
    fc1, fc2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)
    x, upstream = torch.randn(batch_size, seq_len, d), torch.randn(batch_size, seq_len, d)
    return fc1.to(device), fc2.to(device), x.to(device), upstream.to(device)


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
    found = [_close("outputs", f"rank {rank}'s output", y.detach(), truth["y"],
                    _output_hint(y.detach(), truth["y"], fc2.bias.detach(), world_size)),
             _close("input_grad", f"rank {rank}'s gradient of x", x.grad, truth["x"], _input_hint(x.grad, truth))]
    found.append(_weight_grads(parallel_mlp, _local(truth, rank, world_size), rank))
    found.append(_collectives(rank, forward, backward))
    return RankFindings(found, {"y": y.detach().cpu()})  # compared outside the ranks, on the CPU


def _close(check: str, what: str, got: torch.Tensor | None, expected: torch.Tensor, hint: str = "") -> Finding:
    if got is None:
        return Finding(check, False, f"{what} is None: nothing flowed back to it")
    if got.shape != expected.shape:
        return Finding(check, False, f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    worst = float((got - expected).abs().max())
    return Finding(check, worst <= TOLERANCE, "" if worst <= TOLERANCE else
                   f"{what} differs from the unsplit MLP's by up to {worst:.3g}{hint}")


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


def _output_hint(got: torch.Tensor, expected: torch.Tensor, bias: torch.Tensor, world_size: int) -> str:
    """Why the output is off, when the numbers say it: fc2's bias added on every rank before g's all_reduce."""
    if got.shape != expected.shape or world_size < 2:
        return ""
    if torch.allclose(got - expected, (world_size - 1) * bias.expand_as(got), atol=TOLERANCE):
        return (f": it is off by exactly (world_size - 1) = {world_size - 1} times fc2's bias, so every rank added "
                "b2 before g's all_reduce, which summed it world_size times. Add b2 once, after the all_reduce")
    return ""


def _weight_grads(module: nn.Module, expected: dict[str, torch.Tensor], rank: int) -> Finding:
    params = dict(module.named_parameters())
    missing = [name for name in expected if name not in params]
    if missing:
        return Finding("weight_grads", False, f"rank {rank}'s ParallelMLP has no parameter(s) {missing}: keep "
                       "the shares as nn.Parameter s named w1, b1, w2, b2")
    for name, want in expected.items():
        found = _close("weight_grads", f"rank {rank}'s {name}.grad", params[name].grad, want)
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
    for rank, seen in enumerate(evidence):
        found = _close("outputs", f"rank {rank}'s output (checked outside the ranks)", seen["y"], truth,
                       _output_hint(seen["y"], truth, bias, config["world_size"]))
        if not found.passed:
            return [found]
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
    hidden_runs=(_run(2, "jitter", 128, "d_ff=128"), _run(3, "jitter", 96, "d_ff=96")),
    shortcuts=tuple(f"course.model_parallel.tensor_parallel:{name}" for name in (
        "CopyToTensorParallel", "ReduceFromTensorParallel", "copy_to_tensor_parallel", "reduce_from_tensor_parallel",
        "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP")),
    hang_hint="Every rank must call each all_reduce: a rank that skips f or g leaves the others waiting in it.",
)

__all__ = ["LAB", "check_on_rank", "cross_check", "reference"]
