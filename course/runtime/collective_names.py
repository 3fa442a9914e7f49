"""One tensor in, one tensor out: the all-gather and reduce-scatter under the name the installed torch gives them.

torch 2.13 calls them ``dist.all_gather_single`` and ``dist.reduce_scatter_single``; older torch (the 2.11 of some
GPU images) calls them ``all_gather_into_tensor`` and ``reduce_scatter_tensor``, names 2.13 deprecates with a
``FutureWarning``. The course's code calls :func:`all_gather_single` and :func:`reduce_scatter_single` here, which
pick the new name where torch has it. The name is looked up at each call, so whatever wraps ``torch.distributed``
(the communication log, the grader's recorders) sees the call.

It is also the course's one table of communication names (:data:`FUNCTIONS`, :data:`METHODS`): every
``torch.distributed`` function and ``ProcessGroup`` method, old names and new, mapped to the operation it does
(:class:`Name`), whether it is a collective or a message, and how its bytes count (:data:`SENT`). The observation
layer (:mod:`course.runtime.observed`), the labs' logs and the grader read it, so they agree on every name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

#: new name -> the name older torch gives the same collective
OLDER = {"all_gather_single": "all_gather_into_tensor", "reduce_scatter_single": "reduce_scatter_tensor"}


def named(new: str) -> str:
    """``new`` if the installed ``torch.distributed`` has it, else its older name (:data:`OLDER`)."""
    if new not in OLDER:
        raise ValueError(f"expected one of {sorted(OLDER)}, got {new!r}")
    return new if hasattr(dist, new) else OLDER[new]


def all_gather_single(output: torch.Tensor, input: torch.Tensor, **kwargs: Any) -> Any:  # noqa: A002 - torch's name
    """Every rank's ``input``, concatenated in rank order along dim 0 into ``output`` (``group``, ``async_op``: as
    torch's)."""
    return getattr(dist, named("all_gather_single"))(output, input, **kwargs)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, **kwargs: Any) -> Any:  # noqa: A002
    """``input`` summed over the ranks (or ``op``), split along dim 0; this rank's piece lands in ``output``."""
    return getattr(dist, named("reduce_scatter_single"))(output, input, **kwargs)


# --------------------------------------------------------------------------------------------- the one table
@dataclass(frozen=True)
class Name:
    """What one torch name does, for everything that records or judges communication.

    Attributes:
        op: the canonical operation: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``reduce``,
            ``gather``, ``scatter``, ``all_to_all``, ``barrier``, ``send`` or ``recv``.
        kind: ``"collective"`` (every rank of the group takes part) or ``"p2p"`` (one sender, one receiver).
        input: which positional argument holds this rank's input tensors (their bytes are the call's ``nbytes``);
            ``None`` where there are none (a barrier, the ``*_object`` functions).
    """

    op: str
    kind: str
    input: int | None = None

    @property
    def combines(self) -> bool:
        """The result on a rank depends on the other ranks' values (a broadcast, a barrier or a message does not)."""
        return self.op in COMBINING


#: Operations whose result mixes every rank's values.
COMBINING = ("all_reduce", "reduce", "all_gather", "gather", "reduce_scatter", "all_to_all")


def _names(op: str, kind: str, names: str, input: int | None = None) -> dict[str, Name]:  # noqa: A002
    return {name: Name(op, kind, input) for name in names.split()}


#: ``torch.distributed`` functions (old and new names) -> what they do, with their input argument.
FUNCTIONS: dict[str, Name] = {
    **_names("all_reduce", "collective", "all_reduce all_reduce_coalesced", 0),
    **_names("all_gather", "collective", "all_gather all_gather_into_tensor all_gather_single _all_gather_base "
                                         "all_gather_coalesced", 1),
    **_names("all_gather", "collective", "all_gather_object"),
    **_names("reduce_scatter", "collective", "reduce_scatter reduce_scatter_tensor reduce_scatter_single "
                                             "_reduce_scatter_base", 1),
    **_names("broadcast", "collective", "broadcast", 0),
    **_names("broadcast", "collective", "broadcast_object_list"),
    **_names("reduce", "collective", "reduce", 0),
    **_names("gather", "collective", "gather", 0),
    **_names("gather", "collective", "gather_object"),
    **_names("scatter", "collective", "scatter", 1),
    **_names("scatter", "collective", "scatter_object_list"),
    **_names("all_to_all", "collective", "all_to_all all_to_all_single", 1),
    **_names("barrier", "collective", "barrier monitored_barrier"),
    **_names("send", "p2p", "send isend", 0),
    **_names("send", "p2p", "send_object_list"),
    **_names("recv", "p2p", "recv irecv", 0),
    **_names("recv", "p2p", "recv_object_list"),
}
#: ``ProcessGroup`` methods (what every function above, DeviceMesh, the functional collectives, DDP and the
#: course's own :class:`course.collectives.protocol.Comm` end in) -> what they do, with their input argument.
METHODS: dict[str, Name] = {
    **_names("all_reduce", "collective", "allreduce allreduce_coalesced", 0),
    **_names("all_gather", "collective", "allgather allgather_coalesced allgather_into_tensor_coalesced "
                                         "all_gather_single_coalesced _allgather_base all_gather_single", 1),
    **_names("reduce_scatter", "collective", "reduce_scatter reduce_scatter_single _reduce_scatter_base "
                                             "reduce_scatter_single_coalesced reduce_scatter_tensor_coalesced", 1),
    **_names("broadcast", "collective", "broadcast", 0),
    **_names("reduce", "collective", "reduce", 0),
    **_names("gather", "collective", "gather", 1),
    **_names("scatter", "collective", "scatter", 1),
    **_names("all_to_all", "collective", "alltoall alltoall_base all_to_all_single", 1),
    **_names("barrier", "collective", "barrier monitored_barrier"),
    **_names("send", "p2p", "send", 0),
    **_names("recv", "p2p", "recv recv_anysource", 0),
}
#: Which bytes one rank sends for an operation in a bandwidth-optimal (ring) algorithm: ``(input bytes, world size)
#: -> bytes``. An all-gather's input is this rank's piece; a reduce-scatter's is the whole tensor.
SENT: dict[str, Callable[[int, int], float]] = {
    "all_reduce": lambda b, n: 2 * (n - 1) / n * b,
    "all_gather": lambda b, n: float((n - 1) * b),
    "reduce_scatter": lambda b, n: (n - 1) / n * b,
    "all_to_all": lambda b, n: (n - 1) / n * b,
    "broadcast": lambda b, n: float(b), "reduce": lambda b, n: float(b), "gather": lambda b, n: float(b),
    "scatter": lambda b, n: float(b), "send": lambda b, n: float(b),
    "recv": lambda b, n: 0.0, "barrier": lambda b, n: 0.0,
}


def of(name: str) -> Name:
    """What the ``torch.distributed`` function or ``ProcessGroup`` method ``name`` does.

    Raises:
        KeyError: a name the table does not know, saying which names it does.
    """
    found = FUNCTIONS.get(name) or METHODS.get(name)
    if found is None:
        raise KeyError(f"expected a torch.distributed collective or point-to-point name, got {name!r}; "
                       f"known: {sorted(FUNCTIONS)}")
    return found


def functions(*ops: str, kind: str | None = None) -> tuple[str, ...]:
    """The ``torch.distributed`` function names doing any of ``ops`` (all if none given), or of ``kind``:
    ``functions("all_gather")`` is every all-gather's name, old and new."""
    return tuple(name for name, what in FUNCTIONS.items()
                 if (not ops or what.op in ops) and (kind is None or what.kind == kind))


def sent_bytes(op: str, nbytes: int, world_size: int) -> float:
    """Bytes one rank sends for ``op`` on ``nbytes`` of input, as a ring algorithm sends them (:data:`SENT`)."""
    return SENT[op](nbytes, max(1, world_size))
