"""Counting collectives: which ``torch.distributed`` calls a piece of code makes, and how many bytes each moves.

Inside ``with count_collectives() as log:`` every ``dist.all_reduce``, ``dist.all_gather_single``,
``dist.reduce_scatter_single``, ``dist.send`` and ``dist.isend`` still runs, and is also recorded as a
:class:`Call` (its name, the bytes of its tensor on this rank, and which group it ran on). Code that looks up the
function on the module at call time (``dist.all_reduce(...)``, as the course always writes it) is seen.
The tensor-parallel lesson counts its allreduces per layer with it, the labs check a student's code with it.
Taught in ``notebooks/08_tensor_pipeline.ipynb``.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch.distributed as dist

COUNTED = ("all_reduce", "all_gather_single", "reduce_scatter_single", "send", "isend")


@dataclass(frozen=True)
class Call:
    """One collective or point-to-point call on this rank: ``nbytes`` of its (output) tensor, ``group_size``
    ranks taking part (2 for a send)."""

    name: str
    nbytes: int
    group_size: int


class Log(list):
    """The :class:`Call` s recorded, in order, with summaries."""

    def counts(self) -> Counter:
        """``{name: number of calls}``."""
        return Counter(call.name for call in self)

    def nbytes(self, name: str | None = None) -> int:
        """Total bytes of the calls named ``name`` (all calls if None)."""
        return sum(call.nbytes for call in self if name is None or call.name == name)


def _recorder(log: Log, name: str, original):  # noqa: ANN001, ANN202 - wraps any of COUNTED
    @functools.wraps(original)
    def recorded(tensor, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        group = kwargs.get("group")
        size = 2 if name in ("send", "isend") else dist.get_world_size(group)
        log.append(Call(name, tensor.numel() * tensor.element_size(), size))
        return original(tensor, *args, **kwargs)

    return recorded


@contextlib.contextmanager
def count_collectives() -> Iterator[Log]:
    """Record every call of :data:`COUNTED` made while inside; yields the :class:`Log` (filled as calls happen)."""
    log = Log()
    originals = {name: getattr(dist, name) for name in COUNTED}
    try:
        for name, original in originals.items():
            setattr(dist, name, _recorder(log, name, original))
        yield log
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
