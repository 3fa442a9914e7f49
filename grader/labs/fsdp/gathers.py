"""What the FSDP lab watches of the student's all-gathers (:mod:`grader.labs.fsdp.check`, notebook 07).

:class:`GatherWatch` holds every tensor a gather wrote into, weakly, so the bytes of gathered parameters still
alive are measured at each gather; it notes when each gather was launched and when its data was first waited
for. :class:`MatmulClock` notes when each matrix multiply ran. Gathers into one tensor and the list form of
``dist.all_gather`` are watched alike.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from course.runtime import intercept
from grader.labs.late_results import Late

GATHERS = ("all_gather_into_tensor", "all_gather_single", "_all_gather_base", "all_gather")


@dataclass
class Gather:
    """One all-gather the student issued: when, and when its data was first waited for (inf: never)."""

    launched: float
    waited: float
    async_op: bool


class _Landing(Late):
    """An asynchronous gather's work handle: its result lands in the student's tensor (or list of tensors) when
    it is first waited for, by ``wait()`` or by taking its future (waiting on that comes next), and that moment
    is noted in ``gather``."""

    def __init__(self, work: Any, private: Any, target: Any, gather: Gather) -> None:
        super().__init__(work, private, target)
        self._gather = gather

    def _land(self) -> None:
        if not self._landed:
            _copy_into(self._target, self._private)
            self._landed = True

    def _waiting(self) -> None:
        self._gather.waited = min(self._gather.waited, time.perf_counter())

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._waiting()
        return super().wait(*args, **kwargs)

    def get_future(self) -> Any:
        self._waiting()
        return super().get_future()


def _copy_into(target: Any, private: Any) -> None:
    for mine, theirs in zip(_as_list(target), _as_list(private), strict=True):
        mine.copy_(theirs)


def _as_list(output: Any) -> list[torch.Tensor]:
    """A gather's output: one tensor, or the list of tensors of ``dist.all_gather``'s list form."""
    return list(output) if isinstance(output, (list, tuple)) else [output]


class GatherWatch:
    """Every tensor an all-gather wrote into, weakly held: the bytes still alive at each gather, and their peak;
    and each gather's :class:`Gather` times.

    Gathers into a tensor or into a list of tensors (``dist.all_gather``), the output as first positional
    argument, are watched. An asynchronous one (``async_op=True``, a prefetch) is noted in ``prefetched``; its
    result lands at its first wait."""

    def __init__(self) -> None:
        self.outputs: list[weakref.ref] = []
        self.gathers: list[Gather] = []
        self.peak = 0
        self.prefetched = False  # some gather was asynchronous: two layers may be alive at once
        self._inside = threading.local()  # a deprecated name calling its new one: watch the outer call only

    def alive(self) -> int:
        storages = {}
        for ref in self.outputs:
            tensor = ref()
            if tensor is not None:
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()  # resize_(0) frees it in place
        return sum(storages.values())

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def watched(*args: Any, **kwargs: Any) -> Any:
            output = args[0] if args else None
            tensors = _as_list(output) if isinstance(output, (torch.Tensor, list, tuple)) else []
            if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors) \
                    or getattr(self._inside, "on", False):
                return original(*args, **kwargs)
            self.outputs += [weakref.ref(t) for t in tensors]
            self.peak = max(self.peak, self.alive())
            self.prefetched |= bool(kwargs.get("async_op"))
            gather = Gather(time.perf_counter(), float("inf"), bool(kwargs.get("async_op")))
            self.gathers.append(gather)
            # gather into the checker's own buffers, then copy: gloo may hold its output a while after returning,
            # and what it holds must not count as the student's
            private = [torch.empty_like(t) for t in tensors]
            self._inside.on = True
            try:
                result = original(private if isinstance(output, (list, tuple)) else private[0], *args[1:], **kwargs)
            finally:
                self._inside.on = False
            if kwargs.get("async_op"):
                return _Landing(result, private, tensors, gather)  # copied in at the first wait, not before
            _copy_into(tensors, private)
            gather.waited = time.perf_counter()
            return result
        return watched


class MatmulClock(TorchDispatchMode):
    """When each matrix multiply ran on this rank (``time.perf_counter()``), the student's layers among them."""

    KERNELS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv"})

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.overloadpacket.__name__ in self.KERNELS:
            self.times.append(time.perf_counter())
        return func(*args, **(kwargs or {}))


@contextmanager
def watching_gathers() -> Iterator[GatherWatch]:
    """While open, every all-gather's output tensor is watched (:class:`GatherWatch`)."""
    watch = GatherWatch()
    with intercept.replacing(GATHERS, lambda _name, current: watch.wrap(current)):
        yield watch
