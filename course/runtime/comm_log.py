"""Watch what a student's code asks of ``torch.distributed``: every collective and point-to-point call, with its bytes.

``with CommLog() as log:`` records a :class:`Call` for each collective and message (name, bytes sent, peer, start
and end time). On an observed process group (:mod:`course.runtime.observed`: every rank that
:func:`course.runtime.launch.launch` starts) the group itself tells the log, so every route counts: ``from
torch.distributed import isend`` imported before the log opened, ``batch_isend_irecv`` (as its messages),
``all_gather_into_tensor`` or ``all_gather_single``, the functional collectives. A call is named as the code called
it (``isend``, ``all_gather_single``), or by its operation (``all_reduce``, ``send``) when it reached the group
another way. Calls through ``log.original(name)`` (a checker's reference) are not recorded. On a group of torch's
own (nccl on GPUs) the log listens to the functions of ``torch.distributed`` through
:mod:`course.runtime.intercept` instead: load the student's file inside the ``with`` there, so that names it
imports are the wrappers too.
``log.original("all_reduce")`` is torch's own function, for the checker's reference. Used by the labs
(:mod:`grader.labs.ring` and others) to fail a forbidden collective, count the bytes and messages each rank sent,
and time when calls started.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

from course.runtime import collective_names, intercept, observed
from course.runtime.collective_names import FUNCTIONS
from course.runtime.observed_record import Record

#: Collectives: every rank of the group takes part (every name of the one table, old and new).
COLLECTIVES = collective_names.functions(kind="collective")
#: Point-to-point: one sender, one receiver. ``send``/``isend`` carry the bytes a rank sends.
POINT_TO_POINT = (*collective_names.functions(kind="p2p"), "batch_isend_irecv")
SENDS = ("send", "isend")


@dataclass(frozen=True)
class Call:
    """One call into ``torch.distributed`` made while the log was open."""

    name: str  # e.g. "isend", "all_reduce"
    nbytes: int  # bytes this rank sent (send/isend), or the tensor's bytes for a collective; 0 if unknown
    peer: int | None  # dst of a send, src of a recv
    start: float  # time.perf_counter() when called
    end: float  # when it returned (for isend/irecv: when the request was made, not completed)


def _nbytes(args: tuple, kwargs: dict) -> int:
    tensor = args[0] if args else kwargs.get("tensor")
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


def _peer(name: str, args: tuple, kwargs: dict) -> int | None:
    peer = args[1] if len(args) > 1 else kwargs.get("dst" if name in SENDS else "src")
    return peer if isinstance(peer, int) else None


class CommLog:
    """Record every ``torch.distributed`` collective and point-to-point call while open (see the module doc)."""

    def __init__(self, names: tuple[str, ...] = COLLECTIVES + POINT_TO_POINT) -> None:
        self.names = tuple(name for name in names if hasattr(c10d, name))
        self.calls: list[Call] = []
        self._paused = threading.local()  # .active: inside a call of original()

    def original(self, name: str) -> Callable[..., Any]:
        """torch's own function ``name``, whose calls this log does not record (the checker's reference)."""
        function = intercept.original(name)

        def unrecorded(*args: Any, **kwargs: Any) -> Any:
            self._paused.active = True
            try:
                return function(*args, **kwargs)
            finally:
                self._paused.active = False
        return unrecorded

    def __enter__(self) -> CommLog:
        self._observing = observed.is_observed()
        if self._observing:
            observed.add_listener(self._observe)
        else:
            intercept.INTERCEPTOR.add(self._listen, self.names)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._observing:
            observed.remove_listener(self._observe)
        else:
            intercept.INTERCEPTOR.remove(self._listen)

    def _observe(self, record: Record) -> intercept.After | None:
        """The listener on the observed group: one :class:`Call` per call the group made, the grader's own left out."""
        name = record.api if record.api in FUNCTIONS else record.op
        if name not in self.names or getattr(self._paused, "active", False):
            return None

        def returned(work: Any) -> Any:
            sent = record.nbytes if record.op != "recv" else 0
            self.calls.append(Call(name, sent, record.peer, record.start, time.perf_counter()))
            return work
        return returned

    def _listen(self, call: intercept.Call) -> intercept.After | None:
        if call.nested:  # torch's own inner call (send calls isend): the outer one counts
            return None
        start = time.perf_counter()

        def returned(result: Any) -> Any:
            self.calls += self._calls(call.name, call.args, call.kwargs, start, time.perf_counter())
            return result

        return returned

    @staticmethod
    def _calls(name: str, args: tuple, kwargs: dict, start: float, end: float) -> list[Call]:
        """The calls to record: one, or one per message of a ``batch_isend_irecv``."""
        if name == "batch_isend_irecv":
            ops = args[0] if args else kwargs.get("p2p_op_list", [])
            return [Call(op.op.__name__, _nbytes((op.tensor,), {}) if op.op.__name__ in SENDS else 0, op.peer,
                         start, end) for op in ops]
        sent = _nbytes(args, kwargs) if name in SENDS or name in COLLECTIVES else 0
        return [Call(name, sent, _peer(name, args, kwargs), start, end)]

    def mark(self) -> int:
        """A position in :attr:`calls`: ``log.since(mark)`` is what was called after it."""
        return len(self.calls)

    def since(self, mark: int) -> list[Call]:
        return self.calls[mark:]


def collectives(calls: list[Call]) -> list[str]:
    """Names of the collectives among ``calls``, each once, in the order first called."""
    return list(dict.fromkeys(call.name for call in calls if call.name in COLLECTIVES))


def bytes_sent(calls: list[Call]) -> int:
    """Bytes sent by point-to-point among ``calls``."""
    return sum(call.nbytes for call in calls if call.name in SENDS)


def sends(calls: list[Call]) -> int:
    """Messages sent by point-to-point among ``calls`` (each send or isend, including those of a batch)."""
    return sum(call.name in SENDS for call in calls)
