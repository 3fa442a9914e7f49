"""Pipeline schedules: in which order each stage runs the forwards (F) and backwards (B) of the micro-batches.

A schedule is, per stage, a list of :class:`Op` s; the ranks only run it (``pipeline``). Two schedules take the
same time with equal stages, ``(m+p-1)`` slots, and so have the same bubble ``(p-1)/(m+p-1)`` (:func:`simulate`
counts it), but hold very different amounts of activation memory (:func:`in_flight`)::

    GPipe  (Huang et al. 2019):  F0 F1 ... F(m-1)  then  B(m-1) ... B0          holds all m micro-batches
    1F1B   (PipeDream-Flush, Narayanan et al. 2021): stage s runs p-s-1 warm-up forwards, then alternates one
           forward and one backward, then drains the backwards             holds at most p-s <= p
    interleaved 1F1B: each rank holds v model chunks (virtual stages); the same work in v times as many, v times
           shorter ops shrinks the bubble to about (p-1)/(v·m+p-1), for v times as many messages
           (simulated here only: ``pipeline.run`` runs one chunk per rank)

A micro-batch is *in flight* on a stage from its forward until its backward: its activations are held.
Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from course.arguments import check_count
from course.model_parallel.bubble import Event, measured_bubble


@dataclass(frozen=True)
class Op:
    """One step of a stage: ``kind`` ``"F"`` (forward) or ``"B"`` (backward) of micro-batch ``micro_batch``, on the
    stage's model chunk ``chunk`` (interleaved schedules give each rank several; 0 otherwise)."""

    kind: str
    micro_batch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.micro_batch}" + (f"/{self.chunk}" if self.chunk else "")


Schedule = Callable[[int, int, int], list[Op]]


class Deadlock(ValueError):
    """Every stage of a simulated schedule waits for another; ``waits`` says where each waits, for what."""

    def __init__(self, name: str, waits: list[str]) -> None:
        super().__init__(f"{name} deadlocks: every stage waits for another ({'; '.join(waits)}).")
        self.waits = waits


def _check(num_stages: int, num_micro_batches: int, stage: int) -> tuple[int, int, int]:
    p = check_count("num_stages", num_stages, unit="number of stages (p)")
    m = check_count("num_micro_batches", num_micro_batches, unit="number of micro-batches (m)")
    return p, m, check_count("stage", stage, minimum=0, maximum=p - 1, unit="stage index")


def gpipe(num_stages: int, num_micro_batches: int, stage: int) -> list[Op]:
    """GPipe on ``stage``: every forward, then every backward in reverse order.

    Raises:
        ValueError: fewer than one stage or micro-batch, or a stage outside ``0 .. num_stages-1``.
    """
    _, m, _ = _check(num_stages, num_micro_batches, stage)
    return [Op("F", i) for i in range(m)] + [Op("B", i) for i in reversed(range(m))]


def one_f_one_b(num_stages: int, num_micro_batches: int, stage: int) -> list[Op]:
    """1F1B on ``stage``: ``min(p-stage-1, m)`` warm-up forwards, one-forward-one-backward, then the last backwards.

    Raises:
        ValueError: as :func:`gpipe`.
    """
    p, m, s = _check(num_stages, num_micro_batches, stage)
    warmup = min(p - s - 1, m)
    ops = [Op("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [Op("F", warmup + i), Op("B", i)]
    return ops + [Op("B", i) for i in range(m - warmup, m)]


def interleaved(num_stages: int, num_micro_batches: int, stage: int, chunks: int = 2) -> list[Op]:
    """Interleaved 1F1B (Narayanan et al. 2021, section 2.2.2) on ``stage``, which holds ``chunks`` model chunks:
    chunk ``c`` of rank ``s`` is virtual stage ``c·p + s``. Micro-batches go through in groups of ``p``, each group
    through chunk 0, then chunk 1, ...; warm-up as Megatron-LM's ``(p-s-1)·2 + (chunks-1)·p`` forwards.

    Raises:
        ValueError: as :func:`gpipe`, or ``m`` not a multiple of ``p``.
    """
    p, m, s = _check(num_stages, num_micro_batches, stage)
    v = check_count("chunks", chunks, unit="number of model chunks per stage")
    if m % p:
        raise ValueError(f"interleaved 1F1B sends micro-batches in groups of p = {p}: use a number of micro-batches "
                         f"that is a multiple of {p}, not {m}.")

    def op(kind: str, k: int) -> Op:
        chunk = (k // p) % v
        return Op(kind, (k // (p * v)) * p + k % p, chunk if kind == "F" else v - 1 - chunk)

    total = m * v
    warmup = min((p - s - 1) * 2 + (v - 1) * p, total)
    ops = [op("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [op("F", warmup + k), op("B", k)]
    return ops + [op("B", k) for k in range(total - warmup, total)]


SCHEDULES: dict[str, Schedule] = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved}


def held(ops: Sequence[Op]) -> list[int]:
    """Micro-batches held after each op: forwards run whose backward has not yet run."""
    counts, now = [], 0
    for op in ops:
        now += 1 if op.kind == "F" else -1
        counts.append(now)
    return counts


def in_flight(ops: Sequence[Op]) -> int:
    """The most micro-batches held at once: forwards run whose backward has not yet run."""
    return max([0, *held(ops)])


def check_ops(ops: Sequence[Op], num_micro_batches: int, chunks: int = 1) -> None:
    """Check that ``ops`` runs each micro-batch's forward once, and its backward once, after it (on each chunk).

    Raises:
        ValueError: naming the first micro-batch that is missing, repeated, or backwarded before its forward.
    """
    done: dict[str, set[tuple[int, int]]] = {"F": set(), "B": set()}
    for position, op in enumerate(ops):
        if op.kind not in done or not 0 <= op.micro_batch < num_micro_batches or not 0 <= op.chunk < chunks:
            raise ValueError(f"op {position} ({op}) is not a forward F or backward B of a micro-batch 0..."
                             f"{num_micro_batches - 1}.")
        key = (op.micro_batch, op.chunk)
        if key in done[op.kind]:
            raise ValueError(f"op {position} runs {op} a second time.")
        if op.kind == "B" and key not in done["F"]:
            raise ValueError(f"op {position} runs {op} before {Op('F', *key)}: a backward needs its forward.")
        done[op.kind].add(key)
    missing = [str(Op(kind, i, c)) for kind in "FB" for c in range(chunks) for i in range(num_micro_batches)
               if (i, c) not in done[kind]]
    if missing:
        raise ValueError(f"the schedule never runs {', '.join(missing)}.")


def simulate(schedule: Schedule, num_stages: int, num_micro_batches: int, forward_s: float = 1.0,
             backward_s: float = 2.0) -> list[Event]:
    """The timeline of ``schedule`` with equal stages: each op starts when its stage is free and its input has
    arrived (a forward needs the previous virtual stage's forward of that micro-batch, a backward the next virtual
    stage's backward and its own forward), communication free. A stage of ``v`` chunks takes ``1/v`` of the
    times per chunk.

    Returns:
        every stage's ops as ``course.model_parallel.bubble.Event`` s (``measured_bubble`` gives the idle fraction).

    Raises:
        Deadlock: (a ValueError) a schedule in which every stage waits for another, saying where each waits.
    """
    p, m = num_stages, num_micro_batches
    plans = [schedule(p, m, s) for s in range(p)]
    v = 1 + max(op.chunk for plan in plans for op in plan)
    waits: dict[int, str] = {}  # stage -> what it waits for, in this sweep
    end: dict[tuple[str, int, int], float] = {}
    position, free, events = [0] * p, [0.0] * p, []
    while any(position[s] < len(plans[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if position[s] == len(plans[s]):
                continue
            op = plans[s][position[s]]
            here = op.chunk * p + s  # the virtual stage
            needs = [("F", here - 1, op.micro_batch)] if op.kind == "F" else [
                ("B", here + 1, op.micro_batch), ("F", here, op.micro_batch)]
            needs = [need for need in needs if 0 <= need[1] < p * v]
            missing = [need for need in needs if need not in end]
            if missing:
                kind, virtual, i = missing[0]
                waits[s] = (f"stage {s} waits at its op {position[s]} ({op}) for stage {virtual % p}'s "
                            f"{Op(kind, i, virtual // p)}")
                continue
            start = max([free[s], *(end[need] for need in needs)])
            free[s] = end[(op.kind, here, op.micro_batch)] = start + (forward_s if op.kind == "F" else backward_s) / v
            events.append(Event(s, op.kind, op.micro_batch, start, free[s], op.chunk))
            position[s], progressed = position[s] + 1, True
        if not progressed:
            raise Deadlock(getattr(schedule, "__name__", str(schedule)), [waits[s] for s in sorted(waits)])
        waits.clear()
    return events


def simulated_bubble(schedule: Schedule, num_stages: int, num_micro_batches: int) -> float:
    """Idle fraction of :func:`simulate`'s timeline: ``(p-1)/(m+p-1)`` for GPipe and 1F1B, smaller interleaved."""
    return measured_bubble(simulate(schedule, num_stages, num_micro_batches))
