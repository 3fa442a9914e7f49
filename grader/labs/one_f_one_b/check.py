"""Lab (notebook 08): the student writes the 1F1B pipeline schedule, its interleaved variant and a simulation of the
stages; the schedules are simulated together, and 1F1B runs for real in the course's pipeline.

On every rank :func:`check_on_rank` asks the student's ``one_f_one_b(p, m, stage)`` and
``interleaved(p, m', stage, v)`` for every stage (pure functions: each rank sees every stage), then judges both
with pure functions of the ops (:func:`analyse`):

* ``well_formed``: every (micro-batch, chunk) runs forward once, then backward once, on every stage;
* ``no_deadlock``: the stages' schedules run together (``schedules.simulate``: each op waits for its stage and for
  the neighbour's op it needs) without every stage waiting on another; then 1F1B runs for real (``pipeline.run``,
  point-to-point sends between ranks) and its gradients are compared with the unsplit model's, within a bound
  derived from the arithmetic (:mod:`grader.labs.pipeline_runner.bounds`: the tokens summed, the number of
  micro-batches, the magnitudes seen), the first gradient beyond it named;
* ``in_flight``: the most micro-batches a stage holds at once (forwarded, not yet backwarded): at most ``p - s`` on
  stage ``s`` under 1F1B (GPipe holds all ``m``); interleaved, no more (micro-batch, chunk) pairs than Megatron-LM's
  schedule holds, ``2(p-s-1) + (v-1)p + 1``;
* ``bubble``: the simulated idle share of the step (equal stages, a backward twice a forward) equals the closed form,
  ``(p-1)/(m+p-1)`` for 1F1B and ``(p-1)/(v·m+p-1)`` interleaved;
* ``simulator``: the student's own simulation, ``idle_fraction(plans)``, gives the idle share ``schedules.simulate``
  gives on GPipe's plans, on a schedule without warm-up and on the student's 1F1B, and raises ``ValueError`` on a
  schedule that deadlocks (the warm-up counted from the wrong end). Only wrong schedules and GPipe are shown to it.

A schedule that is not well formed is not simulated (its other checks say "not run"); one that deadlocks has no
bubble. The course's own schedules are refused (``shortcuts``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch.distributed as dist

from course import world
from course.model_parallel import pipeline, schedules, transformer
from course.model_parallel.bubble import measured_bubble
from grader.labs.core import Check, Finding, Lab, load_entry
from grader.labs.pipeline_runner import bounds

CHECKS = (
    Check("well_formed", "every micro-batch runs forward once, then backward once, on every stage (and chunk)", 2),
    Check("no_deadlock", "the stages' schedules run together without deadlock; 1F1B's gradients equal one device's",
          3),
    Check("in_flight", "stage s holds at most p - s micro-batches under 1F1B (GPipe: m), interleaved no more than "
          "Megatron-LM's schedule", 3),
    Check("bubble", "the simulated bubble is the closed form: (p-1)/(m+p-1), interleaved (p-1)/(v·m+p-1)", 2),
    Check("simulator", "your idle_fraction finds the bubble of GPipe, of no warm-up and of your 1F1B, and raises on a "
          "deadlock", 2),
)


@dataclass
class Attempt:
    """One of the student's two functions, asked for every stage of one pipeline, and what it does."""

    name: str  # "one_f_one_b" or "interleaved"
    num_stages: int
    num_micro_batches: int
    chunks: int  # model chunks per rank (1 for 1F1B)
    plans: list[list[schedules.Op]] = field(default_factory=list)  # each stage's ops
    problem: str = ""  # why it is not well formed ("" if it is)
    deadlock: str = ""  # who waits for whom ("" if it runs)
    bubble: float | None = None  # simulated idle share of the step (None if it could not run)

    @property
    def label(self) -> str:
        v = f", {self.chunks} chunks per rank" if self.chunks > 1 else ""
        return f"{self.name}({self.num_stages} stages, {self.num_micro_batches} micro-batches{v})"

    @property
    def closed_form(self) -> float:
        p, m, v = self.num_stages, self.num_micro_batches, self.chunks
        return (p - 1) / (v * m + p - 1)

    def bound(self, stage: int) -> int:
        """The most (micro-batch, chunk) pairs ``stage`` may hold at once."""
        p, v = self.num_stages, self.chunks
        return p - stage if v == 1 else 2 * (p - stage - 1) + (v - 1) * p + 1


def _ops(raw: object, chunked: bool) -> list[schedules.Op]:
    """The student's ``[("F", 0), ...]`` (or ``("F", 0, chunk)``) as ops; ValueError saying what is wrong."""
    shape = '("F" or "B", micro_batch, chunk) triples' if chunked else '("F" or "B", micro_batch) pairs'
    try:
        ops = [schedules.Op(str(op[0]), int(op[1]), int(op[2]) if chunked else 0) for op in raw]  # type: ignore
        if any(len(op) != (3 if chunked else 2) for op in raw):  # type: ignore[union-attr]
            raise ValueError
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"returned {str(raw)[:80]}; expected a list of {shape}") from None
    return ops


def analyse(function: Callable, name: str, num_stages: int, num_micro_batches: int, chunks: int = 1) -> Attempt:
    """Ask ``function`` for every stage; check each stage's ops, then simulate them together."""
    attempt = Attempt(name, num_stages, num_micro_batches, chunks)
    for stage in range(num_stages):
        try:
            raw = function(num_stages, num_micro_batches, stage, chunks) if chunks > 1 else function(
                num_stages, num_micro_batches, stage)
        except NotImplementedError:
            attempt.problem = f"not written yet: your {name} still raises NotImplementedError"
            return attempt
        try:
            ops = _ops(raw, chunks > 1)
            schedules.check_ops(ops, num_micro_batches, chunks)
        except ValueError as error:
            attempt.problem = f"stage {stage}: {error}"
            return attempt
        attempt.plans.append(ops)

    def students(_p: int, _m: int, stage: int) -> list[schedules.Op]:
        return attempt.plans[stage]

    try:
        attempt.bubble = measured_bubble(schedules.simulate(students, num_stages, num_micro_batches))
    except schedules.Deadlock as error:
        attempt.deadlock = "; ".join(error.waits)
    return attempt


# -- verdicts (pure functions of the attempts) --------------------------------------------------------------------
def _not_run(attempt: Attempt) -> str:
    return f"not run: {attempt.label} is not well formed (see the first check)"


def judge_well_formed(attempts: list[Attempt]) -> Finding:
    for attempt in attempts:
        if attempt.problem:
            return Finding("well_formed", False, f"{attempt.label}: {attempt.problem}")
    return Finding("well_formed", True)


def judge_no_deadlock(attempts: list[Attempt]) -> Finding:
    for attempt in attempts:
        if attempt.problem:
            return Finding("no_deadlock", False, _not_run(attempt))
        if attempt.deadlock:
            return Finding("no_deadlock", False, f"{attempt.label} deadlocks: {attempt.deadlock}. Every stage must "
                           "run its micro-batches in the order its neighbours send them: forwards in the order "
                           "the previous stage sends, backwards in the order the next stage sends")
    return Finding("no_deadlock", True)


def judge_in_flight(attempts: list[Attempt]) -> Finding:
    for attempt in attempts:
        if attempt.problem:
            return Finding("in_flight", False, _not_run(attempt))
        for stage, ops in enumerate(attempt.plans):
            counts = schedules.held(ops)  # micro-batches (or (micro-batch, chunk) pairs) held after each op
            if max(counts) <= attempt.bound(stage):
                continue
            until = " ".join(map(str, ops[:counts.index(max(counts)) + 1]))
            p, v = attempt.num_stages, attempt.chunks
            rule = (f"1F1B never holds more than p - stage = {attempt.bound(stage)} there: start a backward as soon "
                    "as one can arrive" if v == 1 else f"Megatron-LM's interleaved schedule holds at most "
                    f"2(p-s-1) + (v-1)p + 1 = {attempt.bound(stage)} there (p = {p}, v = {v}): fewer warm-up "
                    "forwards, and backwards as soon as they can arrive")
            return Finding("in_flight", False, f"{attempt.label}: stage {stage} holds {max(counts)} at once (after "
                           f"{until}); {rule}")
    return Finding("in_flight", True)


def _warmups(attempt: Attempt) -> list[int]:
    """Forwards each stage runs before its first backward."""
    return [next((k for k, op in enumerate(ops) if op.kind == "B"), len(ops)) for ops in attempt.plans]


def judge_bubble(attempts: list[Attempt]) -> Finding:
    for attempt in attempts:
        if attempt.problem:
            return Finding("bubble", False, _not_run(attempt))
        if attempt.bubble is None:
            return Finding("bubble", False, f"not run: {attempt.label} deadlocks (see no_deadlock)")
        if abs(attempt.bubble - attempt.closed_form) > 1e-9:
            form = "(p-1)/(m+p-1)" if attempt.chunks == 1 else "(p-1)/(v·m+p-1)"
            return Finding("bubble", False, f"{attempt.label}: each stage is idle {attempt.bubble:.1%} of the step "
                           f"(simulated: equal stages, a backward twice a forward), {form} = "
                           f"{attempt.closed_form:.1%} for this schedule; your stages run "
                           f"{_warmups(attempt)} forwards before their first backward: a stage that waits for a "
                           "backward while it could still run a forward leaves the pipeline idle")
    return Finding("bubble", True)


Plans = list[list[tuple[str, int]]]


def simulator_cases(plain: Attempt) -> list[tuple[str, Plans]]:
    """What the student's ``idle_fraction`` is asked to simulate: GPipe, no warm-up, the student's own 1F1B (if it is
    well formed) and a warm-up counted from the wrong end (it deadlocks when p > 1 and m > 1)."""
    p, m = plain.num_stages, plain.num_micro_batches

    def warming_up(warmup: Callable[[int], int]) -> Plans:
        plans = []
        for stage in range(p):
            w = min(warmup(stage), m)
            ops = [("F", i) for i in range(w)]
            for i in range(m - w):
                ops += [("F", w + i), ("B", i)]
            plans.append(ops + [("B", i) for i in range(m - w, m)])
        return plans

    cases = [("GPipe", [[(op.kind, op.micro_batch) for op in schedules.gpipe(p, m, s)] for s in range(p)]),
             ("a schedule without warm-up (F i, B i in turn)", warming_up(lambda stage: 0)),
             ("a warm-up counted from the wrong end (stage s runs s forwards first)", warming_up(lambda stage: stage))]
    if not plain.problem:
        cases.append(("your one_f_one_b", [[(op.kind, op.micro_batch) for op in ops] for ops in plain.plans]))
    return cases


def _reference(plans: Plans) -> float | None:
    """``schedules.simulate``'s idle share of ``plans``; None if they deadlock."""
    def given(_p: int, _m: int, stage: int) -> list[schedules.Op]:
        return [schedules.Op(kind, i) for kind, i in plans[stage]]
    try:
        return measured_bubble(schedules.simulate(given, len(plans), 1 + max(i for ops in plans for _, i in ops)))
    except schedules.Deadlock:
        return None


def judge_simulator(idle_fraction: Callable, cases: list[tuple[str, Plans]]) -> Finding:
    """Finding for ``simulator``: the student's ``idle_fraction`` on each case against ``schedules.simulate``."""
    for label, plans in cases:
        expected = _reference(plans)
        where = f"on {label} ({len(plans)} stages, {len(plans[0]) // 2} micro-batches)"
        try:
            got = idle_fraction([list(ops) for ops in plans])
        except NotImplementedError:
            return Finding("simulator", False, "not written yet: your idle_fraction still raises NotImplementedError")
        except ValueError as error:
            if expected is None:
                continue
            return Finding("simulator", False, f"{where} your idle_fraction raised ValueError ({error}), but every op "
                           f"of it can run (idle {expected:.4f}): a stage waits only for the neighbour it receives "
                           "from, and only while that neighbour has not run the op it needs")
        except Exception as error:  # noqa: BLE001 - the student's code: any error is explained, not raised
            return Finding("simulator", False, f"{where} your idle_fraction raised {type(error).__name__}: {error}")
        if expected is None:
            return Finding("simulator", False, f"{where} every stage ends up waiting for another (a deadlock), yet "
                           f"your idle_fraction returned {got!r}: raise ValueError when a round over the stages "
                           "runs nothing")
        if not isinstance(got, (int, float)) or abs(got - expected) > 1e-9:
            return Finding("simulator", False, f"{where} your idle_fraction says {got!r}, the simulation "
                           f"{expected:.4f}: a forward waits for the previous stage's forward, a backward for the "
                           "next stage's backward, and every op for its own stage to finish the one before")
    return Finding("simulator", True)


# -- on every rank ----------------------------------------------------------------------------------------------
def _run_for_real(config: dict, attempt: Attempt) -> Finding:
    """1F1B in the course's pipeline on this rank's stage; its gradients against the unsplit model's."""
    rank, p, m = dist.get_rank(), attempt.num_stages, attempt.num_micro_batches
    device = world.current().device
    model_config = transformer.Config(d_model=16, num_heads=2, d_ff=32, seq_len=8, num_layers=p)
    inputs, targets = transformer.sample_batch(model_config, m, config["seed"], device)
    stage = pipeline.split(transformer.build(model_config, config["seed"], device), p)[rank]
    pipeline.run(stage, attempt.plans[rank], inputs, targets, m)
    full = transformer.build(model_config, config["seed"], device)
    limits = bounds.gradient_bounds(full, inputs, targets, m)
    divergence = bounds.first_beyond(stage, dict(full.named_parameters()), limits, rank)
    if divergence is not None:
        return Finding("no_deadlock", False, f"after your 1F1B ran, {divergence}: this is a bug in the course, not "
                       "in your schedule; please report it")
    return Finding("no_deadlock", True)


def _judged(path: str, config: dict, p: int) -> tuple[list[Finding], Attempt]:
    """Both of the student's schedules for every stage, judged by pure functions; and the plain 1F1B attempt."""
    plain = analyse(load_entry(path, "one_f_one_b"), "one_f_one_b", p, config["micro_batches"])
    chunked = analyse(load_entry(path, "interleaved"), "interleaved", p, config["interleaved_groups"] * p,
                      config["chunks"])
    attempts = [plain, chunked]
    return [judge_well_formed(attempts), judge_no_deadlock(attempts), judge_in_flight(attempts),
            judge_bubble(attempts), judge_simulator(load_entry(path, "idle_fraction"), simulator_cases(plain))], plain


def precheck(path: str, config: dict) -> list[Finding]:
    """Before any rank starts (:attr:`grader.labs.core.Lab.precheck`): the schedules simulated; a deadlock stands
    for the run (every check judged here, who waits for whom named), so no rank is started for it."""
    findings, _ = _judged(path, config, config["world_size"])
    deadlocked = next(f for f in findings if f.check == "no_deadlock")
    return findings if not deadlocked.passed and not deadlocked.message.startswith("not run") else []


def check_on_rank(path: str, config: dict) -> list[Finding]:
    """On every rank: both of the student's schedules for every stage, judged; 1F1B then runs for real."""
    findings, plain = _judged(path, config, dist.get_world_size())
    if not plain.problem and not plain.deadlock:  # every rank decides alike: each saw every stage
        findings.append(_run_for_real(config, plain))
    return findings


def _run(world_size: int, micro_batches: int, chunks: int, interleaved_groups: int, seed: int | str) -> dict:
    """A run: 1F1B on ``micro_batches``, interleaved on ``interleaved_groups`` groups of p micro-batches."""
    return {"world_size": world_size, "micro_batches": micro_batches, "chunks": chunks,
            "interleaved_groups": interleaved_groups, "seed": seed, "timeout_s": 120.0,
            "label": "{world_size} stages, {micro_batches} micro-batches (interleaved: {interleaved_groups}·p "
                     "micro-batches, {chunks} chunks per rank)"}


LAB = Lab(
    name="one_f_one_b",
    title="the 1F1B pipeline schedule and interleaved 1F1B",
    notebook="08_tensor_pipeline",
    student_file="labs/one_f_one_b.py",
    entry="one_f_one_b",
    checks=CHECKS,
    rank_check=check_on_rank,
    # fewer micro-batches than stages in a visible run: a warm-up of p-stage-1 forwards needs its cap at m
    runs=(_run(4, 8, 2, 2, 0), _run(4, 2, 3, 1, 1)),
    # each student's own pipeline (grader.labs.variant); the second run keeps m < p whatever the variant
    variant={"world_size": (4, 3), "micro_batches": (8, 6, 5, 7), "chunks": (2, 3), "interleaved_groups": (2, 3)},
    uneven={"world_size": 3, "micro_batches": 5, "assumes": "4 stages"},  # the self-check also runs this
    hidden_runs=(_run(4, 3, 2, 3, "jitter"), _run(3, 7, 2, 2, "jitter"), _run(3, 1, 4, 1, "jitter")),
    precheck=precheck,  # a deadlocking schedule is reported before any rank starts
    shortcuts=("course.model_parallel.schedules:one_f_one_b", "course.model_parallel.schedules:interleaved",
               "course.model_parallel.schedules:simulate", "course.model_parallel.schedules:simulated_bubble"),
    hang_hint=("A pipeline hangs when a stage waits to receive what its neighbour will only send later: check "
               "that every stage runs its micro-batches forward in order 0, 1, 2, ... and backward in that order. "
               "Or your idle_fraction loops for ever on a deadlock: stop when a round over the stages runs nothing."),
)

__all__ = ["LAB", "Attempt", "analyse", "check_on_rank", "judge_bubble", "judge_in_flight", "judge_no_deadlock",
           "judge_simulator", "judge_well_formed", "precheck", "simulator_cases"]
