"""What a student's code asked of ``torch.distributed``, recorded inside the rank by trusted code.

:class:`Recorder` keeps the observation layer's :class:`~course.runtime.observed_record.Record` of every collective
and message the rank's process group issued (:mod:`course.runtime.observed`): however the code reached it (``from
torch.distributed import all_reduce``, the list form of ``all_gather``, a functional collective, a DeviceMesh's
group). Each record says when the call was issued, when it returned, whether it was asynchronous and when the code
first waited for it (its work handle's ``wait()`` or its future's, timed by :mod:`course.runtime.observed_work`),
its tensor bytes and the bytes a bandwidth-optimal (ring) algorithm sends from each rank for it. It also notes every
construction of a forbidden class (torch's ``DistributedDataParallel`` in the DDP lab). The labs' checks
(``grader.labs.ddp``, ``grader.labs.fsdp``, ``grader.labs.zero``) read the records; the checker's own collectives go
through :data:`ORIGINAL`, which no recorder hears.

On a process group of torch's own (nccl on GPUs, not observed) the recorder listens to the functions of
``torch.distributed`` by name instead (:mod:`course.runtime.intercept`): load the student's file inside the ``with``
there, so that names it imports are the listened ones.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from course.runtime import intercept, observed
from course.runtime.collective_names import FUNCTIONS, sent_bytes
from course.runtime.observed_record import Record, flatten
from course.runtime.observed_work import HeldWork

#: The functions of torch.distributed as they were before any Recorder was installed; their calls reach no recorder.
ORIGINAL: dict[str, Callable[..., Any]] = {
    name: observed.unheard(intercept.original(name)) for name in FUNCTIONS if hasattr(dist, name)}

#: Every work handle the student's calls returned, kept for the life of the rank: a collective started during
#: backward holds autograd's Python context, and if gloo's worker thread dropped the last reference to it while
#: the main thread, holding the GIL, destroys the group, both would wait for ever (see course.ddp.hooks).
_KEPT: list[Any] = []


def _mark_waited(record: Record) -> None:
    if record.waited is None:
        record.waited = time.perf_counter()


@dataclass
class Recorder:
    """The records of one rank's calls; install it with :func:`recording`."""

    world_size: int
    calls: list[Record] = field(default_factory=list)
    constructed: list[str] = field(default_factory=list)  # forbidden classes the student built

    def clear(self) -> None:
        self.calls.clear()

    def named(self, *ops: str) -> list[Record]:
        """The records of the operations ``ops`` (``"all_reduce"``, ``"all_gather"``), however they were called."""
        return [call for call in self.calls if call.op in ops]

    def sent_bytes(self) -> float:
        return sum(call.sent_bytes for call in self.calls)

    def observe(self, record: Record) -> observed.After:
        """The listener on an observed group: keep ``record``; its work handle comes back with a timed ``wait()``."""
        self.calls.append(record)

        def returned(work: Any) -> Any:
            if work is None:
                return None
            _KEPT.append(work)
            held = HeldWork(work, on_wait=lambda: _mark_waited(record))
            _KEPT.append(held)
            return held
        return returned

    def listen(self, call: intercept.Call) -> intercept.After | None:
        """The listener on a group of torch's own: a record of the outermost call (a deprecated alias calling its
        new name counts once); an async call's work handle comes back with a timed ``wait()``."""
        if call.nested or call.name not in FUNCTIONS:
            return None
        record = _record_of(call, self.world_size)
        self.calls.append(record)

        def returned(result: Any) -> Any:
            record.end = time.perf_counter()
            record.async_op = isinstance(result, dist.Work)
            if not record.async_op:
                record.waited = record.end
                return result
            _KEPT.append(result)
            return HeldWork(result, on_wait=lambda: _mark_waited(record))
        return returned


def _record_of(call: intercept.Call, world_size: int) -> Record:
    """The record of a call heard by name (no group to say more: no shapes, peer or line)."""
    what = FUNCTIONS[call.name]
    tensors = flatten(call.args[what.input]) if what.input is not None and len(call.args) > what.input else []
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return Record(op=what.op, kind=what.kind, api=call.name, method="", group="", group_size=world_size, peer=None,
                  tag=None, nbytes=nbytes, sent_bytes=sent_bytes(what.op, nbytes, world_size), shapes=(), dtype="",
                  where="", caller=call.caller, by_torch=False, thread=threading.get_ident(), start=time.perf_counter())


@contextmanager
def recording(world_size: int, forbidden: tuple[type, ...] = ()) -> Iterator[Recorder]:
    """Record every collective and message, and every construction of a ``forbidden`` class, meanwhile.

    On an observed group (every rank of :func:`course.runtime.launch.launch`) every route is heard wherever the
    student's file was loaded; on torch's own (nccl), load it inside the ``with`` block. Everything is put back on
    exit.
    """
    recorder = Recorder(world_size)
    saved: list[tuple[Any, str, Any]] = []
    for cls in forbidden:
        saved.append((cls, "__init__", cls.__init__))
        cls.__init__ = _noting(cls.__init__, cls.__name__, recorder)
    try:
        if observed.is_observed():
            with observed.listening(recorder.observe):
                yield recorder
        else:
            with intercept.listening(recorder.listen, FUNCTIONS):
                yield recorder
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def _noting(init: Callable[..., None], class_name: str, recorder: Recorder) -> Callable[..., None]:
    @functools.wraps(init)
    def noted(self: Any, *args: Any, **kwargs: Any) -> None:
        recorder.constructed.append(class_name)
        init(self, *args, **kwargs)
    return noted
