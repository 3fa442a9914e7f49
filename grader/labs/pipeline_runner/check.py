"""Lab (notebook 08): the student writes the pipeline runner's steps, and 1F1B runs on their sends and receives.

On every rank :func:`check_on_rank` cuts the run's seeded transformer into one stage per rank
(:func:`course.model_parallel.pipeline.split`), gives the student's ``run_stage`` this rank's stage, its 1F1B order
(:func:`course.model_parallel.schedules.one_f_one_b`), the micro-batches and the loss, and compares the stage's
gradients with the unsplit model's on the same batch. Meanwhile every message the student posts is recorded,
however ``isend``/``irecv`` were imported (:class:`Messages`, through the process group), and a received tensor holds
NaN until its request's ``wait()`` returns, so that a tensor read before its ``irecv`` completed is wrong on every
run, not only on a slow machine. All of it happens on the rank's one thread, in the order the student posts: legal
on NCCL, whose rules the ranks keep (:mod:`course.runtime.nccl_rules`).
A file using the course's own runner is refused (the lab's ``shortcuts``). A stage that waits for what its
neighbour never sends hangs: the run's limit is short, and the report says which ranks waited where.

Checks: the gradients equal the unsplit model's, within a bound derived from the arithmetic (:mod:`.bounds`: the
tokens summed, the number of micro-batches, the magnitudes seen), and a miss names the first gradient beyond it, in
the order backward makes them (:mod:`grader.labs.divergence`); every activation goes to rank + 1 and every
gradient to rank - 1, with ``isend``/``irecv``, one of each per micro-batch and neighbour.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from course import world
from course.model_parallel import pipeline, schedules, transformer
from course.numerics.divergence import Divergence
from course.runtime import message_headers, observed
from course.runtime.observed_record import Record
from grader.labs.core import Check, Finding, Lab, RankFindings, StudentError, load_entry
from grader.labs.divergence import named
from grader.labs.pipeline_runner import bounds
from grader.labs.pipeline_runner.precheck import precheck

CHECKS = (
    Check("gradients", "each stage's gradients equal the unsplit model's after one 1F1B step", 5),
    Check("peers", "activations go to rank + 1 and gradients to rank - 1, with isend/irecv, once per micro-batch", 3),
    Check("waits", "every isend and irecv request is waited (an irecv before its tensor is read)", 2),
)


class _Request(dist.Work):
    """What the student's ``isend`` or ``irecv`` returns: the group's request, and whether the student waited it."""

    def __init__(self, request: Any) -> None:
        super().__init__()
        self.request, self.waited = request, False

    def wait(self, timeout: Any = None) -> bool:
        self.waited = True
        return self.request.wait() if timeout is None else self.request.wait(timeout)

    def is_completed(self) -> bool:
        return bool(self.request.is_completed())

    def source_rank(self) -> int:
        return self.request.source_rank()


class Messages:
    """While open, ``calls`` records ``(name, peer)`` of every message the student's code posts, however it reached
    the process group (``from torch.distributed import isend`` too: :mod:`course.runtime.observed`), and a received
    tensor is filled only when its request's ``wait()`` returns (NaN until then:
    :func:`course.runtime.message_headers.delivered_at_wait`)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.requests: list[_Request] = []  # in the order of calls
        self._open = contextlib.ExitStack()

    def __enter__(self) -> Messages:
        self._open.enter_context(observed.listening(self._listen))
        self._open.enter_context(message_headers.delivered_at_wait())
        return self

    def __exit__(self, *exc: object) -> None:
        self._open.close()

    def _listen(self, record: Record) -> Callable[[Any], Any] | None:
        if record.kind != "p2p" or record.peer is None:
            return None
        self.calls.append((record.api, record.peer))

        def tracked(request: Any) -> _Request:
            self.requests.append(_Request(request))
            return self.requests[-1]
        return tracked

    def unwaited(self) -> list[int]:
        """Indices (into ``calls``) of the requests the student never waited; each is waited here, so none hangs."""
        missed = [index for index, request in enumerate(self.requests) if not request.waited]
        for index in missed:
            self.requests[index].wait()
        return missed


def _model_config(p: int) -> transformer.Config:
    return transformer.Config(d_model=16, num_heads=2, d_ff=32, seq_len=8, num_layers=p)


def check_on_rank(path: str, config: dict) -> RankFindings:
    """On every rank: run the student's run_stage on this rank's stage in 1F1B order; compare its gradients."""
    me = world.current()
    rank, p, m = dist.get_rank(), dist.get_world_size(), config["micro_batches"]
    model_config = _model_config(p)
    inputs, targets = transformer.sample_batch(model_config, m, config["seed"])
    stage = pipeline.split(transformer.build(model_config, config["seed"]).to(me.device), p)[rank]
    micro_inputs = [x.to(me.device) for x in inputs.chunk(m)]
    micro_targets = [y.to(me.device) for y in targets.chunk(m)]
    ops = [(op.kind, op.micro_batch) for op in schedules.one_f_one_b(p, m, rank)]
    shape = (len(micro_inputs[0]), model_config.seq_len, model_config.d_model)
    run_stage = load_entry(path, "run_stage")
    with Messages() as sends:
        try:
            run_stage(stage, ops, micro_inputs, lambda out, i: transformer.loss(out, micro_targets[i]) / m, shape)
        except RuntimeError as error:
            if "backward through the graph a second time" not in str(error):
                raise
            raise StudentError(f"stage {rank}'s run_stage ran a backward twice through the same forward: each "
                               "backward must use its own micro-batch's x and out; keep them per micro-batch (a "
                               "dict keyed by i) until that micro-batch's backward") from None
        unwaited = sends.unwaited()
    full = transformer.build(model_config, config["seed"]).to(me.device)
    limits = bounds.gradient_bounds(full, inputs.to(me.device), targets.to(me.device), m)
    divergence = bounds.first_beyond(stage, dict(full.named_parameters()), limits, rank)
    return RankFindings(named([_gradients(stage, divergence, rank), _peers(sends.calls, rank, p, m),
                               _waits(sends.calls, unwaited, rank)], divergence))


def _waits(calls: list[tuple[str, int]], unwaited: list[int], rank: int) -> Finding:
    if not unwaited:
        return Finding("waits", True)
    name, peer = calls[unwaited[0]]
    number = sum(1 for call in calls[:unwaited[0] + 1] if call[0] == name)
    if name == "irecv":
        return Finding("waits", False, f"stage {rank} never waited its irecv number {number} (from rank {peer}): "
                       "until wait() returns, the tensor may not hold what rank sent yet; call .wait() on the "
                       "request before reading the tensor")
    return Finding("waits", False, f"stage {rank} never waited its isend number {number} (to rank {peer}): a send "
                   "is done only when its request's wait() returns; wait every isend before returning")


def _gradients(stage: Any, divergence: Divergence | None, rank: int) -> Finding:
    """The verdict on the stage's gradients; ``divergence`` (the first beyond rounding) is put in front by the
    caller (:func:`grader.labs.divergence.named`)."""
    missing = [name for name, q in stage.named_parameters() if q.grad is None]
    if missing:
        return Finding("gradients", False, f"stage {rank}'s {missing[0]} has no gradient: no backward reached it")
    if divergence is None:
        return Finding("gradients", True)
    return Finding("gradients", False, f"stage {rank}'s gradients differ from the unsplit model's beyond rounding: "
                   "each backward must use its own micro-batch's x and out (keep them per micro-batch), "
                   "and read a received tensor only after its irecv's wait()")


def _peers(calls: list[tuple[str, int]], rank: int, p: int, m: int) -> Finding:
    expected: Counter = Counter()
    if rank > 0:  # activations from rank - 1, gradients back to it
        expected[("irecv", rank - 1)] += m
        expected[("isend", rank - 1)] += m
    if rank < p - 1:
        expected[("isend", rank + 1)] += m
        expected[("irecv", rank + 1)] += m
    got = Counter(calls)
    if got == expected:
        return Finding("peers", True)
    wrong = sorted(set(got) | set(expected), key=lambda key: (got[key] == expected[key], key))[0]
    name, peer = wrong
    verb = "sent to" if name == "isend" else "received from"
    return Finding("peers", False, f"stage {rank} of {p} {verb} rank {peer} with {name} {got[wrong]} time(s) over "
                   f"{m} micro-batches, expected {expected[wrong]}: a stage receives activations from rank - 1 and "
                   "sends them to rank + 1; gradients go the other way (isend/irecv, one per micro-batch)")


def _run(world_size: int, micro_batches: int, seed: int | str) -> dict:
    return {"world_size": world_size, "micro_batches": micro_batches, "seed": seed,
            "label": "{world_size} stages, {micro_batches} micro-batches", "timeout_s": 30.0}


LAB = Lab(
    name="pipeline_runner",
    title="the pipeline runner: 1F1B executed with isend/irecv",
    notebook="08_tensor_pipeline",
    student_file="labs/pipeline_runner.py",
    entry="run_stage",
    checks=CHECKS,
    rank_check=check_on_rank,
    runs=(_run(4, 6, 0),),
    variant={"world_size": (4, 3), "micro_batches": (6, 5, 7, 8)},  # each student's own (grader.labs.variant)
    uneven={"world_size": 3, "micro_batches": 5, "assumes": "4 stages"},  # the self-check also runs this
    hidden_runs=(_run(4, 3, "jitter"), _run(3, 5, "jitter")),
    shortcuts=("course.model_parallel.pipeline:run",),
    # the message order simulated before any rank starts (a deadlock named at once)
    precheck=functools.partial(precheck, model_config=_model_config),
    hang_hint=("A pipeline hangs when a stage waits for what its neighbour never sends: receive activations from "
               "rank - 1 and send them to rank + 1; gradients go the other way, once per micro-batch."),
)

__all__ = ["LAB", "Messages", "check_on_rank"]
