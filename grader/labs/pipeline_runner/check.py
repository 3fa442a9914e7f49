"""Lab (notebook 08): the student writes the pipeline runner's steps, and 1F1B runs on their sends and receives.

On every rank :func:`check_on_rank` cuts the run's seeded transformer into one stage per rank
(:func:`course.model_parallel.pipeline.split`), gives the student's ``run_stage`` this rank's stage, its 1F1B order
(:func:`course.model_parallel.schedules.one_f_one_b`), the micro-batches and the loss, and compares the stage's
gradients with the unsplit model's on the same batch. Meanwhile every ``isend`` is held back a little
(:class:`LateSends`: one thread per rank issues them in order, ``DELAY_S`` late), so that a tensor read before its
``irecv`` completed is wrong on every run, not only on a slow machine; every ``isend``/``irecv`` peer is recorded.
A file using the course's own runner is refused (the lab's ``shortcuts``). A stage that waits for what its
neighbour never sends hangs: the run's limit is short, and the report says which ranks waited where.

Checks: the gradients equal the unsplit model's; every activation goes to rank + 1 and every gradient to rank - 1,
with ``isend``/``irecv``, one of each per micro-batch and neighbour.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from typing import Any

import torch.distributed as dist

from course import world
from course.model_parallel import pipeline, schedules, transformer
from grader.labs.core import Check, Finding, Lab, RankFindings, StudentError, load_entry

CHECKS = (
    Check("gradients", "each stage's gradients equal the unsplit model's after one 1F1B step", 5),
    Check("peers", "activations go to rank + 1 and gradients to rank - 1, with isend/irecv, once per micro-batch", 3),
    Check("waits", "every isend and irecv request is waited (an irecv before its tensor is read)", 2),
)
TOLERANCE = 1e-5
DELAY_S = 0.05  # how late each isend is issued: far longer than reading a received tensor takes


class _Request:
    """What the student's ``irecv`` returns: the real request, and whether the student waited it."""

    def __init__(self, request: Any = None) -> None:
        self.request, self.waited = request, False

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        self.waited = True
        return self.request.wait(*args, **kwargs)

    def is_completed(self) -> bool:
        return self.request.is_completed()


class _LateRequest(_Request):
    """What the student's ``isend`` returns: ``wait()`` waits until the send was issued, then for the send."""

    def __init__(self) -> None:
        super().__init__()
        self.issued = threading.Event()

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        self.issued.wait()
        return super().wait(*args, **kwargs)

    def is_completed(self) -> bool:
        return self.issued.is_set() and self.request.is_completed()


class LateSends:
    """While active, ``dist.isend`` is issued ``DELAY_S`` late, in order, by one thread; ``calls`` records
    ``(name, peer)`` of every ``isend`` and ``irecv``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.requests: list[_Request] = []  # in the order of calls
        self._queue: queue.Queue = queue.Queue()
        self._isend, self._irecv = dist.isend, dist.irecv

    def __enter__(self) -> LateSends:
        self._thread = threading.Thread(target=self._issue, daemon=True)
        self._thread.start()
        dist.isend, dist.irecv = self._late_isend, self._recorded_irecv
        return self

    def __exit__(self, *exc: object) -> None:
        dist.isend, dist.irecv = self._isend, self._irecv
        self._queue.put(None)
        self._thread.join()

    def _late_isend(self, tensor: Any, dst: int | None = None, *args: Any, **kwargs: Any) -> _LateRequest:
        self.calls.append(("isend", dst if dst is not None else kwargs.get("dst", -1)))
        late = _LateRequest()
        self.requests.append(late)
        self._queue.put((time.monotonic() + DELAY_S, late, tensor, dst, args, kwargs))
        return late

    def _recorded_irecv(self, tensor: Any, src: int | None = None, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(("irecv", src if src is not None else kwargs.get("src", -1)))
        self.requests.append(_Request(self._irecv(tensor, src, *args, **kwargs)))
        return self.requests[-1]

    def unwaited(self) -> list[int]:
        """Indices (into ``calls``) of the requests the student never waited; each is waited here, so none hangs."""
        missed = [index for index, request in enumerate(self.requests) if not request.waited]
        for index in missed:
            self.requests[index].wait()
        return missed

    def _issue(self) -> None:
        while (item := self._queue.get()) is not None:
            at, late, tensor, dst, args, kwargs = item
            time.sleep(max(0.0, at - time.monotonic()))
            late.request = self._isend(tensor, dst, *args, **kwargs)
            late.issued.set()


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
    with LateSends() as sends:
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
    transformer.loss(full(inputs.to(me.device)), targets.to(me.device)).backward()
    reference = dict(full.named_parameters())
    return RankFindings([_gradients(stage, reference, rank), _peers(sends.calls, rank, p, m),
                       _waits(sends.calls, unwaited, rank)])


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


def _gradients(stage: Any, reference: dict, rank: int) -> Finding:
    missing = [name for name, q in stage.named_parameters() if q.grad is None]
    if missing:
        return Finding("gradients", False, f"stage {rank}'s {missing[0]} has no gradient: no backward reached it")
    name, worst = max(((name, float((q.grad.cpu() - reference[name].grad.cpu()).abs().nan_to_num(float("inf")).max()))
                       for name, q in stage.named_parameters()), key=lambda pair: pair[1])
    if worst <= TOLERANCE:
        return Finding("gradients", True)
    return Finding("gradients", False, f"stage {rank}'s {name}.grad differs from the unsplit model's by up to "
                   f"{worst:.3g}: each backward must use its own micro-batch's x and out (keep them per micro-batch), "
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
    hidden_runs=(_run(4, 3, "jitter"), _run(3, 5, "jitter")),
    shortcuts=("course.model_parallel.pipeline:run",),
    hang_hint=("A pipeline hangs when a stage waits for what its neighbour never sends: receive activations from "
               "rank - 1 and send them to rank + 1; gradients go the other way, once per micro-batch."),
)

__all__ = ["LAB", "LateSends", "check_on_rank"]
