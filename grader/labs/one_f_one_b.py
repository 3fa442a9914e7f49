"""Lab (notebook 08): the student writes the 1F1B pipeline schedule, and the course's pipeline runs it for real.

On every rank :func:`check_on_rank` asks the student's ``one_f_one_b(p, m, stage)`` for this stage's ops and
checks that it runs every micro-batch's forward once and then its backward once. If every rank's schedule is well
formed (the ranks agree with one ``all_reduce``), the transformer cut into one stage per rank runs it with
point-to-point sends (``pipeline.run``), recording the micro-batches held after each op; the gradients are
compared with the unsplit model's on the same batch. :func:`cross_check` compares each rank's ops with 1F1B's.

Checks: a well-formed schedule; one device's gradients; at most p micro-batches in flight on every stage; the
1F1B order (p-stage-1 warm-up forwards, then one forward one backward, then the remaining backwards).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course import world
from course.model_parallel import pipeline, schedules, transformer
from grader.labs.core import Check, Finding, Lab, RankFindings, load_entry

CHECKS = (
    Check("well_formed", "every micro-batch runs forward once, then backward once, on every stage", 2),
    Check("gradients", "the pipeline's gradients equal one device's", 3),
    Check("in_flight", "at most p micro-batches in flight (activations held) on every stage", 3),
    Check("order", "the 1F1B order: p-stage-1 warm-up forwards, one forward one backward, the rest backward", 2),
)
NOT_RUN = "not run: some rank's schedule is not well formed (see the first check)"


def _ops(raw: object, num_micro_batches: int) -> tuple[list[schedules.Op], str]:
    """The student's ``[("F", 0), ...]`` as ops, and what is wrong with it ("" if nothing)."""
    try:
        ops = [schedules.Op(str(kind), int(i)) for kind, i in raw]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return [], f"returned {str(raw)[:80]}; expected a list of (\"F\" or \"B\", micro_batch) pairs"
    try:
        schedules.check_ops(ops, num_micro_batches)
    except ValueError as error:
        return ops, str(error)
    return ops, ""


def check_on_rank(path: str, config: dict) -> RankFindings:
    """On every rank: get this stage's schedule from the student, run it in the pipeline, compare."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), config["micro_batches"]
    ops, problem = _ops(load_entry(path, "one_f_one_b")(p, m, rank), m)
    device = world.current().device
    everyone = torch.tensor([0 if problem else 1], device=device)
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    evidence = {"ops": [str(op) for op in ops]}
    if problem:
        return RankFindings([Finding("well_formed", False, f"stage {rank} of {p}, {m} micro-batches: {problem}")],
                          evidence)
    if not everyone.item():
        return RankFindings([Finding("well_formed", True)] + [Finding(c, False, NOT_RUN) for c in ("gradients",
                                                                                              "in_flight")], evidence)
    model_config = transformer.Config(d_model=16, num_heads=2, d_ff=32, seq_len=8, num_layers=p)
    inputs, targets = transformer.sample_batch(model_config, m, config["seed"], device)
    stage = pipeline.split(transformer.build(model_config, config["seed"], device), p)[rank]
    record = pipeline.run(stage, ops, inputs, targets, m)
    full = transformer.build(model_config, config["seed"], device)
    transformer.loss(full(inputs), targets).backward()
    reference = dict(full.named_parameters())
    worst = max(float((q.grad - reference[name].grad).abs().max()) for name, q in stage.named_parameters())
    held = max(record.in_flight)
    return RankFindings([
        Finding("well_formed", True),
        Finding("gradients", worst < 1e-5, "" if worst < 1e-5 else
                f"stage {rank}'s gradients differ from one device's by up to {worst:.3g}"),
        Finding("in_flight", held <= p, "" if held <= p else
                f"stage {rank} held {held} micro-batches at once (after {_until(record, held)}); 1F1B never holds "
                f"more than p = {p}: start a backward as soon as one can run"),
    ], evidence)


def _until(record: pipeline.Record, held: int) -> str:
    """The ops run until the rank first held ``held`` micro-batches, e.g. ``"F0 F1 F2 F3 F4"``."""
    return " ".join(record.ops[:record.in_flight.index(held) + 1])


def cross_check(config: dict, evidence: list[dict]) -> list[Finding]:
    """Outside the ranks: each stage's ops against 1F1B's, the first difference explained."""
    p, m = config["world_size"], config["micro_batches"]
    for stage, seen in enumerate(evidence):
        expected = [str(op) for op in schedules.one_f_one_b(p, m, stage)]
        if seen["ops"] != expected:
            where = next((i for i, (a, b) in enumerate(zip(seen["ops"], expected, strict=False)) if a != b),
                         min(len(seen["ops"]), len(expected)))
            got = seen["ops"][where] if where < len(seen["ops"]) else "nothing"
            return [Finding("order", False, f"stage {stage}'s op {where} is {got}, 1F1B runs "
                            f"{expected[where] if where < len(expected) else 'nothing'} there: stage {stage} warms "
                            f"up with p-stage-1 = {min(p - stage - 1, m)} forward(s), then alternates F and B "
                            f"(1F1B on this stage: {' '.join(expected)})")]
    return [Finding("order", True)]


def _run(world_size: int, micro_batches: int, seed: int | str) -> dict:
    return {"world_size": world_size, "micro_batches": micro_batches, "seed": seed,
            "label": f"{world_size} stages, {micro_batches} micro-batches", "timeout_s": 120.0}


LAB = Lab(
    name="one_f_one_b",
    title="the 1F1B pipeline schedule",
    notebook="08_tensor_pipeline",
    student_file="labs/one_f_one_b.py",
    entry="one_f_one_b",
    checks=CHECKS,
    rank_check="grader.labs.one_f_one_b:check_on_rank",
    cross_check="grader.labs.one_f_one_b:cross_check",
    # fewer micro-batches than stages in a visible run: a warm-up of p-stage-1 forwards needs its cap at m
    runs=(_run(4, 8, 0), _run(4, 2, 1)),
    hidden_runs=(_run(4, 3, "jitter"), _run(3, 7, "jitter"), _run(3, 1, "jitter")),
    shortcuts=("course.model_parallel.schedules:one_f_one_b", "course.model_parallel.schedules:interleaved"),
    hang_hint=("A pipeline hangs when a stage waits to receive what its neighbour will only send later: check "
               "that every stage runs its micro-batches forward in order 0, 1, 2, ... and backward in that order."),
)

__all__ = ["LAB", "check_on_rank", "cross_check"]
