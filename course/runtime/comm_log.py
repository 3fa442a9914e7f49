"""Watch what a student's code asks of ``torch.distributed``: every collective and point-to-point call, with its bytes.

``with CommLog() as log:`` listens to the functions of ``torch.distributed`` through
:mod:`course.runtime.intercept` (whose wrappers ``from torch.distributed import send`` finds) and records a
:class:`Call` for each (name, bytes sent, peer, start and end time); on exit the originals come back. Only the
outermost call is recorded (torch's ``send`` calls ``isend``), and a ``batch_isend_irecv`` as its messages. Load the
student's file inside the ``with`` so that names it imports are the wrappers too. ``log.original("all_reduce")``
is torch's own function, for the checker's reference. Used by the labs (:mod:`grader.labs.ring` and others) to
fail a forbidden collective, count the bytes and messages each rank sent, and time when calls started.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

from course.runtime import intercept

#: Collectives: every rank of the group takes part.
COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "_all_gather_base", "all_gather_object", "gather", "gather_object", "scatter",
    "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all",
    "all_to_all_single", "all_gather_single", "reduce_scatter_single", "barrier", "monitored_barrier",
    "broadcast_object_list",
)
#: Point-to-point: one sender, one receiver. ``send``/``isend`` carry the bytes a rank sends.
POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")
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

    def original(self, name: str) -> Callable[..., Any]:
        """torch's own function ``name`` (not recorded), e.g. for the checker's reference ``all_reduce``."""
        return intercept.original(name)

    def __enter__(self) -> CommLog:
        intercept.INTERCEPTOR.add(self._listen, self.names)
        return self

    def __exit__(self, *exc: object) -> None:
        intercept.INTERCEPTOR.remove(self._listen)

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
