"""Lab (notebook 08): the student writes sequence parallelism's gather linear, forward and backward.

On every rank :func:`check_on_rank` builds the run's seeded unsplit linear (``weight`` (d_ff, d), ``bias``), input
``x`` (B, S, d) and upstream gradient (B, S, d_ff), and computes the unsplit output and gradients itself. It gives
the student's ``GatherLinear`` this rank's positions of ``x`` (``S/t`` of them) and this rank's ``k = d_ff/t`` rows
of the weight and bias, under a :class:`~course.runtime.comm_log.CommLog`, runs forward and backward and compares:
the output with the unsplit output's columns of this rank, the input's gradient with the unsplit one at this
rank's positions, the weight's and bias's gradients with their rows. :func:`cross_check` recomputes the unsplit
output outside the ranks. A file using the course's own version is refused (the lab's ``shortcuts``).

Checks: the output; the input's gradient (the reduce-scatter); the weight's and bias's gradients; the collectives
(an all-gather in forward; a reduce-scatter and no all_reduce in backward). "Equals" is within a bound derived
from the arithmetic (:mod:`.bounds`: the run's ``dtype``, world size and magnitudes), and a failing check's
message opens with the first tensor that diverged (:mod:`grader.labs.divergence`).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F  # noqa: N812

from course import world
from course.numerics.bounds import verdict
from course.numerics.divergence import FORWARD, GRADIENT, Recorder, first_divergence
from course.runtime import collective_names
from course.runtime.comm_log import COLLECTIVES, CommLog
from grader.labs.core import Check, Finding, Lab, RankFindings, StudentError, load_entry
from grader.labs.divergence import earliest, named
from grader.labs.sequence_parallel import bounds

CHECKS = (
    Check("outputs", "each rank's output equals its columns of the unsplit linear's output", 3),
    Check("input_grad", "each rank's input gradient equals the unsplit one at its positions (the reduce-scatter)", 3),
    Check("weight_grads", "each rank's weight and bias gradients equal its rows of the unsplit ones", 2),
    Check("collectives", "an all-gather in forward; a reduce-scatter and no all_reduce in backward", 2),
)
#: what each recorded tensor is, in the order forward and backward compute them
NAMES = {"y": "the gather linear", "bias": "bias", "weight": "weight", "x": "the input x"}
GATHERS = collective_names.functions("all_gather")  # every all-gather's name, old and new
SCATTERS = collective_names.functions("reduce_scatter")  # every reduce-scatter's name, old and new


def problem(config: dict) -> dict[str, torch.Tensor]:
    """The run's unsplit weight (d_ff, d), bias (d_ff,), input x (B, S, d) and upstream gradient (B, S, d_ff)."""
    generator = torch.Generator().manual_seed(config["seed"])
    d, d_ff, batch_size, seq_len = config["d_model"], config["d_ff"], config["batch_size"], config["seq_len"]
    dtype = getattr(torch, config.get("dtype", "float32"))  # drawn in float32, then rounded: the same data
    return {"weight": torch.randn(d_ff, d, generator=generator).to(dtype),
            "bias": torch.randn(d_ff, generator=generator).to(dtype),
            "x": torch.randn(batch_size, seq_len, d, generator=generator).to(dtype),
            "upstream": torch.randn(batch_size, seq_len, d_ff, generator=generator).to(dtype)}


def limits(config: dict, world_size: int) -> dict[str, torch.Tensor]:
    """name -> the largest |split - unsplit| rounding allows, element by element (unsplit shapes)."""
    return bounds.comparison_bounds(problem(config), getattr(torch, config.get("dtype", "float32")), world_size)


def reference(config: dict) -> dict[str, torch.Tensor]:
    """The unsplit linear's output and gradients (input, weight, bias), in one process."""
    data = problem(config)
    x, weight, bias = (data[name].clone().requires_grad_() for name in ("x", "weight", "bias"))
    y = F.linear(x, weight, bias)
    y.backward(data["upstream"])
    return {"y": y.detach(), "x": x.grad, "weight": weight.grad, "bias": bias.grad}


def _slices(config: dict, rank: int, world_size: int) -> tuple[slice, slice]:
    """This rank's rows of the weight (output columns) and its positions along the sequence."""
    k, s = config["d_ff"] // world_size, config["seq_len"] // world_size
    return slice(rank * k, (rank + 1) * k), slice(rank * s, (rank + 1) * s)


def check_on_rank(path: str, config: dict) -> RankFindings:
    """On every rank: run the student's GatherLinear forward and backward and compare with the unsplit linear."""
    me = world.current()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rows, positions = _slices(config, rank, world_size)
    data, truth = problem(config), reference(config)
    x = data["x"][:, positions].contiguous().to(me.device).requires_grad_()
    weight = data["weight"][rows].clone().to(me.device).requires_grad_()
    bias = data["bias"][rows].clone().to(me.device).requires_grad_()
    with CommLog() as log:
        gather_linear = load_entry(path, "GatherLinear")
        mark = log.mark()
        y = _explained(lambda: gather_linear.apply(x, weight, bias), path, "forward", rank)
        forward = log.since(mark)
        expected_y = truth["y"][..., rows]
        if not isinstance(y, torch.Tensor) or y.shape != expected_y.shape:
            return RankFindings([_shape("outputs", rank, y, expected_y)] + [
                Finding(c, False, "not run: the output has the wrong shape (see the first check)")
                for c in ("input_grad", "weight_grads", "collectives")], {"y": None})
        mark = log.mark()
        _explained(lambda: y.backward(data["upstream"][..., rows].to(me.device)), path, "backward", rank)
        backward = log.since(mark)
    share = (data["upstream"][..., rows] @ data["weight"][rows])[:, positions]  # this rank's term, unsummed
    whole = limits(config, world_size)
    bound = {"y": whole["y"][..., rows], "x": whole["x"][:, positions], "weight": whole["weight"][rows],
             "bias": whole["bias"][rows]}
    expected = {"y": expected_y, "x": truth["x"][:, positions], "weight": truth["weight"][rows],
                "bias": truth["bias"][rows]}
    found = [_close("outputs", f"rank {rank}'s output", y.detach(), expected_y, bound["y"]),
             _close("input_grad", f"rank {rank}'s gradient of x", x.grad, expected["x"], bound["x"],
                    _input_hint(x.grad, share, world_size, bound["x"])),
             _close("weight_grads", f"rank {rank}'s weight gradient", weight.grad, expected["weight"],
                    bound["weight"]),
             _collectives(rank, forward, backward)]
    bias_found = _close("weight_grads", f"rank {rank}'s bias gradient", bias.grad, expected["bias"], bound["bias"])
    if not bias_found.passed and found[2].passed:
        found[2] = bias_found
    divergence = _first_divergence(rank, {"y": y, "bias": bias.grad, "weight": weight.grad, "x": x.grad},
                                   expected, bound)
    return RankFindings(named(found, divergence), {"y": y.detach().cpu(), "divergence": divergence})


def _first_divergence(rank: int, got: dict, expected: dict, bound: dict):
    """The first of this rank's tensors (output, then the gradients backward returns) beyond rounding; the
    input's gradient is this rank's chunk of the sequence (chunk = rank)."""
    mine, theirs = Recorder(rank), Recorder(rank)
    for name in NAMES:
        phase, chunk = (FORWARD, None) if name == "y" else (GRADIENT, rank if name == "x" else None)
        mine.add(NAMES[name], phase, got[name], chunk)
        theirs.add(NAMES[name], phase, expected[name], chunk)
    names = {label: key for key, label in NAMES.items()}
    return first_divergence(mine.records, theirs.records, lambda record, _: bound[names[record.name]])


RETURNS = {"forward": "forward returns F.linear of the gathered input: (B, S, k)",
           "backward": "backward returns the gradients of x (B, S/t, d: this rank's positions only), weight and "
                       "bias, in that order"}


def _explained(step: Callable[[], Any], path: str, phase: str, rank: int) -> Any:
    """Run ``step``; an error raised by torch (not on a line of the student's file) is explained in their terms."""
    try:
        return step()
    except Exception as error:
        target = os.path.abspath(path)
        if any(os.path.abspath(f.filename) == target for f in traceback.extract_tb(error.__traceback__)):
            raise
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise StudentError(f"on rank {rank}, autograd rejected what your GatherLinear's {phase} returned: {first}. "
                           f"Its {RETURNS[phase]}.") from None


def _shape(check: str, rank: int, got: object, expected: torch.Tensor) -> Finding:
    if not isinstance(got, torch.Tensor):
        return Finding(check, False, f"rank {rank}'s GatherLinear returned {type(got).__name__}, expected a tensor "
                       f"of shape {tuple(expected.shape)}")
    hint = ""
    if got.shape[0] == expected.shape[0] * dist.get_world_size() or got.shape[-1] != expected.shape[-1]:
        hint = (": the ranks' positions were stacked along the wrong dimension; gather along the sequence (dim 1: "
                "put it first for all_gather_into_tensor, then transpose back)")
    return Finding(check, False, f"rank {rank}'s output has shape {tuple(got.shape)}, expected (B, S, k) = "
                   f"{tuple(expected.shape)}{hint}")


def _close(check: str, what: str, got: torch.Tensor | None, expected: torch.Tensor, bound: torch.Tensor,
           hint: str = "") -> Finding:
    if got is None:
        return Finding(check, False, f"{what} is None: nothing flowed back to it")
    if got.shape != expected.shape:
        return Finding(check, False, f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}")
    judged = verdict(got, expected, bound)
    worst = float((got.detach().double().cpu() - expected.double()).abs().max())
    return Finding(check, judged.within, "" if judged.within else
                   f"{what} differs from the unsplit linear's by up to {worst:.3g} (rounding allows "
                   f"{judged.bound:.2g} there){hint}")


def _input_hint(got: torch.Tensor | None, share: torch.Tensor, world_size: int, bound: torch.Tensor) -> str:
    """Why the input's gradient is off, when it is this rank's term only (the sum over the ranks is missing)."""
    if got is not None and got.shape == share.shape and verdict(got.detach().cpu(), share, bound).within:
        return (f": it is this rank's term only (grad @ weight of its {share.shape[-1]} columns); x needs the sum "
                f"over the {world_size} ranks at its positions: reduce-scatter, not the identity")
    return ""


def _collectives(rank: int, forward: list, backward: list) -> Finding:
    def called(calls: list) -> str:
        names = [call.name for call in calls if call.name in COLLECTIVES]
        return ", ".join(dict.fromkeys(names)) or "no collective"

    if not any(call.name in GATHERS for call in forward):
        return Finding("collectives", False, f"in forward, rank {rank} called {called(forward)}: the input must be "
                       "all-gathered along the sequence before the matmul")
    if any(call.name == "all_reduce" for call in backward):
        return Finding("collectives", False, f"in backward, rank {rank} called {called(backward)}: an all_reduce "
                       "gives every rank every position's gradient; x needs only its own positions, so "
                       "reduce-scatter (it sends half as much)")
    if not any(call.name in SCATTERS for call in backward):
        return Finding("collectives", False, f"in backward, rank {rank} called {called(backward)}: the gradient of x "
                       "is summed over the ranks with a reduce-scatter along the sequence")
    return Finding("collectives", True)


def cross_check(config: dict, evidence: list[dict]) -> list[Finding]:
    """Outside the ranks: every rank's output against its columns of the unsplit output computed here."""
    truth = reference(config)["y"]
    world_size = len(evidence)
    for rank, seen in enumerate(evidence):
        if seen["y"] is None:
            return []
        rows, _ = _slices(config, rank, world_size)
        found = _close("outputs", f"rank {rank}'s output (checked outside the ranks)", seen["y"], truth[..., rows],
                       limits(config, world_size)["y"][..., rows])
        if not found.passed:
            return named([found], earliest([e.get("divergence") for e in evidence]))
    return [Finding("outputs", True)]


def _run(world_size: int, seed: int | str, seq_len: int, label: str) -> dict:
    return {"world_size": world_size, "seed": seed, "d_model": 8, "d_ff": 8 * world_size, "batch_size": 2,
            "seq_len": seq_len, "label": label, "timeout_s": 60.0}


LAB = Lab(
    name="sequence_parallel",
    title="sequence parallelism: the gather linear's forward and backward",
    notebook="08_tensor_pipeline",
    student_file="labs/sequence_parallel.py",
    entry="GatherLinear",
    checks=CHECKS,
    rank_check=check_on_rank,
    cross_check=cross_check,
    runs=({**_run(4, 0, 8, "{seq_len} positions"), "d_ff": 32},),  # d_ff: 8 or 16 columns a rank at 4 or 2
    variant={"world_size": (4, 2), "seq_len": (8, 12, 16, 20)},  # each student's own (grader.labs.variant)
    uneven={"world_size": 2, "assumes": "4 ranks"},  # the self-check also runs this (grader.labs.core.Lab.uneven)
    hidden_runs=(_run(2, "jitter", 6, "6 positions"), _run(3, "jitter", 12, "12 positions")),
    shortcuts=tuple(f"course.model_parallel.sequence_parallel:{name}" for name in (
        "GatherLinear", "all_gather_sequence", "reduce_scatter_sequence", "SequenceParallelColumnLinear")),
    hang_hint="Every rank must call each all-gather and reduce-scatter: a rank that skips one leaves the others "
              "waiting in it.",
)

__all__ = ["LAB", "check_on_rank", "cross_check", "reference"]
